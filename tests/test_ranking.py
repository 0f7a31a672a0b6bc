"""One ranking helper (``rodeco.common.ranking``): ``keep_top`` (the per-prompt policies' cut, clamped to the prompt's
``min_reject`` and ``k - 1``) and ``keep_best`` (``allocate``'s cut, exact) give, on any input, the rows that their
two former copies gave (the old ``ranking.keep_top`` and ``rodeco_policies.allocate.keep_best``, copied here)."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import rodeco
from rodeco import Calibration, PromptView, RoundView
from rodeco_policies import allocate
from rodeco_policies.allocate import AllocatePolicy


def old_keep_top(pv: PromptView, n_reject: int) -> list[int]:  # rodeco/common/ranking.py before the merge
    n_reject = min(pv.k - 1, max(pv.min_reject, n_reject))
    order = np.lexsort((np.asarray(pv.candidate_ids), -np.asarray(pv.scores)))
    return sorted(order[: pv.k - n_reject].tolist())


def old_keep_best(pv: PromptView, n_reject: int) -> list[int]:  # rodeco_policies/allocate.py before the merge
    order = np.lexsort((np.asarray(pv.candidate_ids), -np.asarray(pv.scores)))
    return sorted(order[: pv.k - n_reject].tolist())


FINITE = st.one_of(
    st.sampled_from([-1.0, 0.0, -0.0, 0.5, 1.0]),  # ties, signed zeros
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
)  # what the core lets a reward give
SCORE = st.one_of(FINITE, st.just(-np.inf))


@st.composite
def prompt_views(draw, index: int = 0, score=SCORE) -> PromptView:
    k = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, 10_000), min_size=k, max_size=k, unique=True))  # any order, as after rounds
    scores = np.asarray(draw(st.lists(score, min_size=k, max_size=k)), dtype=np.float64)
    return PromptView(
        prompt_index=index,
        candidate_ids=ids,
        scores=scores,
        history=np.zeros((k, 0)),
        finished_scores=[],
        tokens_generated=draw(st.integers(1, 64)),
        min_reject=draw(st.integers(0, k + 2)),
    )


@settings(max_examples=400, deadline=None)
@given(pv=prompt_views(), data=st.data())
def test_keep_top_and_keep_best_keep_what_their_old_copies_kept(pv, data):
    n = data.draw(st.integers(-pv.k - 2, 2 * pv.k + 2), label="n_reject")
    assert rodeco.keep_top(pv, n) == old_keep_top(pv, n)
    assert rodeco.keep_best(pv, n) == old_keep_best(pv, n)
    if 0 <= n <= pv.k - 1:  # allocate's range: exactly n rows go, the best stay
        kept = rodeco.keep_best(pv, n)
        assert len(kept) == pv.k - n
        worst_kept = min(pv.scores[kept]) if kept else np.inf
        assert all(pv.scores[i] <= worst_kept for i in set(range(pv.k)) - set(kept))


def calibration() -> Calibration:
    return Calibration(
        generator="g", partial_reward="r", reward="r", lengths=[4, 64], slope=[0.8, 0.8], resid_sd=[0.6, 0.6]
    )


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_allocate_selects_what_it_selected_with_its_own_copy(data):
    pvs = [data.draw(prompt_views(i, FINITE), label=f"prompt {i}") for i in range(data.draw(st.integers(2, 4)))]
    rows = sum(pv.k for pv in pvs)
    view = RoundView(round=0, prompts=pvs, max_rows_next=data.draw(st.integers(len(pvs), rows)), max_new_tokens=64)
    pol = AllocatePolicy(calibration(), delta=data.draw(st.sampled_from([1e-9, 0.05, 0.3])))
    got = pol.select(view)
    with mock.patch.object(allocate, "keep_best", old_keep_best):
        assert got == pol.select(view)
    assert sum(map(len, got)) <= view.max_rows_next and all(got)
