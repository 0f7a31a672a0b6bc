"""Ranking helpers for rejection policies."""

from __future__ import annotations

import numpy as np

from rodeco.state import PromptView


def keep_top(pv: PromptView, n_reject: int) -> list[int]:
    """The rows to keep when rejecting the ``n_reject`` lowest partial scores of one prompt (at least its
    ``min_reject``, at most ``k - 1``). Ties go to the lower candidate id, so the choice is deterministic."""
    n_reject = min(pv.k - 1, max(pv.min_reject, n_reject))
    order = np.lexsort((np.asarray(pv.candidate_ids), -np.asarray(pv.scores)))  # best first
    return sorted(order[: pv.k - n_reject].tolist())
