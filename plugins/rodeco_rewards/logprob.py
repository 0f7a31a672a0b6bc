"""``logprob``: mean token log-probability of the response under the generator.

Taken from the decode logits (``needs_logprobs = True``), so it costs no extra forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rodeco.params import take_params
from rodeco.protocols import BuildContext, RewardCost
from rodeco.state import ScoreRequest


class LogProbReward:
    needs_logprobs = True

    def __init__(self, empty_score: float = -1e3) -> None:
        self.empty_score = empty_score  # an empty response has no tokens to average
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        out = []
        for r in requests:
            lps = r.logprobs or ()
            out.append(sum(lps) / len(lps) if lps else self.empty_score)
        return out


def build_logprob(params: dict[str, Any], ctx: BuildContext) -> LogProbReward:
    p = take_params("reward", params, {"empty_score": -1e3})
    return LogProbReward(empty_score=float(p["empty_score"]))
