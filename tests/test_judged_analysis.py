"""The judged analysis: Best-of-N's curve on a judge, matched-judge speedups, residuals from the Best-of-N relation."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.experiments.judged import (
    Curve,
    Resamples,
    Winners,
    analyze,
    best_of_prefix,
    diagnostics_table,
    matched_speedup,
    predicted_judge_gain,
)

SIZES = [1, 2, 4, 8, 16, 32, 64]


def test_best_of_prefix_takes_the_running_best():
    g = np.array([0.1, 0.5, 0.3, 0.9, 0.2, 0.95, 0, 0])
    assert best_of_prefix(g, [1, 2, 4, 8]).tolist() == [0, 1, 3, 5]
    with pytest.raises(ValueError, match="Best-of-16 from a set of 8"):
        best_of_prefix(g, [16])


def test_matched_speedup_interpolates_log_flops_and_flags_bounds():
    cj, cf = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 4.0])
    assert matched_speedup(1.5, 1.0, cj, cf) == (pytest.approx(2 ** 1.5), "")
    assert matched_speedup(3.0, 2.0, cj, cf) == (pytest.approx(2.0), "lower")
    assert matched_speedup(-1.0, 0.5, cj, cf) == (pytest.approx(2.0), "upper")
    # a dip in the curve: matched on its running maximum
    assert matched_speedup(1.0, 1.0, np.array([0.0, 1.0, 0.5, 2.0]), np.array([1.0, 2.0, 4.0, 8.0]))[0] == \
        pytest.approx(2.0)


def test_predicted_gain_follows_the_curve_and_marks_beyond():
    cg, cj = np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.5, 0.6])
    assert predicted_judge_gain(1.5, cg, cj) == (pytest.approx(0.55), False)
    assert predicted_judge_gain(5.0, cg, cj) == (pytest.approx(0.6), True)


def _world(P=40, S=2, M=64, judge_of=lambda g, noise: g + noise, seed=0):
    rng = np.random.default_rng(seed)
    guide = rng.normal(size=(P, S, M))
    judge = judge_of(guide, rng.normal(scale=0.5, size=guide.shape))
    win = np.stack([[best_of_prefix(guide[p, s], SIZES) for s in range(S)] for p in range(P)])  # [P, S, K]
    take = lambda x: np.take_along_axis(x, win, axis=2)  # noqa: E731
    flops = np.tile(np.array(SIZES, dtype=float), (P, 1))
    return guide, judge, Curve(SIZES, take(guide), {"j": take(judge)}, flops)


def test_a_method_that_is_best_of_16_matches_best_of_16():
    _, _, curve = _world()
    m = curve.method(16)
    out = analyze(curve, {"bo16": Winners(m.guide, m.judge, m.flops)}, "j", ["best_of_4"], resamples=200)
    row = out["methods"]["bo16"]
    assert out["gain"]["visible"]
    assert row["speedup_flops_at_matched_judge"]["value"] == pytest.approx(1.0, abs=0.05)
    assert abs(row["residual"]["value"]) < 1e-9 and not row["residual"]["below"]
    assert row["vs_best_of_4"]["value"] > 0 and row["vs_best_of_4"]["ci"][0] > 0


def test_a_hacking_method_is_flagged_below_the_relation():
    """Winners with Best-of-64's guide reward but Best-of-1's judge score: a guide gain the judge does not see."""
    _, _, curve = _world()
    hack = Winners(curve.method(64).guide, curve.method(1).judge, curve.method(4).flops)
    row = analyze(curve, {"hack": hack}, "j", ["best_of_4"], resamples=200)["methods"]["hack"]
    assert row["residual"]["below"] and row["residual"]["ci"][1] < 0
    assert row["speedup_flops_at_matched_judge"]["value"] < 1.0


def test_a_judge_blind_to_the_guide_gives_no_speedup():
    _, _, curve = _world(judge_of=lambda g, noise: noise)
    m = curve.method(16)
    out = analyze(curve, {"bo16": m}, "j", ["best_of_4"], resamples=200)
    assert not out["gain"]["visible"]
    assert out["methods"]["bo16"]["speedup_flops_at_matched_judge"] is None


def test_resamples_keep_draw_zero_as_the_data_and_skip_nans():
    rs = Resamples.draw(3, 2, 5)
    x = np.arange(6.0).reshape(3, 2)
    assert rs.means(x)[0] == pytest.approx(2.5)
    x[0, 0] = np.nan
    assert rs.means(x)[0] == pytest.approx(np.mean([1, 2, 3, 4, 5]))
    d = diagnostics_table({"m": {"tokens": np.ones((3, 2))}}, resamples=10)
    assert d["m"]["tokens"] == {"value": 1.0, "ci": [1.0, 1.0]}
