"""``arith_gold``: gold correctness on the seeded arithmetic problems of ``scripts/arith_bench.py`` ("What is 23 + 7?
Answer with the number."): 1.0 when the response's last number is the answer, else 0.0.

The problem is read from the prompt (``a + b``, ``a - b`` or ``a * b`` with integers) and solved exactly, so no
model is involved and nothing the search optimised can fool it, except in what it does not look at: it reads the
last number only, so a response that states the right number and then another (a check, a list index) counts as
wrong, and one that ends on the right number after wrong reasoning counts as right. A prompt that is not such a
problem is an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, WinnerRule, take_params

NODE = "judge.arith_gold"
PROBLEM = re.compile(r"(?<![\d.])(-?\d+)\s*([-+*])\s*(-?\d+)(?![\d.])")
SHOWN = 60  # characters of a prompt an error shows
LAST_NUMBER = WinnerRule(extractor="last_number").extract  # the extractor winner.extractor=last_number uses


def answer_of(prompt: str) -> int:
    """The exact answer of the one arithmetic problem ``a op b`` in ``prompt``; otherwise a ``ConfigError``."""
    found = PROBLEM.findall(prompt)
    if len(found) != 1:
        shown = " ".join(prompt.split())
        shown = shown if len(shown) <= SHOWN else shown[:SHOWN] + "..."
        problem = "no arithmetic problem" if not found else f"{len(found)} arithmetic problems, not one"
        raise ConfigError(
            NODE,
            shown,
            f"{problem} (a + b, a - b or a * b with integers) in this prompt",
            "use arith_gold only on the problems of scripts/arith_bench.py ('What is 23 + 7? Answer "
            "with the number.'); judge other prompts with another reward",
        )
    a, op, b = found[0]
    x, y = int(a), int(b)
    return x + y if op == "+" else x - y if op == "-" else x * y


def is_correct(prompt: str, response: str) -> bool:
    """The response's last number (as ``winner.extractor=last_number`` reads it; thousands separators and ``.0``
    allowed) equals the prompt's answer."""
    answer = answer_of(prompt)
    num = LAST_NUMBER(response)
    if num is None:
        return False
    try:
        return float(num.replace(",", "")) == answer
    except ValueError:
        return False


class ArithGold:
    """1.0 for a correct response, 0.0 otherwise; partial responses are scored the same way."""

    identity = "last_number==exact answer of a op b"

    def __init__(self) -> None:
        self.cost = RewardCost()  # no model: calls only

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        return [1.0 if is_correct(r.prompt, r.response) else 0.0 for r in requests]


@dataclass
class ArithGoldParams:
    """No parameters: any key is an error naming it."""


def build_arith_gold(params: dict[str, Any], ctx: BuildContext) -> ArithGold:
    take_params(NODE, params, ArithGoldParams)
    return ArithGold()
