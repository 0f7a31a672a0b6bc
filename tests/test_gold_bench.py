"""``scripts/gold_bench.py``'s arithmetic: the FLOPs speedup at matched gold accuracy against the Best-of-N curve,
any-of-N over disjoint candidate groups, the winner rules' gold scores, and the table and goal over synthetic runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rodeco.experiments.bench import gold_bench as gb
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
    assert gb._any_of(g, 1) == pytest.approx(0.25)
    assert gb._any_of(g, 2) == pytest.approx(0.5)  # groups (0,0) (1,0) (0,0) (0,1)
    assert gb._any_of(g, 8) == 1.0


def test_winner_rules_score_their_winners_gold():
    cands = [(0, 3.0, "It is 4"), (1, 1.0, "5"), (2, 0.5, "the answer is 5"), (3, 0.1, "7")]
    got = gb.winners(cands, lambda t: 1.0 if t.endswith("5") else 0.0, "last_number")
    assert got == {"reward": 0.0, "majority": 1.0, "weighted": 0.0}  # weighted: softmax weight of 4 > 5's
    assert gb.winners([], lambda t: 1.0, "last_number") == dict.fromkeys(gb.RULES, 0.0)


def synthetic(P: int = 40) -> tuple[dict, dict]:
    """Best-of-N better with N at linear FLOPs; a method near Best-of-16's accuracy at a quarter of its FLOPs."""
    rng = np.random.default_rng(0)
    runs: dict = {"t": {"g": {}}}
    ceiling = {"t": {i: list(rng.integers(0, 2, 32).astype(float)) for i in range(P)}}
    for i in range(P):
        m = {}
        for n in gb.BON:
            right = float(rng.random() < min(0.9, 0.1 * math.log2(2 * n)))
            m[f"bon_{n}"] = [{"flops": 1e9 * n, **dict.fromkeys(gb.RULES, right)}]
        right = float(rng.random() < 0.55)
        m["sr"] = [{"flops": 4e9, **dict.fromkeys(gb.RULES, right)}]
        runs["t"]["g"][i] = {"index": i, "methods": m}
    return runs, ceiling


def test_the_table_and_the_goal_over_synthetic_runs():
    runs, ceiling = synthetic()
    tab = gb.table(runs, ceiling, ["t"], resamples=200, guides=["g", "absent"])
    assert tab["guides"] == ["g"]
    assert tab["problems"] == 40 and set(tab["any_of"]) == {str(n) for n in gb.BON}
    sr = tab["rows"]["g/sr/reward"]
    v, lo, hi = sr["speedup_at_matched_accuracy"]
    assert lo <= v <= hi and sr["gflops"][0] == pytest.approx(4.0)
    bon16 = tab["rows"]["g/bon_16/reward"]["accuracy"][0]
    assert tab["best_bon16_accuracy"] == pytest.approx(bon16)
    assert sr["bon16_flops_ratio"][0] == pytest.approx(4.0)  # Best-of-16's 16 GFLOPs over its 4
    if sr["accuracy"][0] >= bon16:
        assert tab["goal"]["label"] in {f"g/sr/{r}" for r in gb.RULES} and tab["goal"]["ratio"][0] == pytest.approx(4)
    else:
        assert tab["goal"]["label"] is None


def test_live_search_records_join_the_replayed_ones_on_the_problems_both_ran():
    replayed = {i: {"index": i, "methods": {"bon_1": [{"flops": 1.0}]}} for i in range(3)}
    live = {i: {"index": i, "methods": {"beam_16": [{"flops": 2.0}]}, "seconds": 5.0} for i in (1, 2, 7)}
    both = gb.merged(replayed, live)
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
