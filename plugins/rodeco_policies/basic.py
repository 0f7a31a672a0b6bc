"""``none`` (Best-of-N) and ``fixed`` (the Speculative Rejection rule of Sun et al. 2024)."""

from __future__ import annotations

import math
from typing import Any

from rodeco import BuildContext, ConfigError, RoundView, keep_top, take_params


class NonePolicy:
    """Best-of-N: keeps every row. Fails (with a fix) if the budget forces a rejection."""

    def select(self, view: RoundView) -> list[list[int]]:
        return [list(range(pv.k)) for pv in view.prompts]


class FixedPolicy:
    """Per prompt, rank the partial scores and reject the lowest ``floor(alpha * k)`` rows, never fewer than the
    budget's minimum for that prompt, always keeping one."""

    def __init__(self, alpha: float) -> None:
        if not (isinstance(alpha, (int, float)) and 0.0 <= alpha < 1.0) or math.isnan(alpha):
            raise ConfigError("policy.alpha", alpha, "the rejection rate must be in [0, 1)",
                              "set policy.alpha to e.g. 0.5 (0 rejects only what the budget forces)")
        self.alpha = float(alpha)

    def select(self, view: RoundView) -> list[list[int]]:
        return [keep_top(pv, math.floor(self.alpha * pv.k)) for pv in view.prompts]


def build_none(params: dict[str, Any], ctx: BuildContext) -> NonePolicy:
    take_params("policy", params, {})
    return NonePolicy()


def build_fixed(params: dict[str, Any], ctx: BuildContext) -> FixedPolicy:
    p = take_params("policy", params, {"alpha": 0.5})
    return FixedPolicy(p["alpha"])
