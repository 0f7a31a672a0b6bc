"""Prompts that carry a record beyond their text, and the ``gold`` judge that checks answers against it: generated
task sources (``data.source=reasoning_gym``: exact sizes, seeds, a held-out set kept out), JSONL fields as
``Prompt.meta``, the ``first_line`` extractor, ``gold`` (and its ``arith_gold`` option) against right, wrong and
partly right answers, the check that stops a run whose prompts lack a gold answer before it decodes, and the gold
answers written to results.jsonl."""

from __future__ import annotations

import json
import sys

import pytest
from omegaconf import OmegaConf, open_dict

import rodeco
from rodeco import hookimpl
from rodeco.common.protocols import TaskSource
from rodeco.common.state import PromptRef, ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.common.winner import first_line
from rodeco.core.data import load_prompts
from rodeco.plugins import BuildContext, default_plugins, get_plugin_manager
from rodeco.runner import run_decode
from rodeco.tasks import generated, prompts_of
from rodeco_rewards.gold import Gold, build_gold

pytest.importorskip("reasoning_gym")


def data(**kw):
    """A ``data`` node of a generated task: ``kw`` over reasoning-gym's chain_sum, 5 problems from seed 8."""
    return OmegaConf.create({"source": "reasoning_gym", "task": "chain_sum", "size": 5, "seed": 8, **kw})


def texts(prompts) -> list[str]:
    return [p.text for p in prompts]


# --- the reasoning_gym source -------------------------------------------------------------------------------------


def test_the_builtin_source_is_registered_and_meets_the_protocol():
    plugins = default_plugins()
    assert "reasoning_gym" in plugins.sources
    assert isinstance(plugins.source("reasoning_gym"), TaskSource)
    with pytest.raises(ConfigError) as e:
        plugins.source("no_such_source")
    assert e.value.key == "data.source" and "reasoning_gym" in e.value.problem


def test_a_generated_set_is_size_problems_the_same_for_the_same_seed():
    import reasoning_gym

    got = prompts_of(data())
    assert len(got) == 5 and [p.index for p in got] == list(range(5))
    assert texts(prompts_of(data())) == texts(got)  # the same seed, the same problems
    assert texts(prompts_of(data(seed=9))) != texts(got)
    assert len(prompts_of(data(size=12))) == 12
    ds = reasoning_gym.create_dataset("chain_sum", seed=8, size=5)
    for i, p in enumerate(got):
        assert p.text == ds[i]["question"]  # the default template is the question itself
        assert p.meta["gold_answer"] == str(ds[i]["answer"]) and isinstance(p.meta["gold_answer"], str)
        where = (p.meta["source"], p.meta["task"], p.meta["seed"], p.meta["index"])
        assert where == ("reasoning_gym", "chain_sum", 8, i)
        assert p.meta["metadata"]["expression"] == ds[i]["metadata"]["expression"]
        json.dumps(p.meta)  # plain JSON: what a pool and results.jsonl keep
        assert PromptRef(p.index, p.text, meta=p.meta).gold_answer == p.meta["gold_answer"]


def test_the_task_config_and_template_reach_the_problems():
    got = prompts_of(data(task_config={"min_terms": 2, "max_terms": 2}, template="Q: {question}\nA:"))
    for p in got:
        assert p.text.startswith("Q: ") and p.text.endswith("\nA:")
        assert p.meta["metadata"]["num_terms"] == 2 and p.meta["config"] == {"min_terms": 2, "max_terms": 2}
    with pytest.raises(ConfigError) as e:
        prompts_of(data(template="{prompt}"))
    assert e.value.key == "data.template"


def test_offset_limit_and_shards_cut_the_generated_set():
    every = prompts_of(data(size=6))
    assert texts(prompts_of(data(size=6, offset=2, limit=3))) == texts(every)[2:5]
    shards = [prompts_of(data(size=6, num_shards=2, shard=i)) for i in (0, 1)]
    assert sorted(p.index for s in shards for p in s) == list(range(6))


def test_a_held_out_set_is_kept_out_and_the_size_kept():
    """Item i of seed 8 is item i + 1 of seed 7: a set drawn from seed 8 repeats most of seed 7's first problems,
    which are dropped and replaced by further draws of seed 8; the held-out set itself is unchanged."""
    held = texts(prompts_of(data(seed=7, size=5)))
    plain = texts(prompts_of(data(seed=8, size=5)))
    assert plain[:4] == held[1:]  # the overlap this test is about
    kept = prompts_of(data(seed=8, size=5, holdout_seed=7, holdout_size=5))
    assert len(kept) == 5 and not set(texts(kept)) & set(held)
    assert [p.index for p in kept] == list(range(5))  # keyed by position in the set
    assert [p.meta["index"] for p in kept] == [4, 5, 6, 7, 8]  # seed 8's draws past the overlap, in order
    assert texts(kept)[0] == plain[4]
    assert texts(prompts_of(data(seed=7, size=5))) == held  # the held-out set is never changed
    # a held-out set that does not overlap changes nothing
    assert texts(prompts_of(data(seed=8, size=5, holdout_seed=100, holdout_size=5))) == plain


def test_a_held_out_set_needs_its_size():
    with pytest.raises(ConfigError) as e:
        prompts_of(data(holdout_seed=7))
    assert e.value.key == "data.holdout_size"


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"task": None}, "data.task"),
        ({"size": 0}, "data.size"),
        ({"size": "5"}, "data.size"),
        ({"size": True}, "data.size"),
        ({"task": "no_such_task"}, "data.task"),
        ({"task_config": {"no_such_setting": 3}}, "data.task_config"),
    ],
)
def test_bad_data_settings_name_their_key(kw, key):
    with pytest.raises(ConfigError) as e:
        prompts_of(data(**kw))
    assert e.value.key == key


def test_an_unknown_task_names_it_and_some_known_ones():
    from reasoning_gym.factory import DATASETS

    with pytest.raises(ConfigError) as e:
        prompts_of(data(task="no_such_task"))
    assert e.value.value == "no_such_task" and "not registered" in e.value.problem
    assert sum(name in e.value.fix for name in DATASETS) >= 5


def test_without_reasoning_gym_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    with pytest.raises(ConfigError) as e:
        prompts_of(data())
    assert e.value.key == "data.source" and "rodeco[tasks]" in e.value.fix and "not installed" in e.value.problem


class Counting:
    """A task source whose problems are "problem <seed + i>" (so seeds overlap as reasoning-gym's do), optionally
    short of ``size`` or without a gold answer."""

    def __init__(self, short: bool = False, no_gold: bool = False):
        self.short, self.no_gold = short, no_gold

    def generate(self, task, size, seed, config):
        n = size - 1 if self.short else size
        return [(f"problem {seed + i}", {} if self.no_gold else {"gold_answer": str(seed + i)}) for i in range(n)]

    def check(self, answer, record):
        return float(answer == record["gold_answer"])

    def extractor(self, task):
        return "last_number"


def source_plugins(**kw):
    class Register:
        @hookimpl
        def rodeco_register_sources(self, register):
            register("counting", lambda: Counting(**kw), "a test source")

    return get_plugin_manager(load_entrypoints=False, extra=[Register()])


def test_a_third_party_source_is_asked_by_name():
    plugins = source_plugins()
    node = OmegaConf.create({"source": "counting", "task": "t", "size": 3, "seed": 10})
    got = generated(node, plugins)
    assert [(p.text, p.meta["gold_answer"]) for p in got] == [(f"problem {10 + i}", str(10 + i)) for i in range(3)]
    held = generated(OmegaConf.create({**node, "holdout_seed": 9, "holdout_size": 3}), plugins)
    assert texts(held) == ["problem 12", "problem 13", "problem 14"]  # 10 and 11 are held out


@pytest.mark.parametrize("kw, problem", [({"short": True}, "gave 2 problems"), ({"no_gold": True}, "gold_answer")])
def test_a_source_that_breaks_its_contract_is_refused(kw, problem):
    node = OmegaConf.create({"source": "counting", "task": "t", "size": 3, "seed": 0})
    with pytest.raises(ConfigError, match=problem):
        generated(node, source_plugins(**kw))


def test_the_data_option_composes_and_generates():
    cfg = rodeco.load_config(["data=reasoning_gym", "data.size=4"])
    assert cfg.data.source == "reasoning_gym" and cfg.data.task == "chain_sum"
    got = prompts_of(cfg.data)
    assert len(got) == 4 and all(p.meta["gold_answer"] for p in got)


# --- records beside the prompt in a data file ---------------------------------------------------------------------


def test_jsonl_fields_beside_the_prompt_become_its_meta(tmp_path):
    f = tmp_path / "p.jsonl"
    recs = [{"prompt": "What is 2 + 3?", "gold_answer": 5, "id": "a"}, {"prompt": "Capital of France?"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    got = load_prompts(str(f))
    assert [p.text for p in got] == ["What is 2 + 3?", "Capital of France?"]
    assert got[0].meta == {"gold_answer": 5, "id": "a"} and got[1].meta == {}
    assert PromptRef(0, got[0].text, meta=got[0].meta).gold_answer == "5"  # a string, whatever the file holds
    assert PromptRef(1, got[1].text, meta=got[1].meta).gold_answer is None
    other = tmp_path / "q.jsonl"
    other.write_text(json.dumps({"question": "Q?", "prompt": "kept as a field", "gold_answer": "x"}) + "\n")
    (p,) = prompts_of(rodeco.load_config([f"data.path={other}", "data.prompts=null", "data.field=question"]).data)
    assert p.text == "Q?" and p.meta == {"prompt": "kept as a field", "gold_answer": "x"}
    assert all(q.meta == {} for q in prompts_of(rodeco.load_config().data))  # inline prompts carry no record


# --- the first_line extractor -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("Paris", "Paris"),
        ("\n\n  Paris\nbecause it is the capital", "Paris"),
        ("Answer: Paris", "Paris"),
        ("The final answer is: Paris.", "Paris."),
        ("answer = 42", "42"),
        ("The answer\nParis", "Paris"),  # a label alone on its line
        ("Answers vary by region", "Answers vary by region"),  # the label is a whole word
        ("Answer isotope", "isotope"),
        ("", None),
        ("  \n \n", None),
    ],
)
def test_first_line(text, answer):
    assert first_line(text) == answer
    assert rodeco.WinnerRule(rule="majority", extractor="first_line").extract(text) == answer


# --- the gold judge -----------------------------------------------------------------------------------------------


def req(response: str, meta=None, prompt: str = "p", index: int = 0) -> ScoreRequest:
    return ScoreRequest(prompt, response, (), partial=False, prompt_index=index, meta=meta or {})


def test_gold_against_a_plain_records_answer():
    g = Gold()
    num, word = {"gold_answer": "30"}, {"gold_answer": "Paris"}
    assert g.score([req("It is 30.", num), req("30, not 31", num), req("30.0", num), req("thirty", num)]) == [
        1.0,
        0.0,  # the last number is read
        1.0,  # numbers compared as numbers
        0.0,
    ]
    assert g.score([req("1,000", {"gold_answer": 1000}), req("$ 1000", {"gold_answer": "1,000"})]) == [1.0, 1.0]
    assert g.score([req("Paris\nIt is the capital.", word), req("Answer: Paris", word), req("Lyon", word)]) == [
        1.0,
        1.0,
        0.0,
    ]
    assert Gold(extractor="boxed").score([req(r"so \boxed{30} not 31", num), req("30", num)]) == [1.0, 0.0]
    assert g.cost.calls == 3 and g.cost.flops == 0
    assert g.needs_meta == ("gold_answer",) and Gold(answer_from="arith").needs_meta == ()


def test_gold_asks_the_records_source_and_counts_partial_credit_as_wrong():
    import reasoning_gym

    (chain,) = prompts_of(data(size=1))
    gold = chain.meta["gold_answer"]
    g = Gold()
    assert g.score([req(f"So it is {gold}.", chain.meta), req(f"{gold}\nthen {int(gold) + 1}", chain.meta)]) == [
        1.0,
        0.0,  # chain_sum declares last_number
    ]
    (cipher,) = prompts_of(data(task="caesar_cipher", size=1))
    answer = cipher.meta["gold_answer"]
    # reasoning-gym gives partial credit to an answer that holds the gold one: gold counts it as wrong
    entry = {"question": cipher.text, "answer": answer, "metadata": cipher.meta["metadata"]}
    partial = reasoning_gym.get_score_answer_fn("caesar_cipher")(answer + " XX", entry)
    assert 0.0 < partial < 1.0
    assert g.score([req(f"{answer}\nThat is the text.", cipher.meta), req(f"{answer} XX", cipher.meta)]) == [1.0, 0.0]
    assert g.score([req("", cipher.meta)]) == [0.0]  # no answer at all


def test_a_prompt_without_a_gold_answer_is_an_error_naming_it():
    with pytest.raises(ConfigError) as e:
        Gold().score([req("30", {"id": 3}, prompt="Write a haiku about autumn.", index=7)])
    assert e.value.key == "judge.gold" and "prompt 7 has no gold answer" in e.value.problem
    assert "Write a haiku" in str(e.value.value) and "gold_answer" in e.value.fix


def test_gold_and_arith_gold_through_the_registry():
    plugins = rodeco.get_plugin_manager()
    g = plugins.build_reward({"name": "gold"}, BuildContext(plugins=plugins))
    assert isinstance(g, Gold) and g.score([req("42", {"gold_answer": "42"})]) == [1.0]
    arith = plugins.build_reward({"name": "gold", "answer_from": "arith", "extractor": "last_number"}, BuildContext())
    q = "What is 23 + 7? Answer with the number."
    assert arith.score([req("30", prompt=q), req("29", prompt=q), req("It is 30.", {"gold_answer": "29"}, q)]) == [
        1.0,
        0.0,
        1.0,  # solved from the prompt: a record's answer is not read
    ]
    assert arith.identity != g.identity
    option = rodeco.load_config(["judge=arith_gold"]).judge.arith_gold
    assert (option.name, option.answer_from, option.extractor) == ("gold", "arith", "last_number")


@pytest.mark.parametrize(
    "params, key",
    [
        ({"tolerance": 1}, "judge.gold.tolerance"),
        ({"answer_from": "file"}, "judge.gold.answer_from"),
        ({"extractor": "no_such_extractor"}, "judge.gold.extractor"),
        ({"extractor": "regex"}, "judge.gold.pattern"),  # regex needs its pattern
        ({"extractor": "regex", "pattern": "answer is ("}, "judge.gold.pattern"),
    ],
)
def test_bad_gold_params_name_their_key(params, key):
    with pytest.raises(ConfigError) as e:
        build_gold(params, BuildContext())
    assert e.value.key == key
    assert "winner.pattern" not in e.value.fix


def test_gold_reads_the_answer_with_its_own_regex():
    g = build_gold({"extractor": "regex", "pattern": r"answer is (\S+?)\.?$"}, BuildContext())
    num = {"gold_answer": "30"}
    assert g.score([req("31? No: the answer is 30.", num), req("the answer is 31", num), req("30", num)]) == [
        1.0,
        0.0,
        0.0,  # no match: no answer
    ]
    assert g.identity != build_gold({"extractor": "regex", "pattern": "(\\d+)"}, BuildContext()).identity


# --- runs: records checked before decoding, gold answers in results -----------------------------------------------

RUN = [
    "reward=logprob",
    "policy=none",
    "budget=unlimited",
    "n=2",
    "sampling.max_new_tokens=6",
    "output.all_candidates=true",
    "output.progress=false",
]


def run_cfg(overrides=(), path=None, prompts=None):
    cfg = rodeco.load_config([*RUN, *overrides])
    with open_dict(cfg):
        if path is not None or prompts is not None:
            cfg.data.path, cfg.data.prompts = path, prompts
    return cfg


class NoDecode:
    """A generator wrapper whose sessions fail: a run that reaches the decode fails the test."""

    def __init__(self, gen):
        self.gen = gen

    def __getattr__(self, name):
        if name == "open_session":
            raise AssertionError("the run decoded before checking its prompts' records")
        return getattr(self.gen, name)


def test_a_gold_judge_over_prompts_without_gold_answers_stops_the_run_before_it_decodes(tiny_gen, tmp_path):
    f = tmp_path / "p.jsonl"
    recs = [{"prompt": "write a haiku", "gold_answer": "x"}, {"prompt": "give three tips"}, {"prompt": "why blue"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        run_decode(run_cfg(["judge=gold"], path=str(f)), default_plugins(), out, gen=NoDecode(tiny_gen()))
    assert e.value.key == "judge.gold" and e.value.value == "gold"
    assert "2 of 3 prompts have no gold answer" in e.value.problem and "prompt 1" in e.value.problem
    assert "give three tips" in e.value.problem and "gold_answer" in e.value.fix
    assert not (out / "results.jsonl").exists()
    with pytest.raises(ConfigError, match="have no gold answer"):  # inline prompts carry no record
        run_decode(run_cfg(["judge=gold"], prompts=["hi"]), default_plugins(), None, gen=NoDecode(tiny_gen()))
    # arith_gold reads its answer from the prompt: no record needed, nothing checked
    cfg = run_cfg(["judge=arith_gold"], prompts=["What is 2 + 3?"])
    (res,) = run_decode(cfg, default_plugins(), None, gen=tiny_gen()).results
    assert [j.name for j in res.judge] == ["arith_gold"]


def test_check_records_names_the_role():
    from rodeco.roles import RoleBuilder, choose_roles

    plugins = default_plugins()
    cfg = run_cfg(["judge=[gold,arith_gold]"])
    roles = RoleBuilder(plugins, "tiny", BuildContext(plugins=plugins)).roles(choose_roles(cfg, plugins))
    ok = [PromptRef(0, "a", meta={"gold_answer": "1"}), PromptRef(1, "b", meta={"gold_answer": 0})]
    roles.check_records(ok)  # a falsy gold answer is an answer
    with pytest.raises(ConfigError) as e:
        roles.check_records([*ok, PromptRef(5, "c", meta={"gold_answer": None})])
    assert e.value.key == "judge.gold" and "1 of 3 prompts" in e.value.problem and "prompt 5" in e.value.problem
    plain = RoleBuilder(plugins, "tiny", BuildContext(plugins=plugins)).roles(choose_roles(run_cfg(), plugins))
    plain.check_records([PromptRef(0, "a")])  # no judge, no reward that needs a record


def test_a_generated_task_run_writes_its_gold_answers_and_judges_them(tiny_gen, tmp_path):
    cfg = run_cfg(["data=reasoning_gym", "data.size=3", "data.task_config={min_terms: 2, max_terms: 2}", "judge=gold"])
    out = run_decode(cfg, default_plugins(), tmp_path, gen=tiny_gen())
    problems = prompts_of(cfg.data)
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(recs) == len(out.results) == 3
    for rec, res, p in zip(recs, out.results, problems):
        assert rec["gold_answer"] == res.gold_answer == p.meta["gold_answer"] and isinstance(rec["gold_answer"], str)
        assert rec["record"]["task"] == "chain_sum" and rec["record"]["source"] == "reasoning_gym"
        assert "gold_answer" not in rec["record"]  # written once, beside it
        expected = Gold().score([req(res.best.text, p.meta)])[0]
        assert rec["judge"] == {"name": "gold", "score": expected}


def test_results_of_prompts_without_a_gold_answer_carry_no_record(tiny_gen, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "write a haiku", "gold_answer": 7, "id": "a"})
        + "\n"
        + json.dumps({"prompt": "give three tips", "id": "b"})
        + "\n",
        encoding="utf-8",
    )
    run_decode(run_cfg(path=str(f)), default_plugins(), tmp_path / "out", gen=tiny_gen())
    first, second = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert first["gold_answer"] == "7" and first["record"] == {"id": "a"}
    assert "gold_answer" not in second and "record" not in second


def test_task_judge_scores_an_old_run_against_its_written_gold_answers(tiny_gen, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "write a haiku", "gold_answer": "autumn"}) + "\n", encoding="utf-8")
    out = run_decode(run_cfg(path=str(f)), default_plugins(), tmp_path / "run", gen=tiny_gen())
    cfg = rodeco.load_config(["task=judge", "judge=gold", f"output.dir={tmp_path / 'run'}", "output.progress=false"])
    assert rodeco.run(cfg).extra["judged"] == 1
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    best = out.results[0].best.text
    assert rec["judge"] == {"name": "gold", "score": Gold().score([req(best, {"gold_answer": "autumn"})])[0]}
