"""Ranking helpers for rejection policies.

One ranking (best partial score first, ties to the lower candidate id), cut two ways: ``keep_best`` exactly,
``keep_top`` clamped to the prompt's share of the forced rejection."""

from __future__ import annotations

import numpy as np

from rodeco.common.state import PromptView


def best_first(pv: PromptView, rows: np.ndarray | None = None) -> np.ndarray:
    """The prompt's rows (or only ``rows``, local indices) ranked best partial score first, ties to the lower
    candidate id: the one ranking every built-in policy cuts, rejecting and searching alike."""
    rows = np.arange(pv.k) if rows is None else np.asarray(rows)
    ids = np.asarray(pv.candidate_ids)[rows]
    return rows[np.lexsort((ids, -np.asarray(pv.scores)[rows]))]


def keep_best(pv: PromptView, n_reject: int) -> list[int]:
    """The rows left (sorted local indices) after rejecting exactly the ``n_reject`` lowest partial scores of one
    prompt; ties go to the lower candidate id, so the choice is deterministic. Nothing is clamped: a policy that
    shares the batch's forced rejection between prompts (``allocate``) may reject fewer than a prompt's
    ``min_reject``, since only the batch's total is checked; keep ``n_reject`` at most ``k - 1``."""
    return sorted(best_first(pv)[: pv.k - n_reject].tolist())


def keep_top(pv: PromptView, n_reject: int) -> list[int]:
    """``keep_best`` with ``n_reject`` raised to the prompt's ``min_reject`` and capped at ``k - 1``: the rows to
    keep when a prompt takes its own share of the budget's forced rejection, keeping at least one row."""
    return keep_best(pv, min(pv.k - 1, max(pv.min_reject, n_reject)))
