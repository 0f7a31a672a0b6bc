"""Estimators of rodeco.experiments.metrics against hand-computed values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rodeco.experiments.metrics import compute_to_match, curve_end, expected_best_of, improvement_score


def test_expected_best_of_by_hand():
    s = [3.0, 1.0, 2.0]
    assert expected_best_of(s, 1) == pytest.approx(2.0)  # the mean
    assert expected_best_of(s, 2) == pytest.approx((2 + 3 + 3) / 3)  # subsets {1,2},{1,3},{2,3}
    assert expected_best_of(s, 3) == pytest.approx(3.0)


def test_expected_best_of_matches_enumeration():
    rng = np.random.default_rng(0)
    s = rng.normal(size=9)
    for n in range(1, 10):
        brute = np.mean([max(c) for c in itertools.combinations(s, n)])
        assert expected_best_of(s, n) == pytest.approx(brute, rel=1e-9)
    with pytest.raises(ValueError):
        expected_best_of(s, 10)


def test_improvement_score_by_hand():
    # prompt 1: best 5 on a Best-of-n span [2, 4] -> (5-4)/2 = 0.5; prompt 2: best 1 on [1, 3] -> (1-3)/2 = -1
    assert improvement_score([5, 1], [4, 3], [2, 1]) == pytest.approx(100 * (1 + (0.5 - 1.0) / 2))
    assert improvement_score([4, 3], [4, 3], [2, 1]) == pytest.approx(100.0)  # as good as Best-of-n
    assert improvement_score([4, 7], [4, 7], [2, 7]) == pytest.approx(100.0)  # a tied prompt is skipped
    with pytest.raises(ValueError):
        improvement_score([1], [2], [2])


def test_compute_to_match_log_interpolates():
    compute, score = [1, 2, 4, 8], [0.0, 1.0, 2.0, 3.0]
    assert compute_to_match(1.0, compute, score) == pytest.approx(2.0)
    assert compute_to_match(1.5, compute, score) == pytest.approx(2**1.5)  # halfway in log space
    assert compute_to_match(-1.0, compute, score) == pytest.approx(1.0)
    assert compute_to_match(3.5, compute, score) is None  # above the curve: no extrapolation
    assert compute_to_match(1.0, [1, 2, 4], [0.0, 1.0, 0.5]) == pytest.approx(2.0)  # running max makes it monotone


def test_curve_end_says_which_way_a_clamped_match_is_bounded():
    compute, score = [1, 2, 4, 8], [0.0, 1.0, 2.0, 3.0]
    assert curve_end(3.5, compute, score) == "lower"  # compute_to_match gives None: charged the largest compute
    assert curve_end(-1.0, compute, score) == "upper"  # compute_to_match gives 1.0 all the same: at most that
    assert curve_end(0.0, compute, score) is None and curve_end(3.0, compute, score) is None  # on the curve
    assert curve_end(1.5, compute, score) is None
    assert curve_end(2.5, [8, 1, 2, 4], [3.0, 0.0, 1.0, 2.0]) is None  # ordered by compute, as compute_to_match
    assert curve_end(0.9, [1, 2, 4], [1.0, 0.5, 2.0]) == "upper"  # below the cheapest point's score
