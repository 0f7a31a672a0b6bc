"""``correlation``: the rejection rate follows how well partial scores predict the next ones.

Per prompt, Kendall's tau-b (``scipy.stats.kendalltau``) between the previous decision point's partial scores and
this one's, over the candidates present at both. A prompt with fewer than ``min_candidates`` such candidates (or
whose tau is undefined, e.g. all scores tied) uses the tau pooled over the batch's prompts: the mean of their taus
weighted by their number of pairs ``n (n - 1) / 2``. Before two decision points exist (no prompt has a tau), the
rate is the fixed ``alpha``. The mapping (see docs/policies.md) is a clipped linear ramp:

    alpha(tau) = alpha_min + (alpha_max - alpha_min) * clip((tau - tau_low) / (tau_high - tau_low), 0, 1)

so a ranking that holds from one decision point to the next (tau near 1) rejects more, and a ranking that is
reshuffled (tau near 0 or below) rejects less. Each prompt then loses its lowest ``floor(alpha * k)`` rows, never
fewer than the budget's minimum, always keeping one.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from rodeco import BuildContext, ConfigError, PromptView, RoundView, check_number, keep_top, take_params

log = logging.getLogger(__name__)


@dataclass
class CorrelationParams:
    alpha: float = field(default=0.5, metadata={"help": "the rate before two decision points exist"})
    alpha_min: float = field(default=0.1, metadata={"help": "the rate at tau <= tau_low"})
    alpha_max: float = field(default=0.8, metadata={"help": "the rate at tau >= tau_high (linear in between)"})
    tau_low: float = 0.0
    tau_high: float = 0.8
    min_candidates: int = field(
        default=4, metadata={"help": "a prompt needs this many candidates at both decision points to use its own tau"}
    )


@dataclass(frozen=True)
class RankAgreement:
    """Kendall's tau of one prompt between its last two decision points, over ``n`` candidates."""

    tau: float  # nan when undefined (fewer than two candidates, or a constant score vector)
    n: int

    @property
    def pairs(self) -> int:
        return self.n * (self.n - 1) // 2


@dataclass(frozen=True)
class Rate:
    """The rejection rate chosen for one prompt and where its tau came from."""

    alpha: float
    tau: float  # nan when the fallback alpha was used
    source: str  # "prompt", "pooled" or "fallback"


def rank_agreement(pv: PromptView) -> RankAgreement:
    """Kendall's tau-b between the previous decision point's scores and this one's (rows present at both)."""
    hist = np.asarray(pv.history, dtype=np.float64).reshape(pv.k, -1)
    if hist.shape[1] == 0:
        return RankAgreement(math.nan, 0)
    prev, now = hist[:, -1], np.asarray(pv.scores, dtype=np.float64)
    both = np.isfinite(prev) & np.isfinite(now)
    n = int(both.sum())
    if n < 2 or np.ptp(prev[both]) == 0 or np.ptp(now[both]) == 0:
        return RankAgreement(math.nan, n)
    return RankAgreement(float(kendalltau(prev[both], now[both]).statistic), n)


def pooled_tau(agreements: list[RankAgreement]) -> float:
    """Pair-weighted mean tau of the prompts that have one; nan if none does."""
    usable = [a for a in agreements if math.isfinite(a.tau) and a.pairs > 0]
    if not usable:
        return math.nan
    return sum(a.tau * a.pairs for a in usable) / sum(a.pairs for a in usable)


class CorrelationPolicy:
    """Maps each prompt's rank correlation between consecutive decision points to a rejection rate."""

    def __init__(
        self, alpha: float, alpha_min: float, alpha_max: float, tau_low: float, tau_high: float, min_candidates: int
    ) -> None:
        self.alpha, self.alpha_min, self.alpha_max = alpha, alpha_min, alpha_max
        self.tau_low, self.tau_high, self.min_candidates = tau_low, tau_high, min_candidates

    def rate_for_tau(self, tau: float) -> float:
        ramp = min(1.0, max(0.0, (tau - self.tau_low) / (self.tau_high - self.tau_low)))
        return self.alpha_min + (self.alpha_max - self.alpha_min) * ramp

    def rates(self, view: RoundView) -> list[Rate]:
        agreements = [rank_agreement(pv) for pv in view.prompts]
        pooled = pooled_tau(agreements)
        out = []
        for a in agreements:
            if math.isfinite(a.tau) and a.n >= self.min_candidates:
                out.append(Rate(self.rate_for_tau(a.tau), a.tau, "prompt"))
            elif math.isfinite(pooled):
                out.append(Rate(self.rate_for_tau(pooled), pooled, "pooled"))
            else:
                out.append(Rate(self.alpha, math.nan, "fallback"))
        return out

    def select(self, view: RoundView) -> list[list[int]]:
        rates = self.rates(view)
        log.debug("round %d rates: %s", view.round, rates)
        return [keep_top(pv, math.floor(r.alpha * pv.k)) for pv, r in zip(view.prompts, rates)]


def build_correlation(params: dict[str, Any], ctx: BuildContext) -> CorrelationPolicy:
    p = take_params("policy", params, CorrelationParams)
    rate_fix = "rates are fractions of a prompt's rows in [0, 1), e.g. 0.5"
    alpha = check_number("policy.alpha", p["alpha"], 0.0, 1.0, hi_open=True, fix=rate_fix)
    alpha_min = check_number("policy.alpha_min", p["alpha_min"], 0.0, 1.0, hi_open=True, fix=rate_fix)
    alpha_max = check_number("policy.alpha_max", p["alpha_max"], 0.0, 1.0, hi_open=True, fix=rate_fix)
    if alpha_min > alpha_max:
        raise ConfigError(
            "policy.alpha_min",
            alpha_min,
            f"is above policy.alpha_max={alpha_max}",
            "set policy.alpha_min <= policy.alpha_max (high tau must not reject less)",
        )
    tau_low = check_number(
        "policy.tau_low", p["tau_low"], -1.0, 1.0, hi_open=True, fix="set policy.tau_low in [-1, 1), e.g. 0"
    )
    tau_high = check_number(
        "policy.tau_high", p["tau_high"], -1.0, 1.0, lo_open=True, fix="set policy.tau_high in (-1, 1], e.g. 0.8"
    )
    if tau_low >= tau_high:
        raise ConfigError(
            "policy.tau_high",
            tau_high,
            f"must be above policy.tau_low={tau_low}",
            "set e.g. policy.tau_low=0 policy.tau_high=0.8",
        )
    m = p["min_candidates"]  # an integer (CorrelationParams)
    if m < 2:
        raise ConfigError(
            "policy.min_candidates",
            m,
            "must be an integer >= 2",
            "set e.g. policy.min_candidates=4 (prompts with fewer use the pooled tau)",
        )
    return CorrelationPolicy(alpha, alpha_min, alpha_max, tau_low, tau_high, m)
