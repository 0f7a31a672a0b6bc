"""``example_length``: how close the response's word count is to ``target_words`` (a text-only reward)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rodeco import BuildContext, ConfigError, ScoreRequest, take_params


class LengthReward:
    """Final: ``-|words - target| / target``. Partial: only overshooting is penalized, since a partial response
    may still grow to the target."""

    def __init__(self, target_words: int) -> None:
        self.target_words = target_words

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        out = []
        for r in requests:
            words = len(r.response.split())
            miss = max(0, words - self.target_words) if r.partial else abs(words - self.target_words)
            out.append(-miss / self.target_words)
        return out


def build_length(params: dict[str, Any], ctx: BuildContext) -> LengthReward:
    p = take_params("reward", params, {"target_words": 12})
    t = p["target_words"]
    if not (isinstance(t, int) and not isinstance(t, bool) and t >= 1):
        raise ConfigError("reward.target_words", t, "must be a positive integer", "set e.g. reward.target_words=12")
    return LengthReward(t)
