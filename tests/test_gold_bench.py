"""``scripts/gold_bench.py``'s arithmetic: the FLOPs speedup at matched gold accuracy against the Best-of-N curve,
any-of-N over disjoint candidate groups, the winner rules' gold scores, repeated texts dropped, and the table and the
headline over synthetic runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rodeco.experiments.bench import gold_bench as gb
from rodeco.experiments.bench import gold_report as gr
from rodeco.experiments.speedup import matched_speedup

CURVE = [(10.0, 0.1), (20.0, 0.2), (40.0, 0.4)]  # (FLOPs, accuracy) at N = 1, 2, 4


@pytest.mark.parametrize(
    "accuracy, flops, want",
    [
        (0.2, 10.0, 2.0),  # Best-of-2's accuracy at Best-of-1's FLOPs
        (0.3, 10.0, math.exp((math.log(20) + math.log(40)) / 2) / 10),  # halfway: interpolated in log FLOPs
        (0.05, 20.0, 0.5),  # below the curve's start: Best-of-1's FLOPs
        (0.4, 40.0, 1.0),
        (0.5, 10.0, 4.0),  # the curve never reaches it: its last point's FLOPs, a lower bound
    ],
)
def test_matched_speedup(accuracy, flops, want):
    f, a = np.array(CURVE).T
    got, _ = matched_speedup(accuracy, flops, a, f)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_any_of_n_averages_disjoint_groups():
    g = [0, 0, 1, 0, 0, 0, 0, 1]
    assert gr._any_of(g, 1) == pytest.approx(0.25)
    assert gr._any_of(g, 2) == pytest.approx(0.5)  # groups (0,0) (1,0) (0,0) (0,1)
    assert gr._any_of(g, 8) == 1.0


def test_winner_rules_score_their_winners_gold():
    cands = [(0, 3.0, "It is 4", 9.0), (1, 1.0, "5", 1.0), (2, 0.5, "the answer is 5", 1.0), (3, 0.1, "7", 0.5)]
    got = gb.winners(cands, lambda t: 1.0 if t.endswith("5") else 0.0, "last_number")
    # weighted: softmax weight of 4 > 5's; confidence: 4's 9 against 5's 1 + 1
    assert got == {"reward": 0.0, "majority": 1.0, "weighted": 0.0, "confidence": 0.0}
    cands[1] = (1, 1.0, "5", 8.5)
    assert gb.winners(cands, lambda t: 1.0 if t.endswith("5") else 0.0, "last_number")["confidence"] == 1.0
    assert gb.winners([], lambda t: 1.0, "last_number") == dict.fromkeys(gb.RULES, 0.0)


def synthetic(P: int = 40) -> tuple[dict, dict]:
    """Best-of-N better with N at linear FLOPs; a method near Best-of-16's accuracy at a quarter of its FLOPs."""
    rng = np.random.default_rng(0)
    runs: dict = {"t": {"g": {}}}
    ceiling = {"t": {i: list(rng.integers(0, 2, 64).astype(float)) for i in range(P)}}
    for i in range(P):
        m = {}
        for n in gb.BON:
            right = float(rng.random() < min(0.9, 0.1 * math.log2(2 * n)))
            m[f"bon_{n}"] = [{"flops": 1e9 * n, **dict.fromkeys(gb.RULES, right)}]
        right = float(rng.random() < 0.55)
        m["sr"] = [{"flops": 4e9, **dict.fromkeys(gb.RULES, right)}]
        m["top"] = [{"flops": 8e9, **dict.fromkeys(gb.RULES, 1.0)}]  # always right: above the curve's top
        runs["t"]["g"][i] = {"index": i, "methods": m}
    return runs, ceiling


def test_the_table_and_the_headline_over_synthetic_runs():
    runs, ceiling = synthetic()
    tab = gr.table(runs, ceiling, ["t"], resamples=200, guides=["g", "absent"])
    assert tab["guides"] == ["g"]
    assert tab["problems"] == 40 and set(tab["any_of"]) == {str(n) for n in gb.BON}
    sr = tab["rows"]["g/sr/reward"]
    v, lo, hi = sr["speedup_at_matched_accuracy"]
    assert lo <= v <= hi and sr["gflops"][0] == pytest.approx(4.0) and sr["speedup_bound"] == ""
    bon16 = tab["rows"]["g/bon_16/reward"]["accuracy"][0]
    assert tab["best_bon16_accuracy"] == pytest.approx(bon16)
    assert sr["bon16_flops_ratio"][0] == pytest.approx(4.0)  # Best-of-16's 16 GFLOPs over its 4
    top = tab["best_bon"]
    assert top["accuracy"] == max(p["accuracy"] for p in tab["bon_curve"])
    # always right: above every Best-of-N, so its speedup is the top's FLOPs over its own, a lower bound
    t = tab["rows"]["g/top/reward"]
    assert t["speedup_bound"] == "lower" and t["bound_share"] == 1.0
    assert t["speedup_at_matched_accuracy"][0] == pytest.approx(top["gflops"] / 8.0)
    assert t["vs_best_bon"][0] == pytest.approx(1.0 - top["accuracy"])
    assert gr.fmt(t["speedup_at_matched_accuracy"], 2, t["speedup_bound"]).startswith("≥ ")
    # the curve is held flat at its ends; a method at Best-of-1's FLOPs and accuracy gains nothing
    assert gr.curve_accuracy_at(1e9, np.array([1e9, 2e9]), np.array([0.1, 0.3])) == pytest.approx(0.1)
    assert gr.curve_accuracy_at(2**0.5 * 1e9, np.array([1e9, 2e9]), np.array([0.1, 0.3])) == pytest.approx(0.2)
    assert gr.headline(tab) == "g/top/reward"  # the one row that reaches the best Best-of-N's accuracy


def test_the_headline_is_the_most_accurate_row_when_none_reaches_the_curves_best():
    row = {"accuracy": [0.3, 0.2, 0.4], "speedup_at_matched_accuracy": [9.0, 1, 10]}
    sel = {"best_bon": {"accuracy": 0.5}, "rows": {"g/bon_64/reward": row, "g/a/reward": row}}
    sel["rows"]["g/b/majority"] = {**row, "accuracy": [0.35, 0.3, 0.4], "speedup_at_matched_accuracy": [1.0, 1, 1]}
    assert gr.headline(sel) == "g/b/majority"


def test_a_repeated_text_keeps_its_first_problem():
    assert gr.first_of_each_text({3: "a", 1: "b", 2: "a", 5: "c", 4: "b"}) == {1, 2, 5}


def test_live_search_records_join_the_replayed_ones_on_the_problems_both_ran():
    replayed = {i: {"index": i, "methods": {"bon_1": [{"flops": 1.0}]}} for i in range(3)}
    live = {i: {"index": i, "methods": {"beam_16": [{"flops": 2.0}]}, "seconds": 5.0} for i in (1, 2, 7)}
    both = gr.merged(replayed, live)
    assert sorted(both) == [1, 2]  # problem 7 was never replayed, 0 never searched
    assert set(both[1]["methods"]) == {"bon_1", "beam_16"} and both[1]["seconds"] == 5.0
    assert [m.label for m in gb.search_methods()] == ["beam_16", "dvts_16", "pf_16"]
    assert all(m.policy["decision_tokens"] == 8 and m.n == 16 for m in gb.search_methods())


@pytest.mark.parametrize("task", sorted(gb.CANDIDATES))
def test_a_tasks_settings_reach_the_config_as_they_are(task):
    from omegaconf import OmegaConf

    import rodeco

    cfg = rodeco.load_config(["data=reasoning_gym", f"data.task={task}", gb.task_config(gb.CANDIDATES[task])])
    assert OmegaConf.to_container(cfg.data.task_config) == gb.CANDIDATES[task]


def test_the_methods_and_their_memory():
    ms = {m.label: m for m in gb.methods(64)}
    assert [k for k in ms if k.startswith("bon_")] == [f"bon_{n}" for n in gb.BON]
    assert ms["bon_16"].groups == 4 and not ms["bon_16"].memory  # Best-of-N holds its own memory
    assert ms["sr_fixed_16"].memory and ms["sr_adaptive_auto"].n == "auto"  # at Best-of-4's memory
    assert ms["deepconf_32"].policy == {"name": "deepconf"} and ms["deepconf_32"].groups == 2
    assert dict(ms["vote_stop_64"].winner) == {"stop": "beta"} and ms["vote_stop_64"].policy == {"name": "none"}
    assert "bon_64" not in {m.label for m in gb.methods(32)} and "vote_stop_32" in {m.label for m in gb.methods(32)}


def test_the_gap_closed_is_measured_from_logprobs_best_rule_to_any_of_16():
    draws = np.array  # each figure: the point estimate, then two resamples
    A = {("logprob", "bon_16", r): draws([0.2, 0.2, 0.3]) for r in gb.RULES}
    A["logprob", "bon_16", "majority"] = draws([0.25, 0.2, 0.3])  # logprob's best rule at the point estimate
    A |= {("verifier", "bon_16", r): draws([0.3, 0.4, 0.3]) for r in gb.RULES}
    out = gr.gap_closed(A, ["logprob", "verifier"], draws([0.45, 0.4, 0.5]), lambda v: [float(v[0]), *v[1:].tolist()])
    assert out["logprob"]["rule"] == "majority" and out["logprob"]["share"][0] == 0.0
    assert out["verifier"]["share"] == pytest.approx([0.25, 1.0, 0.0])  # (0.3-0.25)/(0.45-0.25), (0.4-0.2)/0.2, 0


def test_the_modelled_pick_rises_with_auc_and_the_needed_auc_reaches_its_target():
    rng = np.random.default_rng(1)
    gold = (rng.random((30, 64)) < 0.15).astype(float)
    anyof = float(np.mean([gr._any_of(list(g), 16) for g in gold]))
    picks = [gr.modelled_pick(gold, a) for a in (0.5, 0.7, 0.9, 0.999)]
    assert picks == sorted(picks)
    assert picks[0] == pytest.approx(gold.mean(), abs=0.02)  # no signal: a random row's accuracy
    assert picks[-1] == pytest.approx(anyof, abs=0.01)  # a near-perfect guide: any-of-16
    target = (gold.mean() + anyof) / 2
    need = gr.auc_needed(gold, target)
    assert 0.5 < need < 0.999 and gr.modelled_pick(gold, need) >= target > gr.modelled_pick(gold, need - 0.01)
    assert math.isnan(gr.auc_needed(gold, anyof + 0.1))  # beyond any-of-16: no AUC reaches it


def test_a_search_methods_headline_is_read_from_the_table_with_the_search_methods(capsys):
    runs, ceiling = synthetic()
    tab = gr.table(runs, ceiling, ["t"], resamples=20, guides=["g"])
    gr.print_headline("g/top/reward", {"pooled": {"rows": {}}, "pooled_with_search": tab})
    out = capsys.readouterr().out
    assert "from the pooled_with_search table (40 problems)" in out and "speedup at matched accuracy ≥" in out
    gr.print_headline("g/absent/reward", {"pooled": tab})
    assert "has no report row" in capsys.readouterr().out


def test_a_record_cut_short_is_dropped_so_the_run_resumes_cleanly(tmp_path, caplog):
    from rodeco.experiments.bench.gold_tasks import records

    f = tmp_path / "logprob.jsonl"
    assert records(f) == []
    f.write_text('{"index": 0}\n{"index": 1}\n{"ind')  # stopped while writing the third
    assert [r["index"] for r in records(f)] == [0, 1] and f.read_text().endswith('{"ind')  # a reader leaves it
    with caplog.at_level("WARNING"):
        assert [r["index"] for r in records(f, repair=True)] == [0, 1]  # the writer, resuming, drops it
    assert "cut short" in caplog.text and f.read_text() == '{"index": 0}\n{"index": 1}\n'
    with f.open("a") as out:  # the resumed run appends after the whole records
        out.write('{"index": 2}\n')
    assert [r["index"] for r in records(f)] == [0, 1, 2]


def test_the_load_tests_matched_best_of_is_the_smallest_n_within_two_points_under_the_same_guide_and_rule():
    from rodeco.experiments.bench.gold_report import matched_best_of

    rows = {f"logprob/bon_{n}/reward": {"accuracy": [a, 0, 1]} for n, a in zip((1, 2, 4, 8, 16, 32, 64), (
        0.05, 0.08, 0.12, 0.15, 0.17, 0.20, 0.25))}  # fmt: skip
    rows["logprob/bon_4/majority"] = {"accuracy": [0.30, 0, 1]}  # another rule: not the curve
    rows["logprob/sr_fixed_auto/reward"] = {"accuracy": [0.19, 0, 1]}
    rows["logprob/beam_16/reward"] = {"accuracy": [0.40, 0, 1]}
    figures = {"pooled": {"rows": rows}}
    m = matched_best_of(figures, "logprob/sr_fixed_auto/reward")
    assert m["best_of"] == 16 and m["best_of_accuracy"] == 0.17  # 0.17 >= 0.19 - 0.02; Best-of-8's 0.15 is not
    assert matched_best_of(figures, "logprob/beam_16/reward")["best_of"] is None  # above the whole curve
    with pytest.raises(SystemExit, match="not a row"):
        matched_best_of(figures, "logprob/nothing/reward")
