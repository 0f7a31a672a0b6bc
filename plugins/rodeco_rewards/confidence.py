"""``confidence``: the generator's own token confidence (DeepConf, Fu et al. 2025, arXiv 2508.15260), a guide that
sees some correctness without training and without a second model.

A token's confidence is the mean negative log-probability of the ``top_k`` most likely tokens at its position,
``C_i = -(1/k) sum_j log P_i(j)``: high where the distribution is peaked (the model is sure), low where it is flat.
``reward.form`` aggregates a response's token confidences:

- ``mean``: their mean over the response (DeepConf's average trace confidence);
- ``lowest_group`` (default): the lowest mean over any ``window`` consecutive tokens (its lowest group
  confidence; the whole response when it is shorter), what DeepConf stops low-confidence traces by online;
- ``tail``: their mean over the last ``tail`` tokens (where the answer is);
- ``bottom``: the mean of the lowest 10% of the sliding-window group confidences.

It scores finished and partial responses alike (a partial one by its tokens so far), so it works as a ``reward``
and as a ``partial_reward``. It reads ``ScoreRequest.top_logprobs`` (``needs_top_logprobs = top_k``): the engines
record them as they sample, and a pool records them at ``experiment_args.top_logprobs``. It is charged its own
arithmetic: about ``top_k + 2`` operations per token scored. The engine's top-k over the vocabulary (one
``topk`` of the step's log-softmax, beside the sampled token's log-prob) is not charged: about 5e4 comparisons a
token against 2.7e8 FLOPs of SmolLM2-135M's forward pass (0.02%).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from rodeco import (
    BuildContext,
    RewardCost,
    ScoreRequest,
    check_positive_int,
    group_confidences,
    take_params,
    token_confidence,
)

Form = Literal["lowest_group", "mean", "tail", "bottom"]
FORMS: tuple[str, ...] = get_args(Form)
BOTTOM = 0.1  # form=bottom: the share of the lowest groups averaged


def aggregate(c: np.ndarray, form: str, window: int, tail: int) -> float:
    if form == "mean":
        return float(c.mean())
    if form == "tail":
        return float(c[-tail:].mean())
    g = group_confidences(c, window)
    if form == "lowest_group":
        return float(g.min())
    low = np.sort(g)[: max(1, int(np.ceil(BOTTOM * len(g))))]
    return float(low.mean())


class ConfidenceReward:
    """A response's token confidence under ``form`` (higher: the generator was surer)."""

    def __init__(
        self, form: str = "lowest_group", top_k: int = 5, window: int = 16, tail: int = 16, empty_score: float = 0.0
    ) -> None:
        self.form, self.k, self.window, self.tail, self.empty_score = form, top_k, window, tail, empty_score
        self.needs_top_logprobs = top_k
        self.identity = f"form={form},k={top_k},window={window},tail={tail}"
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        out = []
        for r in requests:
            top = r.top_logprobs or ()
            if not top:
                out.append(self.empty_score)
                continue
            c = token_confidence(top, self.k)
            self.cost.tokens += len(c)
            self.cost.flops += float(len(c) * (self.k + 2))
            out.append(aggregate(c, self.form, self.window, self.tail))
        return out


@dataclass
class ConfidenceParams:
    form: Form = field(default="lowest_group", metadata={"help": "lowest_group, mean, tail or bottom (10% of groups)"})
    top_k: int = field(default=5, metadata={"help": "k: a token's confidence is -mean of its top-k log-probs"})
    window: int = field(default=16, metadata={"help": "tokens in a group (lowest_group, bottom)"})
    tail: int = field(default=16, metadata={"help": "form=tail: the last tokens averaged"})
    empty_score: float = field(default=0.0, metadata={"help": "the score of an empty response"})


def build_confidence(params: dict[str, Any], ctx: BuildContext) -> ConfidenceReward:
    p = take_params("reward", params, ConfidenceParams)
    for key, example in (("top_k", 5), ("window", 16), ("tail", 16)):
        check_positive_int(f"reward.{key}", p[key], example)
    return ConfidenceReward(p["form"], int(p["top_k"]), int(p["window"]), int(p["tail"]), float(p["empty_score"]))
