"""``deepconf``: DeepConf's online mode (Fu et al. 2025, arXiv 2508.15260) as a policy of the loop.

A trace's *lowest group confidence* is the lowest mean, over any ``window`` consecutive tokens, of its tokens'
confidences (``-mean`` of the ``top_k`` most likely tokens' log-probs: ``rodeco.lowest_group_confidence``). The
policy reads every row's top-k log-probs (``PolicyInfo.top_logprobs``: the engine records them as it samples) and
adds its own decision points every ``decision_tokens`` tokens, so it runs under ``budget=unlimited`` as under a
memory budget:

- at a prompt's first decision point (the paper's warm-up), the threshold is the ``percentile``-th percentile of
  its rows' lowest group confidences so far, and every row goes on;
- at every later one, a row whose lowest group confidence has fallen below the threshold stops (it is rejected and
  does not vote), as the paper stops a trace the moment a group falls below it;
- the winner is the confidence-weighted vote over the finished traces' answers (``winner.rule=weighted``,
  ``winner.weight=confidence``), whatever ``winner.rule`` says; the extractor is the run's ``winner.extractor``.

A budget's forced rejections take the least confident rows. ``percentile: 10`` is the paper's DeepConf-high (it
keeps about 90% of the traces), ``90`` its DeepConf-low. Combined with ``winner.stop`` it is the paper's adaptive
sampling, which stops once the vote is settled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rodeco import (
    BuildContext,
    PolicyInfo,
    PromptView,
    RoundView,
    check_number,
    check_positive_int,
    lowest_group_confidence,
    take_params,
)


@dataclass
class DeepConfParams:
    decision_tokens: int = field(default=16, metadata={"help": "a decision point every this many tokens"})
    percentile: float = field(
        default=10.0,
        metadata={"help": "the threshold: this percentile of the rows' lowest group confidence at the first decision"},
    )
    top_k: int = field(default=5, metadata={"help": "a token's confidence is -mean of its top-k log-probs"})
    window: int = field(default=16, metadata={"help": "tokens in a group"})


class DeepConfPolicy:
    """Stops rows whose lowest group confidence falls below a threshold set at each prompt's first decision point
    (see the module doc)."""

    def __init__(self, decision_tokens: int = 16, percentile: float = 10.0, top_k: int = 5, window: int = 16) -> None:
        self.percentile, self.top_k, self.window = percentile, top_k, window
        self.info = PolicyInfo(
            decision_tokens=decision_tokens,
            top_logprobs=top_k,
            winner={"rule": "weighted", "weight": "confidence", "top_k": top_k, "window": window},
        )
        # by prompt index: (threshold, the round it was set at), set at its cohort's first decision point
        self.threshold: dict[int, tuple[float, int]] = {}

    def confidences(self, pv: PromptView) -> np.ndarray:
        """[k] each row's lowest group confidence so far."""
        assert pv.top_logprobs is not None  # PolicyInfo.top_logprobs asks the loop for them
        return np.array([lowest_group_confidence(t, self.top_k, self.window) for t in pv.top_logprobs])

    def select(self, view: RoundView) -> list[list[int]]:
        out = []
        for pv in view.prompts:
            conf = self.confidences(pv)
            known = self.threshold.get(pv.prompt_index)
            if view.round == 0 or known is None or known[1] == view.round:  # the warm-up (asked again: the same)
                self.threshold[pv.prompt_index] = (float(np.percentile(conf, self.percentile)), view.round)
                low = np.zeros(pv.k, dtype=bool)  # every row goes on
            else:
                low = conf < known[0]
            order = np.argsort(-conf, kind="stable")  # most confident first
            n_reject = max(int(low.sum()), pv.min_reject)
            if not pv.finished_scores:
                n_reject = min(n_reject, pv.k - 1)  # a prompt with no finished trace keeps its most confident row
            out.append(sorted(order[: pv.k - n_reject].tolist()))
        return out


def build_deepconf(params: dict[str, Any], ctx: BuildContext) -> DeepConfPolicy:
    p = take_params("policy", params, DeepConfParams)
    for key, example in (("decision_tokens", 16), ("top_k", 5), ("window", 16)):
        check_positive_int(f"policy.{key}", p[key], example)
    pct = check_number("policy.percentile", p["percentile"], 0.0, 100.0, fix="set policy.percentile, e.g. 10")
    return DeepConfPolicy(int(p["decision_tokens"]), float(pct), int(p["top_k"]), int(p["window"]))
