"""``none`` (Best-of-N) and ``fixed`` (the Speculative Rejection rule of Sun et al. 2024)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rodeco import BuildContext, PolicyInfo, RoundView, check_number, keep_top, take_params


@dataclass
class NoneParams:
    """``policy=none`` takes no parameters."""


@dataclass
class FixedParams:
    alpha: float = field(
        default=0.5,
        metadata={
            "help": "the share of each prompt's rows rejected at a decision "
            "point, in [0, 1) (0: only what the budget forces)"
        },
    )


class NonePolicy:
    """Best-of-N: keeps every row. Fails (with a fix) if the budget forces a rejection."""

    info = PolicyInfo(rejects=False)

    def select(self, view: RoundView) -> list[list[int]]:
        return [list(range(pv.k)) for pv in view.prompts]


class FixedPolicy:
    """Per prompt, rank the partial scores and reject the lowest ``floor(alpha * k)`` rows, never fewer than the
    budget's minimum for that prompt, always keeping one."""

    def __init__(self, alpha: float) -> None:
        self.alpha = check_number(
            "policy.alpha",
            alpha,
            0.0,
            1.0,
            hi_open=True,
            fix="set policy.alpha to e.g. 0.5 (0 rejects only what the budget forces)",
        )

    def select(self, view: RoundView) -> list[list[int]]:
        return [keep_top(pv, math.floor(self.alpha * pv.k)) for pv in view.prompts]


def build_none(params: dict[str, Any], ctx: BuildContext) -> NonePolicy:
    take_params("policy", params, NoneParams)
    return NonePolicy()


def build_fixed(params: dict[str, Any], ctx: BuildContext) -> FixedPolicy:
    p = take_params("policy", params, FixedParams)
    return FixedPolicy(p["alpha"])
