"""``adaptive``: per prompt, keep every candidate that still has a fair chance of finishing above the best.

Model (see docs/policies.md): a candidate's final reward is its current partial reward plus Gaussian noise,
``final_i = s_i + e_i`` with ``e_i ~ N(0, tau^2)``. The noise scale comes from this prompt's own history: how far
its candidates moved *relative to each other* between consecutive decision points (a move shared by every
candidate does not change the ranking, so each round's moves are centred first). Before two decision points
exist, and as a pseudo-count afterwards, a prior scale ``prior_noise * std(s)`` fills in. Candidate ``i`` is
kept when ``P(final_i > b) = Phi((s_i - b) / tau) > delta``, where ``b`` is the best score the prompt has now
(this round's partial scores and the final scores of its finished candidates).

The kept set is always a top-``m`` by partial score, never fewer rejected than the budget's minimum, and at least
one row per prompt is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.special import ndtr

from rodeco import BuildContext, PromptView, RoundView, check_number, keep_top, take_params

Horizon = Literal["remaining", "round"]  # remaining: a random walk to the end; round: one round ahead


@dataclass
class AdaptiveParams:
    delta: float = field(
        default=0.05,
        metadata={"help": "keep a row while its chance of finishing above the best exceeds this (lower keeps more)"},
    )
    prior_noise: float = field(
        default=1.0, metadata={"help": "prior per-round noise scale, as a multiple of the std of this round's scores"}
    )
    prior_weight: float = field(
        default=2.0,
        metadata={"help": "pseudo degrees of freedom of the prior (0: data only once two decision points exist)"},
    )
    horizon: Horizon = field(
        default="remaining",
        metadata={"help": "remaining: noise grows with the tokens still to come (random walk); round: one round ahead"},
    )


@dataclass(frozen=True)
class NoiseEstimate:
    """The per-round noise scale of one prompt and the evidence behind it."""

    sigma: float  # per-round scale of relative moves (prior blended with data)
    moves: int  # degrees of freedom contributed by observed moves (0: prior only)


def relative_moves(scores: np.ndarray, history: np.ndarray) -> tuple[float, int]:
    """Sum of squared, per-round centred score moves and their degrees of freedom.

    ``history`` is ``[k, r]`` (nan where absent, right-aligned), ``scores`` is ``[k]``; the trajectory of row ``i``
    is ``history[i]`` followed by ``scores[i]``. Each consecutive pair of decision points contributes the moves of
    the rows present at both, centred on their mean (``n - 1`` degrees of freedom for ``n`` such rows).
    """
    traj = np.column_stack([history, scores]) if history.size else scores[:, None]  # [k, r + 1]
    moves = np.diff(traj, axis=1)  # [k, r]
    ss, dof = 0.0, 0
    for col in moves.T:
        col = col[np.isfinite(col)]
        if col.size >= 2:
            ss += float(np.sum((col - col.mean()) ** 2))
            dof += col.size - 1
    return ss, dof


def estimate_noise(pv: PromptView, prior_noise: float, prior_weight: float) -> NoiseEstimate:
    """Pooled variance of relative moves, shrunk towards ``(prior_noise * std(scores))^2`` with weight
    ``prior_weight`` (pseudo degrees of freedom)."""
    scores = np.asarray(pv.scores, dtype=np.float64)
    ss, dof = relative_moves(scores, np.asarray(pv.history, dtype=np.float64).reshape(pv.k, -1))
    prior_var = (prior_noise * float(np.std(scores))) ** 2
    weight = prior_weight + dof
    var = (prior_weight * prior_var + ss) / weight if weight > 0 else prior_var
    return NoiseEstimate(sigma=math.sqrt(max(var, 0.0)), moves=dof)


def horizon_factor(pv: PromptView, max_new_tokens: int, horizon: Horizon) -> float:
    """How many rounds' worth of moves remain before the end.

    ``round``: one (final ~ the next decision point). ``remaining``: the remaining tokens divided by the mean
    tokens per round so far, as for a random walk whose variance grows with the tokens still to come.
    """
    if horizon == "round":
        return 1.0
    rounds_so_far = pv.history.shape[1] + 1 if pv.history.ndim == 2 else 1
    per_round = pv.tokens_generated / rounds_so_far
    remaining = max(0, max_new_tokens - pv.tokens_generated)
    return remaining / per_round if per_round > 0 else 1.0


def win_probabilities(pv: PromptView, tau: float) -> np.ndarray:
    """``P(s_i + e_i > b)`` for every row, ``b`` the best partial or finished score of the prompt."""
    scores = np.asarray(pv.scores, dtype=np.float64)
    best = max(float(scores.max()), max(pv.finished_scores, default=-math.inf))
    if tau <= 0.0:
        return (scores >= best).astype(np.float64)
    return ndtr((scores - best) / tau)


class AdaptivePolicy:
    """Rejects, per prompt, the candidates whose estimated chance of finishing above the best is at most
    ``delta``; the noise scale is estimated from that prompt's own score history."""

    def __init__(self, delta: float, prior_noise: float, prior_weight: float, horizon: Horizon) -> None:
        self.delta, self.prior_noise, self.prior_weight, self.horizon = delta, prior_noise, prior_weight, horizon

    def tau(self, pv: PromptView, max_new_tokens: int) -> float:
        noise = estimate_noise(pv, self.prior_noise, self.prior_weight)
        return noise.sigma * math.sqrt(horizon_factor(pv, max_new_tokens, self.horizon))

    def keep(self, pv: PromptView, max_new_tokens: int) -> list[int]:
        if pv.k <= 1:
            return list(range(pv.k))
        p = win_probabilities(pv, self.tau(pv, max_new_tokens))
        n_keep = int(np.count_nonzero(p > self.delta))  # p is monotone in the score: the kept set is a top-m
        return keep_top(pv, pv.k - max(1, n_keep))

    def select(self, view: RoundView) -> list[list[int]]:
        return [self.keep(pv, view.max_new_tokens) for pv in view.prompts]


def build_adaptive(params: dict[str, Any], ctx: BuildContext) -> AdaptivePolicy:
    p = take_params("policy", params, AdaptiveParams)
    delta = check_number(
        "policy.delta",
        p["delta"],
        0.0,
        1.0,
        lo_open=True,
        hi_open=True,
        fix="set policy.delta to a small probability such as 0.05 (lower keeps more)",
    )
    prior_noise = check_number(
        "policy.prior_noise",
        p["prior_noise"],
        0.0,
        math.inf,
        hi_open=True,
        fix="set policy.prior_noise >= 0, e.g. 0.5 (a multiple of the spread of the scores)",
    )
    prior_weight = check_number(
        "policy.prior_weight",
        p["prior_weight"],
        0.0,
        math.inf,
        hi_open=True,
        fix="set policy.prior_weight >= 0, e.g. 2 (pseudo-observations of the prior)",
    )
    return AdaptivePolicy(delta, prior_noise, prior_weight, p["horizon"])
