"""The judges that need no service: ``chrf`` and ``ref_sim`` (AlpacaEval reference answers), ``arith_gold`` (the
``gold`` judge with its answer solved from the seeded arithmetic problems of scripts/arith_bench.py). Hand-computed
chrF values, the prompt -> reference mapping, the errors, and ``ref_sim``'s vectors against a manual forward (a tiny
Llama) and under the embedded SmolLM2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import REPO, SHARED_DATA, make_tiny_llama

import rodeco
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError
from rodeco.plugins import BuildContext
from rodeco_rewards.gold import Gold, answer_of, build_gold, is_correct
from rodeco_rewards.reference import (
    ChrfReward,
    HiddenStateEncoder,
    References,
    RefSimReward,
    build_chrf,
    chrf,
    cosine,
    normalize_text,
)

OUTPUTS = [
    {"dataset": "t", "instruction": "Name a primary colour.", "output": "Red is a primary colour.", "generator": "g"},
    {"dataset": "t", "instruction": "Translate to French:\n\nGood morning", "output": "Bonjour.", "generator": "g"},
]
PROMPTS = [
    {"idx": 0, "prompt": "Name a primary colour.", "instruction": "Name a primary colour.", "input": ""},
    {
        "idx": 1,
        "prompt": "Translate to French:\n\nGood morning",
        "instruction": "Translate to French:",
        "input": "Good morning",
    },
]


@pytest.fixture
def ref_files(tmp_path):
    refs, prompts = tmp_path / "outputs.json", tmp_path / "prompts.jsonl"
    refs.write_text(json.dumps(OUTPUTS), encoding="utf-8")
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    return str(refs), str(prompts)


def req(prompt: str, response: str) -> ScoreRequest:
    return ScoreRequest(prompt, response, (), partial=False)


# --- chrF ---------------------------------------------------------------------------------------------------------


def test_chrf_hand_computed():
    # "ab" vs "abc": n=1 P=2/2 R=2/3; n=2 P=1/1 R=1/2; n>=3: "ab" has none, left out.
    # P=1, R=7/12, F2 = 5PR/(4P+R) = (35/12)/(55/12) = 7/11
    assert chrf("ab", "abc") == pytest.approx(700 / 11)
    # "abc" vs "abd": n=1 2/3 both ways; n=2 1/2; n=3 0 -> P=R=7/18, and F = P when P = R
    assert chrf("abc", "abd") == pytest.approx(700 / 18)
    # clipping: "aaa" vs "a": n=1 one match of 3 hypothesis unigrams (P=1/3), R=1; n=2: the reference has none
    assert chrf("aaa", "a") == pytest.approx(100 * 5 * (1 / 3) / (4 / 3 + 1))
    # recall weighs more than precision: the short hypothesis (high P, low R) scores below the long one
    assert chrf("ab", "abcd") < chrf("abcdxyzw", "abcd")


def test_chrf_properties():
    text = "The quick brown fox jumps over the lazy dog."
    assert chrf(text, text) == 100.0
    assert chrf("The quick  brown\nfox", "Thequickbrownfox") == 100.0  # whitespace is removed
    assert chrf("abcdef", "uvwxyz") == 0.0
    assert chrf("", "abc") == 0.0 and chrf("abc", "") == 0.0 and chrf(" ", "") == 100.0
    ref = "abcdefghijkl"
    scores = [chrf(ref[:k] + "0123456789#%"[k:], ref) for k in range(13)]  # the first k characters agree
    assert all(a < b for a, b in zip(scores, scores[1:])), scores
    assert scores[0] == 0.0 and scores[-1] == 100.0


# --- references ---------------------------------------------------------------------------------------------------


def test_prompts_map_to_their_reference(ref_files):
    refs = References.load(*ref_files, node="judge.chrf")
    assert refs.answer("Name a primary colour.") == "Red is a primary colour."
    assert refs.answer("  Translate to French:\n\n  Good   morning \n") == "Bonjour."  # whitespace collapsed
    only_instructions = References.load(ref_files[0], None, node="judge.chrf")
    assert only_instructions.answer("Translate to French: Good morning") == "Bonjour."


def test_prompt_file_matches_by_position(tmp_path, ref_files):
    # the prompt file's text differs from the references' instruction: found through its position
    prompts = tmp_path / "other.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "Colour, primary, one please"})
        + "\n"
        + json.dumps({"prompt": "Say good morning in French"})
        + "\n",
        encoding="utf-8",
    )
    refs = References.load(ref_files[0], str(prompts), node="judge.chrf")
    assert refs.answer("Say good morning in French") == "Bonjour."
    assert refs.answer("Name a primary colour.") == "Red is a primary colour."  # the instruction still matches


def test_a_prompt_without_reference_is_an_error_naming_it(ref_files):
    refs = References.load(*ref_files, node="judge.chrf")
    long_prompt = "Write a poem about the sea " * 10
    with pytest.raises(ConfigError) as e:
        refs.index(long_prompt)
    msg = str(e.value)
    assert e.value.key == "judge.chrf" and "Write a poem about the sea" in msg and "..." in msg
    assert len(e.value.value) < 70 and "only on AlpacaEval prompts" in msg


@pytest.mark.parametrize("which, key", [("references", "judge.chrf.references"), ("prompts", "judge.chrf.prompts")])
def test_missing_files_name_the_key(ref_files, which, key):
    params = {"references": ref_files[0], "prompts": ref_files[1], which: "/no/such/file.json"}
    with pytest.raises(ConfigError) as e:
        build_chrf(params, BuildContext())
    assert e.value.key == key and "/no/such/file.json" in str(e.value) and f"set {key}=" in e.value.fix


def test_bad_files_and_params(tmp_path, ref_files):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"prompt": "only one"}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="1 prompts for 2 references") as e:
        References.load(ref_files[0], str(short), node="judge.chrf")
    assert e.value.key == "judge.chrf.prompts"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a list"}), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        References.load(str(bad), None, node="judge.chrf")
    assert e.value.key == "judge.chrf.references"
    with pytest.raises(ConfigError) as e:
        build_chrf({"reference": ref_files[0]}, BuildContext())
    assert e.value.key == "judge.chrf.reference"


def test_chrf_reward_through_the_registry(ref_files):
    plugins = rodeco.get_plugin_manager()
    r = plugins.build_reward({"name": "chrf", "references": ref_files[0], "prompts": ref_files[1]}, BuildContext())
    assert isinstance(r, ChrfReward)
    reqs = [
        req("Name a primary colour.", "Blue is a primary colour."),
        req("Translate to French:\n\nGood morning", "Bonjour!"),
        req("Name a primary colour.", "Red is a primary colour."),
    ]
    got = r.score(reqs)
    assert got == pytest.approx(
        [chrf("Blue is a primary colour.", "Red is a primary colour."), chrf("Bonjour!", "Bonjour."), 100.0]
    )
    assert [r.score([q])[0] for q in reqs] == got  # independent of the batch
    assert r.cost.calls == 4 and r.cost.flops == 0
    assert "references=" in r.identity


@pytest.mark.skipif(not (SHARED_DATA / "prompts" / "alpaca_eval_805.jsonl").is_file(), reason="no shared data")
def test_the_805_prompts_map_to_their_position(monkeypatch):
    monkeypatch.chdir(REPO)  # the defaults are relative to the repository
    r = build_chrf({}, BuildContext())
    with open(SHARED_DATA / "prompts" / "alpaca_eval_805.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 805 == len(r.refs.outputs)
    assert all(r.refs.index(rec["prompt"]) == i for i, rec in enumerate(records))
    with_input = next(rec for rec in records if rec["input"])
    assert r.refs.index(with_input["instruction"] + "\n\n" + with_input["input"]) == with_input["idx"]
    assert r.score([req(records[3]["prompt"], r.refs.outputs[3])]) == [100.0]


# --- ref_sim ------------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_refs():
    outputs = ["the quick brown fox jumps over the lazy dog", "write a haiku about autumn leaves"]
    return References(outputs, {normalize_text(p): i for i, p in enumerate(["p0", "p1"])}, "judge.ref_sim", "x")


def test_ref_sim_is_the_cosine_of_mean_final_hidden_states(tiny_tokenizer, tiny_refs):
    model = make_tiny_llama(len(tiny_tokenizer), seed=3)
    r = RefSimReward(tiny_refs, HiddenStateEncoder(model, tiny_tokenizer, max_tokens=64, batch_tokens=40))

    def manual(text: str) -> np.ndarray:
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return out.hidden_states[-1][0].double().mean(0).numpy()

    texts = ["the lazy dog", "explain why the sky is blue", "", "the quick brown fox jumps over the lazy dog"]
    got = r.score([req("p0", t) for t in texts])
    ref = manual(tiny_refs.outputs[0])
    assert got[0] == pytest.approx(cosine(manual(texts[0]), ref), abs=1e-5)
    assert got[1] == pytest.approx(cosine(manual(texts[1]), ref), abs=1e-5)
    assert got[2] == 0.0  # an empty response has no hidden state
    assert got[3] == pytest.approx(1.0, abs=1e-6)
    assert [r.score([req("p0", t)])[0] for t in texts] == pytest.approx(got, abs=1e-5)  # independent of the batch


def test_ref_sim_cost_caches_references_and_truncates(tiny_tokenizer, tiny_refs):
    model = make_tiny_llama(len(tiny_tokenizer), seed=4)
    enc = HiddenStateEncoder(model, tiny_tokenizer, max_tokens=3)
    r = RefSimReward(tiny_refs, enc)
    n_ref = len(enc.ids(tiny_refs.outputs[1]))
    assert n_ref == 3  # truncated to max_tokens
    r.score([req("p1", "write a haiku")])
    first = r.cost.tokens
    assert first == n_ref + len(enc.ids("write a haiku"))
    r.score([req("p1", "write a haiku")])  # the reference is not encoded again
    assert r.cost.tokens - first == len(enc.ids("write a haiku")) and r.cost.calls == 2
    emb = model.get_input_embeddings().weight.numel()
    assert r.cost.flops == pytest.approx(2.0 * (sum(p.numel() for p in model.model.parameters()) - emb) * r.cost.tokens)
    # texts whose first max_tokens tokens agree are the same text to it
    a, b = "write a haiku about autumn leaves", "write a haiku about the sky"
    assert enc.ids(a) == enc.ids(b) and tiny_tokenizer(a)["input_ids"] != tiny_tokenizer(b)["input_ids"]
    assert r.score([req("p1", a), req("p1", b)]) == pytest.approx([1.0, 1.0], abs=1e-6)
    with pytest.raises(ConfigError, match="no AlpacaEval reference"):
        r.score([req("another prompt", "x")])


@pytest.mark.integration
def test_ref_sim_under_the_embedded_smollm2(tmp_path):
    refs = tmp_path / "outputs.json"
    refs.write_text(
        json.dumps([{"instruction": "What is the capital of France?", "output": "The capital of France is Paris."}]),
        encoding="utf-8",
    )
    plugins = rodeco.get_plugin_manager()
    r = plugins.build_reward(
        {"name": "ref_sim", "references": str(refs), "prompts": None, "device": "cpu", "max_tokens": 32}, BuildContext()
    )
    assert isinstance(r, RefSimReward) and "smollm2" in r.identity
    assert r.encoder.base.config.hidden_size == 576  # SmolLM2-135M, not MiniLM (384)
    p = "What is the capital of France?"
    same, para, other = r.score(
        [
            req(p, "The capital of France is Paris."),
            req(p, "Paris is the capital city of France."),
            req(p, "def f(x): return x ** 2"),
        ]
    )
    assert same == pytest.approx(1.0, abs=1e-5)
    assert other < para < same
    assert r.cost.tokens > 0 and r.cost.flops == pytest.approx(2.0 * r.encoder.n_matmul_params * r.cost.tokens)
    assert 1.0e8 < r.encoder.n_matmul_params < 1.35e8  # 135M with the 28M embedding left out


# --- arith_gold ---------------------------------------------------------------------------------------------------

Q = "What is 23 + 7? Answer with the number."


@pytest.mark.parametrize(
    "prompt, answer",
    [
        (Q, 30),
        ("What is 23 - 27? Answer with the number.", -4),
        ("What is 8 * 6? Answer with the number.", 48),
        ("what is 5+-3?", 2),
    ],
)
def test_answer_of(prompt, answer):
    assert answer_of(prompt) == answer


@pytest.mark.parametrize(
    "response, ok",
    [
        ("30", True),
        ("The answer is 30.", True),
        ("23 + 7 = 30", True),
        ("30.0", True),
        ("It is 30, not 31.", False),
        ("31", False),
        ("thirty", False),
        ("", False),
        ("30 apples, 2 baskets", False),
    ],
)
def test_is_correct_reads_the_last_number(response, ok):
    assert is_correct(Q, response) is ok


def test_thousands_separators():
    assert is_correct("What is 50 * 20?", "It is 1,000.")


@pytest.mark.parametrize("prompt", ["Write a haiku about autumn.", "What is 2 + 3 and 4 * 5?"])
def test_a_prompt_that_is_not_one_problem_is_an_error(prompt):
    with pytest.raises(ConfigError) as e:
        Gold(answer_from="arith").score([req(prompt, "5")])
    assert e.value.key == "judge.arith_gold" and prompt[:20] in str(e.value) and "arith_bench" in e.value.fix


def test_arith_gold_scores_as_is_correct():
    g = Gold(extractor="last_number", answer_from="arith")
    responses = ["30", "The answer is 30.", "It is 30, not 31.", "thirty", "30.0", ""]
    assert g.score([req(Q, r) for r in responses]) == [float(is_correct(Q, r)) for r in responses]
    assert g.score([req("What is 50 * 20?", "It is 1,000.")]) == [1.0]
    assert g.cost.calls == 2 and g.cost.flops == 0


def test_arith_gold_through_the_registry():
    node = {"name": "gold", "answer_from": "arith", "extractor": "last_number"}  # the arith_gold option
    r = rodeco.get_plugin_manager().build_reward(node, BuildContext())
    assert isinstance(r, Gold) and r.score([req(Q, "30"), req(Q, "29")]) == [1.0, 0.0]
    assert dict(rodeco.load_config(["judge=arith_gold"]).judge.arith_gold) == node
    with pytest.raises(ConfigError) as e:
        build_gold({"answer_from": "arith", "tolerance": 1}, BuildContext())
    assert e.value.key == "judge.gold.tolerance"


@pytest.fixture
def arith_bench():
    from rodeco.experiments.bench import arith_bench

    return arith_bench


def test_arith_bench_gives_200_distinct_problems_that_arith_gold_solves(arith_bench):
    probs = arith_bench.problems(200, 0)
    assert len({q for q, _ in probs}) == 200
    for q, ans in probs:
        assert answer_of(q) == ans and is_correct(q, f"{q[: -len(' Answer with the number.')]} It is {ans}.")
    # the draws with repeats kept (how the 40-problem table was made) hold repeats; dropping them keeps the order
    drawn = arith_bench.problems(40, 0, distinct=False)
    assert len(set(drawn)) < 40
    assert probs[: len(set(drawn))] == list(dict.fromkeys(drawn))
    with pytest.raises(ValueError, match="distinct problems"):
        arith_bench.problems(arith_bench.N_DISTINCT + 1, 0)


@pytest.mark.parametrize("method", ["bon_4", "sr_16", "beam_16", "dvts_16", "pf_16"])
def test_arith_bench_runs_each_method_kind_within_best_of_4s_memory(arith_bench, tiny_gen, method):
    from rodeco.common.budget import full_length_tokens

    gen = tiny_gen("fast")
    prompt = "What is 23 + 7? Answer with the number."
    rec = arith_bench.run_method(gen, method, prompt, 48, "logprob")
    assert rec["flops"] > 0 and rec["candidates"] and any(c["finished"] for c in rec["candidates"])
    if not method.startswith("bon"):
        assert rec["peak_kv_tokens"] <= full_length_tokens(4, [len(gen.encode(prompt))], 48, gen.kv)
    assert set(arith_bench.winner_answers(rec)) == {"reward", "majority", "weighted"}


def test_arith_bench_compares_each_method_with_best_of_n_at_its_flops(arith_bench):
    def run(answers: list[int | None], flops: float) -> dict:
        return {
            "candidates": [{"text": f"It is {a}.", "score": 1.0, "finished": True} for a in answers],
            "flops": flops,
        }

    # two problems (answer 5): Best-of-1 right on neither, Best-of-4 on the first; sr_16 right on both at
    # 2**1 times Best-of-1's FLOPs, halfway in log FLOPs between Best-of-1 (1e12) and Best-of-4 (4e12)
    recs = [
        {"answer": 5, "bon_1": run([4], 1e12), "bon_4": run([5], 4e12), "sr_16": run([5], 2e12)},
        {"answer": 5, "bon_1": run([3], 1e12), "bon_4": run([3], 4e12), "sr_16": run([5], 2e12)},
    ]
    rows = {r["method"]: r for r in arith_bench.summarize(recs, ["bon_1", "bon_4", "sr_16"])}
    assert "vs_bon_at_flops" not in rows["bon_4"]
    v = rows["sr_16"]["vs_bon_at_flops"]
    assert v["value"] == pytest.approx(1.0 - (0.5 * 1 + 0.5 * 0) / 2) and not v["beyond_curve"]
    recs[0]["sr_16"]["flops"] = recs[1]["sr_16"]["flops"] = 8e12  # past Best-of-4: compared with it, flagged
    v = arith_bench.summarize(recs, ["bon_1", "bon_4", "sr_16"])[-1]["vs_bon_at_flops"]
    assert v["value"] == pytest.approx(1.0 - 0.5) and v["beyond_curve"]
