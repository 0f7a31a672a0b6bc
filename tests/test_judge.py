"""The ``judge`` role: rewards that score the winners after the decode and are never seen by it."""

from __future__ import annotations

import json

import pytest

import rodeco
from rodeco import hookimpl
from rodeco.common.state import judge_entries
from rodeco.common.validation import ConfigError
from rodeco.plugins import get_plugin_manager

PROMPTS = ["write a haiku about autumn leaves", "give three tips"]
BASE = ["reward=logprob", "sampling.max_new_tokens=12", "output.all_candidates=true", "budget.kv_tokens=300"]


class Flaky:
    """A judge that raises while ``broken`` is set, else scores the response's word count."""

    broken = True

    def score(self, requests):
        if Flaky.broken:
            raise RuntimeError("the judge's server is down")
        return [float(len(r.response.split())) for r in requests]


class FlakyPlugin:
    @hookimpl
    def rodeco_register_rewards(self, register):
        register("flaky", lambda params, ctx: Flaky(), "a judge that fails on demand")


def decode(gen, overrides=(), **kw):
    return rodeco.decode(PROMPTS, generator=gen, n=4, policy="fixed", overrides=[*BASE, *overrides], **kw)


def fingerprint(out):
    return [
        (
            r.best.candidate_id,
            r.best.score,
            [(c.candidate_id, tuple(c.token_ids), c.stop_reason, c.score) for c in r.candidates],
        )
        for r in out.results
    ]


def test_judges_change_nothing_the_decode_does_and_score_every_finished_candidate(tiny_gen, tmp_path):
    gen = tiny_gen()
    plain = decode(gen)
    judged = decode(gen, ["judge=[custom,minilm_prefix]", "judge.custom.function=length"], out_dir=tmp_path)
    assert fingerprint(judged) == fingerprint(plain)
    pc, jc = plain.compute.to_dict(), judged.compute.to_dict()
    for k in ("total_flops", "gen_decode_tokens", "gen_prefill_tokens", "reward_tokens", "reward_calls"):
        assert jc[k] == pc[k], k
    for r in judged.results:
        scores = {j.name: j.score for j in r.judge}
        assert scores["custom"] == len(r.best.text)  # the length value function at scale 1
        assert isinstance(scores["minilm_prefix"], float)
        for c in r.candidates:
            assert (c.judge is not None) == c.finished
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert isinstance(recs[0]["judge"], list) and {e["name"] for e in recs[0]["judge"]} == {"custom", "minilm_prefix"}
    assert all("judge" not in r["best"] for r in recs)
    summary = json.loads((tmp_path / "summary.json").read_text())
    means = {k: v["mean"] for k, v in summary["judge"].items()}
    assert means["custom"] == pytest.approx(sum(len(r.best.text) for r in judged.results) / 2)
    assert summary["judge"]["minilm_prefix"]["cost"]["flops"] > 0  # its own line ...
    assert summary["compute"]["total_flops"] == pc["total_flops"]  # ... not the method's


def test_one_judge_is_one_entry_and_the_alpaca_eval_export_carries_it(tiny_gen, tmp_path):
    out = decode(tiny_gen(), ["judge=custom", "output.alpaca_eval=tiny"], out_dir=tmp_path)
    rec = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[0])
    assert rec["judge"] == {"name": "custom", "score": float(len(out.results[0].best.text))}
    exported = json.loads((tmp_path / "model_outputs.json").read_text())
    assert exported[0]["judge"] == rec["judge"]


def test_a_judge_that_is_the_guiding_reward_is_refused(tiny_gen):
    with pytest.raises(ConfigError, match=r"judge\.custom.*the reward that guides the decode.*judge="):
        decode(tiny_gen(), ["reward=custom", "judge=custom"])
    out = decode(tiny_gen(), ["reward=custom", "judge=custom", "+judge.custom.scale=2.0"])  # another config: allowed
    assert out.results[0].judge[0].score == len(out.results[0].best.text) / 2


def test_a_failing_judge_loses_nothing_and_a_resumed_run_scores_what_it_lacks(tiny_gen, tmp_path):
    pm = get_plugin_manager(extra=[FlakyPlugin()])
    ov = ["+judge.flaky={name: flaky}"]
    Flaky.broken = True
    first = decode(tiny_gen(), ov, out_dir=tmp_path, plugins=pm)
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["best"]["text"] == x.best.text for r, x in zip(recs, first.results))
    entry = recs[0]["judge"]
    assert entry["score"] is None and "server is down" in entry["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["judge"]["flaky"]["failed"] == 2
    Flaky.broken = False
    decode(tiny_gen(), ov, out_dir=tmp_path, plugins=pm)  # every prompt done: only the judge runs
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    for r, x in zip(recs, first.results):
        assert r["judge"] == {"name": "flaky", "score": float(len(x.best.text.split()))}
        assert r["best"]["token_ids"] == x.best.token_ids
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["judge"]["flaky"]["failed"] == 0 and summary["judge"]["flaky"]["n"] == 2


def test_resume_refuses_a_changed_judge_by_name(tiny_gen, tmp_path):
    decode(tiny_gen(), ["judge=custom"], out_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"judge\.custom.*judged by another 'custom'"):
        decode(tiny_gen(), ["judge=custom", "+judge.custom.scale=2.0"], out_dir=tmp_path)


def test_task_judge_scores_an_old_run_from_its_text(tiny_gen, tmp_path):
    out = decode(tiny_gen(), out_dir=tmp_path)
    before = json.loads((tmp_path / "summary.json").read_text())
    assert "judge" not in before and all(
        "judge" not in json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()
    )
    cfg = rodeco.load_config(["task=judge", "judge=custom", f"output.dir={tmp_path}", "output.progress=false"])
    res = rodeco.run(cfg)
    assert res.extra["judged"] == 2
    recs = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    for r, x in zip(recs, out.results):
        assert r["judge"]["score"] == float(len(x.best.text))
        finished = [c for c in r["candidates"] if c["finished"]]
        assert all(judge_entries(c["judge"])["custom"]["score"] == len(c["text"]) for c in finished)
    after = json.loads((tmp_path / "summary.json").read_text())
    assert after["compute"] == before["compute"]  # judging charges nothing to the method
    assert after["judge"]["custom"]["n"] == 2
    assert rodeco.run(cfg).extra["judged"] == 0  # nothing left to score


def test_the_python_api_and_the_hooks_see_judge_scores(tiny_gen):
    seen = []

    class Watch:
        @hookimpl
        def rodeco_prompt_done(self, result):
            seen.append([j.name for j in result.judge])

    pm = get_plugin_manager(extra=[Watch()])
    out = decode(tiny_gen(), ["judge=custom"], plugins=pm)
    assert seen == [["custom"], ["custom"]]
    assert out.extra["judge"]["custom"]["n"] == 2


def test_a_judge_that_needs_the_decodes_logprobs_is_refused(tiny_gen):
    with pytest.raises(ConfigError, match=r"judge\.lp.*log-probs"):
        decode(tiny_gen(), ["+judge.lp={name: logprob, form: sum}"])


def shard(root, name, overrides, scores, cost, config=None, report=None):
    """A fake shard of ``judge=custom``: its config, results with the winners' scores, and a summary with the
    judge's cost."""
    from omegaconf import OmegaConf

    cfg = rodeco.load_config([f"{k}={v}" for k, v in overrides.items()])
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra/config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (d / "results.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "prompt_index": i,
                    "prompt": f"p{i}",
                    "best": {"text": f"r{i}"},
                    "judge": {"name": "custom", "score": s},
                }
            )
            + "\n"
            for i, s in scores.items()
        )
    )
    spec = config or {"name": "custom", "function": "length"}
    (d / "summary.json").write_text(
        json.dumps(
            {
                "compute": {"gen_flops": 10.0},
                "judge": {
                    "custom": {
                        "mean": 0.0,
                        "n": len(scores),
                        "failed": 0,
                        "config": spec,
                        "identity": None,
                        "cost": cost,
                        **({"report": report} if report else {}),
                    }
                },
            }
        )
    )


def test_merge_recomputes_the_judges_means_and_sums_their_cost_apart(tmp_path):
    common = {"data.prompts": "[a,b,c,d]", "data.path": "null", "data.num_shards": 2, "judge": "custom"}
    shard(
        tmp_path / "sweep",
        "0",
        {**common, "data.shard": 0},
        {0: 1.0, 2: 3.0},
        {"flops": 5.0, "calls": 2},
        report={"win_rate": 0.25},
    )
    shard(
        tmp_path / "sweep",
        "1",
        {**common, "data.shard": 1},
        {1: 5.0, 3: 7.0},
        {"flops": 6.0, "calls": 2},
        report={"win_rate": 0.75},
    )
    cfg = rodeco.load_config(["task=merge", f"merge.dir={tmp_path / 'sweep'}"])
    rodeco.run(cfg)
    summary = json.loads((tmp_path / "sweep/summary.json").read_text())
    j = summary["judge"]["custom"]
    assert j["mean"] == 4.0 and j["n"] == 4 and j["cost"] == {"flops": 11.0, "calls": 4}
    assert j["report_by_shard"] == {"0": {"win_rate": 0.25}, "1": {"win_rate": 0.75}}  # not averaged: kept apart
    assert summary["compute"]["total_flops"] == 20.0  # the method's compute, without the judge's


def test_merge_refuses_shards_judged_differently(tmp_path):
    common = {"data.prompts": "[a,b]", "data.path": "null", "data.num_shards": 2}
    shard(tmp_path / "a", "0", {**common, "data.shard": 0, "judge": "custom"}, {0: 1.0}, {})
    shard(tmp_path / "a", "1", {**common, "data.shard": 1}, {1: 1.0}, {})
    with pytest.raises(ConfigError, match="judge"):
        rodeco.run(rodeco.load_config(["task=merge", f"merge.dir={tmp_path / 'a'}"]))
    shard(tmp_path / "b", "0", {**common, "data.shard": 0, "judge": "custom"}, {0: 1.0}, {})
    shard(
        tmp_path / "b",
        "1",
        {**common, "data.shard": 1, "judge": "custom"},
        {1: 1.0},
        {},
        config={"name": "custom", "function": "length", "scale": 2.0},
    )
    with pytest.raises(ConfigError, match="different 'custom' judges"):
        rodeco.run(rodeco.load_config(["task=merge", f"merge.dir={tmp_path / 'b'}"]))
