"""``scripts/serve_load.py`` and serve_bench's load figures: goodput within a latency target, p99 latency, queue
wait, requests that waited for a client thread, and runs at several rates collected without rerunning a finished
one. No server is started here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rodeco.experiments.bench import serve_bench_figures as figs
from rodeco.experiments.bench import serve_load as load
from rodeco.experiments.bootstrap import draws


def recs(latencies: list[float], queue: list[float | None]) -> list:
    out = []
    for i, (lat, q) in enumerate(zip(latencies, queue)):
        r = figs.Record(i, i, i, arrival=float(i))
        r.sent, r.ok = float(i) + (2.0 if i == 3 else 0.0), math.isfinite(lat)  # request 3 waited for a thread
        r.latency, r.end, r.reward = lat, i + lat, -float(i)
        r.server = {} if q is None else {"queue_seconds": q}
        out.append(r)
    return out


def test_goodput_counts_only_the_requests_answered_within_the_target():
    rs = recs([10.0, 50.0, 70.0, 30.0, math.nan], [1.0, 3.0, 5.0, 7.0, None])  # the last one failed
    idx = draws(len(rs), 200, 0)
    f = figs.figures(rs, idx, target_s=60.0)
    span = max(r.arrival + r.latency for r in rs if r.ok)  # 2 + 70 = 72: first arrival 0 to last answer
    assert f["completed"] == 4 and f["errors"] == 1
    assert f["requests_per_s"] == pytest.approx(4 / span)
    assert f["goodput_per_s"] == pytest.approx(3 / span)  # 70 s is over the target
    assert f["p99_latency_s"] == pytest.approx(np.quantile([10, 50, 70, 30], 0.99))
    assert f["p99_latency_s"] > f["p95_latency_s"] > f["p50_latency_s"]
    assert f["mean_queue_s"] == pytest.approx(4.0)
    assert f["client_capped"] == 1 and f["latency_target_s"] == 60.0
    lo, hi = f["goodput_per_s_ci"]
    assert lo <= f["goodput_per_s"] <= hi or lo == pytest.approx(f["goodput_per_s"])
    assert figs.figures(rs, idx)["goodput_per_s"] == pytest.approx(f["requests_per_s"])  # no target: all count


def test_a_server_that_reports_no_queue_has_no_queue_figure():
    f = figs.figures(recs([5.0, 6.0], [None, None]), draws(2, 50, 0), target_s=60.0)
    assert math.isnan(f["mean_queue_s"]) and all(math.isnan(x) for x in f["mean_queue_s_ci"])


def fake_run(rate: float, complete: bool = True) -> dict:
    summary = {
        "sent": 4,
        "completed": 4,
        "latency_target_s": 60.0,
        **{k: rate for k in ("requests_per_s", "goodput_per_s", "mean_reward")},
        **{k: 10.0 / rate for k in ("p50_latency_s", "p95_latency_s", "p99_latency_s", "mean_queue_s")},
    }
    summary |= {k + "_ci": [summary[k] * 0.9, summary[k] * 1.1] for k in list(summary) if k.endswith(("_s", "_per_s"))}
    summary["mean_reward_ci"] = [rate - 0.1, rate + 0.1]
    records = [{"i": i, "ok": True, "server": {"text": f"answer {i}"}} for i in range(4)]
    if rate == 2.0:  # request 2 timed out, request 3 got another answer
        records[2] = {"i": 2, "ok": False, "server": None}
        records[3]["server"]["text"] = "another answer"
    server = {
        "summary": summary,
        "server_side": {"decode_tokens_per_s": 100.0, "metrics_means": {}},
        "records": records,
    }
    doc = {
        "args": {"rate": rate},
        "servers": {"sr": server, "vllm": server},
        "ratios": {"sr_over_vllm_goodput": {"ratio": 1.0, "ci": [0.9, 1.1]}, "other": {"ratio": 2.0, "ci": [1, 3]}},
        "judged": {"figures": {"chrf": {"sr": {"mean": 17.0}, "sr_minus_vllm": {"mean": 0.5, "ci": [-1.0, 2.0]}}}},
    }
    if complete:
        doc["wall_seconds"] = 1.0
    return doc


def test_finished_rates_are_not_run_again_and_every_rate_is_tabled(tmp_path, monkeypatch):
    for rate in (0.5, 1.0):
        (tmp_path / f"rate_{rate:g}").mkdir()
        (tmp_path / f"rate_{rate:g}" / "serve_bench.json").write_text(json.dumps(fake_run(rate)))
    (tmp_path / "rate_2").mkdir()  # stopped before its end: run again
    (tmp_path / "rate_2" / "serve_bench.json").write_text(json.dumps(fake_run(2.0, complete=False)))
    ran = []

    def run(cmd, check):
        ran.append(cmd)
        (tmp_path / "rate_2" / "serve_bench.json").write_text(json.dumps(fake_run(2.0)))

    monkeypatch.setattr(load.subprocess, "run", run)
    table = load.main(["--rates", "0.5", "1", "2", "--out", str(tmp_path), "--", "--requests", "4"])
    assert len(ran) == 1 and ran[0][-6:] == ["--requests", "4", "--rate", "2", "--out", str(tmp_path / "rate_2")]
    assert list(table["rates"]) == ["0.5", "1", "2"]
    r = table["rates"]["1"]
    assert r["servers"]["sr"]["judges"] == {"chrf": 17.0} and r["servers"]["vllm"]["judges"] == {"chrf": None}
    assert list(r["ratios"]) == ["sr_over_vllm_goodput"]  # only the load ratios
    text = "\n".join(load.lines(table))
    assert "| 2 | sr | 4/4 | 2.000 [1.800, 2.200] |" in text
    assert "rate 0.5: judge_chrf_sr_minus_vllm +0.5000 [-1.0000, +2.0000]" in text
    assert json.loads((tmp_path / "serve_load.json").read_text())["rates"]["2"]["args"] == {"rate": 2.0}
    # a seeded request's answer at two rates: compared where it was answered at both
    assert table["same_answers"]["sr"] == {"0.5-1": [4, 4], "1-2": [2, 3]}
    assert "sr: the same winner at two rates (requests answered at both): 4/4 at 0.5-1, 2/3 at 1-2" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rates", "0", "--out", "x"], "--rates 0.0: each rate must be"),
        (["--rates", "1", "--out", "x", "--", "--rate", "2"], "--rate: serve_load sets serve_bench's --rate"),
        (["--rates", "1", "--out", "x", "--", "--best-of", "0"], "--best-of must be at least 1"),
    ],
)
def test_bad_rates_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        load.parse(argv)
    assert message in capsys.readouterr().err


def test_a_ratio_over_zero_goodput_is_inf_or_nan_not_an_error():
    idx = draws(4, 20, 0)
    none = figs.figures(recs([90.0, 95.0, 99.0, 120.0], [None] * 4), idx, 60.0)
    some = figs.figures(recs([30.0, 95.0, 40.0, 120.0], [None] * 4), idx, 60.0)
    assert none["goodput_per_s"] == 0
    assert math.isnan(figs.ratio(none, none, "goodput_per_s")["ratio"])
    assert math.isinf(figs.ratio(some, none, "goodput_per_s")["ratio"])


def test_a_stopped_run_keeps_its_recorded_phases_and_runs_only_the_rest(tmp_path, monkeypatch):
    from rodeco.experiments.bench import serve_bench as sb

    monkeypatch.setattr(sb, "model_dir", lambda generator: tmp_path / "model")
    argv = ["--out", str(tmp_path), "--requests", "4", "--rate", "1", "--skip-bon", "--skip-vllm", "--bootstrap", "20"]
    a = sb.parse(argv)
    first = sb.Bench(a)
    records = recs([30.0, 95.0, 40.0, 120.0], [1.0] * 4)
    first.doc["servers"]["sr"] = {"summary": {}, "records": [sb.asdict(r) for r in records]}
    sb.write(a.out, first.doc)

    again = sb.Bench(sb.parse(argv))
    again.resume()
    assert again.doc["servers"]["sr"]["records"] == first.doc["servers"]["sr"]["records"]
    assert again.summary["sr"]["completed"] == 4 and again.summary["sr"]["goodput_per_s"] > 0
    monkeypatch.setattr(sb, "launched", lambda *args, **kw: pytest.fail("a kept phase's server was started"))
    again.rodeco_phases()  # every rodeco phase kept: no server

    other = sb.Bench(sb.parse([*argv, "--seed", "1"]))  # other arrivals: nothing kept
    other.resume()
    assert other.doc["servers"] == {} and other.summary == {}


def test_serve_compare_prints_each_runs_figures_and_its_ratio_to_the_first(tmp_path, capsys):
    from rodeco.experiments.bench import serve_compare

    for name, rps, held in (("a", 0.2, 0.0), ("b", 0.1, 1.5)):
        doc = {
            "servers": {
                "sr": {
                    "summary": {"requests_per_s": rps, "p50_latency_s": 9.0, "p95_latency_s": 12.0, "mean_reward": -1},
                    "server_side": {"decode_tokens_per_s": 150.0, "time_share_of_span": {"decode": 0.8, "held": held}},
                }
            }
        }
        (tmp_path / name).mkdir()
        (tmp_path / name / "serve_bench.json").write_text(json.dumps(doc))
    serve_compare.main([f"first={tmp_path / 'a'}", f"second={tmp_path / 'b'}"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["first", "0.200", "1.00"] and out[2].split()[:3] == ["second", "0.100", "0.50"]
    assert out[2].split()[-1] == "1.500"
    with pytest.raises(SystemExit, match="no 'bon' phase"):
        serve_compare.main([f"first={tmp_path / 'a'}", "--server", "bon"])
    with pytest.raises(SystemExit):
        serve_compare.parse(["just-a-dir"])


def test_vllms_choices_carry_their_log_probs_to_a_client_side_guide_that_reads_them():
    """The client-side scorer of vLLM's answers under ``logprob``: each choice's tokens' log-probs, as vLLM's chat
    API returns them, reach the reward, which scores their mean; a choice without them is reported as such."""
    from rodeco.experiments.bench.serve_clients import Scorer, choices

    def tok(lp: float, *top: float) -> dict:
        return {"token": "x", "logprob": lp, "top_logprobs": [{"token": "y", "logprob": t} for t in top]}

    d = {
        "choices": [
            {"index": 1, "message": {"content": "b"}, "logprobs": {"content": [tok(-2.0, -2.0, -0.5)]}},
            {"index": 0, "message": {"content": "a"}, "logprobs": {"content": [tok(-1.0, -0.2, -1.0), tok(-3.0)]}},
        ]
    }
    texts, traced = choices(d, top_k=1)
    assert texts == ["a", "b"] and traced == [([-1.0, -3.0], [[-0.2], []]), ([-2.0], [[-0.5]])]
    assert choices({"choices": [{"index": 0, "message": {"content": "a"}, "logprobs": None}]}, 1) == (["a"], None)
    scorer = Scorer("logprob", batching=False)
    try:
        assert scorer.logprobs
        scores, *_ = scorer.score("q", texts, traced)
    finally:
        scorer.close()
    assert scores == pytest.approx([-2.0, -2.0])  # the mean log-prob of each
