"""``experiment=engine_bench``'s figures: engines against vLLM paired run by run, with a bootstrap CI."""

from __future__ import annotations

import math

import pytest

from rodeco.experiments.engine_bench import paired_runs


def test_paired_runs_give_each_runs_ratio_their_geometric_mean_and_a_ci_around_it():
    p = paired_runs([200.0, 330.0, 390.0], [100.0, 150.0, 200.0])
    assert p["ratios"] == pytest.approx([2.0, 2.2, 1.95])
    assert p["geomean"] == pytest.approx(math.exp(sum(map(math.log, [2.0, 2.2, 1.95])) / 3))
    lo, hi = p["ci"]
    assert 1.95 <= lo < p["geomean"] < hi <= 2.2


def test_runs_that_agree_have_a_ci_of_no_width():
    assert paired_runs([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])["ci"] == pytest.approx([2.0, 2.0])
