"""The judged analysis: Best-of-N's curve on a judge, matched-judge speedups, residuals from the Best-of-N relation."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.experiments.bench import search_judged
from rodeco.experiments.bootstrap import Resamples
from rodeco.experiments.judged import (
    Curve,
    Winners,
    analyze,
    best_of_prefix,
    correlations,
    diagnostics_table,
    paired_difference,
    predicted_judge_gain,
)
from rodeco.experiments.speedup import matched_speedup

SIZES = [1, 2, 4, 8, 16, 32, 64]


def test_best_of_prefix_takes_the_running_best():
    g = np.array([0.1, 0.5, 0.3, 0.9, 0.2, 0.95, 0, 0])
    assert best_of_prefix(g, [1, 2, 4, 8]).tolist() == [0, 1, 3, 5]
    with pytest.raises(ValueError, match="Best-of-16 from a set of 8"):
        best_of_prefix(g, [16])


def test_matched_speedup_interpolates_log_flops_and_flags_bounds():
    cj, cf = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 4.0])
    assert matched_speedup(1.5, 1.0, cj, cf) == (pytest.approx(2**1.5), "")
    assert matched_speedup(3.0, 2.0, cj, cf) == (pytest.approx(2.0), "lower")
    assert matched_speedup(-1.0, 0.5, cj, cf) == (pytest.approx(2.0), "upper")
    # a dip in the curve: matched on its running maximum
    assert matched_speedup(1.0, 1.0, np.array([0.0, 1.0, 0.5, 2.0]), np.array([1.0, 2.0, 4.0, 8.0]))[
        0
    ] == pytest.approx(2.0)


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


def test_paired_difference_pairs_prompt_and_set():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(20, 2)) * 5  # large spread across prompts, cancelled by the pairing
    d = paired_difference(base + 0.3, base, resamples=200)
    assert d["value"] == pytest.approx(0.3) and d["ci"] == pytest.approx([0.3, 0.3])
    noisy = paired_difference(base + 0.3 + rng.normal(size=(20, 2)) * 0.1, base, resamples=200)
    assert noisy["ci"][0] < noisy["value"] < noisy["ci"][1] and noisy["ci"][0] > 0.2


class _CountingJudges:
    """A stand-in for the run's judges: scores a text by its length, counts the texts and charges one token each."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.judges = [SimpleNamespace(name="len", spec={"name": "len"})]
        self.calls = 0
        self.texts = 0

    def score(self, prompt, index, items, only=None):
        from types import SimpleNamespace

        self.calls += 1
        self.texts += len(items)
        return {it.candidate_id: [SimpleNamespace(score=float(len(it.text)))] for it in items}

    def costs(self):
        return {"len": {"calls": self.calls, "tokens": self.texts, "flops": 2.0 * self.texts, "seconds": 0.0}}


def test_the_judge_cache_scores_once_and_keeps_the_cost_across_runs(tmp_path):

    JudgeCache = search_judged.JudgeCache
    items = [(0, "p0", "a"), (0, "p0", "bbb"), (1, "p1", "cc")]
    first = JudgeCache(tmp_path / "cache.json", _CountingJudges())
    first.score(items[:2])
    assert first.get("len", "p0", "bbb") == 3.0 and np.isnan(first.get("len", "p1", "cc"))
    again = JudgeCache(tmp_path / "cache.json", judges := _CountingJudges())
    again.score(items)  # only the new text is scored
    assert judges.texts == 1 and again.get("len", "p1", "cc") == 2.0
    assert again.costs()["len"] == {"calls": 2, "tokens": 3, "flops": 6.0, "seconds": 0.0}
    judges.judges[0].spec = {"name": "len", "other": 1}  # a changed judge starts empty
    assert np.isnan(JudgeCache(tmp_path / "cache.json", judges).get("len", "p0", "a"))


def test_correlations_see_a_judge_that_reads_length_and_one_that_follows_the_guide():
    rng = np.random.default_rng(1)
    prompt = np.repeat(np.arange(10), 6)
    length = rng.integers(50, 800, 60).astype(float)
    guide = rng.normal(size=60)
    by_length = correlations(prompt, np.log(length) + rng.normal(size=60) * 0.01, length, guide)
    assert by_length["pearson_log_chars"] > 0.99 and abs(by_length["spearman_guide"]) < 0.4
    follows = correlations(prompt, guide * 2 + 1, length, guide)
    assert (
        follows["spearman_guide"] == pytest.approx(1.0)
        and follows["spearman_guide_within_prompt"] == pytest.approx(1.0)
        and follows["prompts_within"] == 10
    )
    judge = guide.copy()
    judge[0] = np.nan  # an unscored text is left out
    assert correlations(prompt, judge, length, guide)["texts"] == 59
