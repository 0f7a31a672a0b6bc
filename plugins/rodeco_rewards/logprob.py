"""``logprob``: how likely the response is under a language model.

``reward.form``: ``mean`` (default) the mean token log-probability; ``perplexity`` minus the perplexity,
``-exp(mean cross-entropy)``, the form Sun et al. (2024) use; ``sum`` the total log-probability.

``reward.model: null`` (default) takes the generator's own log-probs from the decode logits
(``needs_logprobs = True``: no extra forward pass). ``reward.model=<hub name, local dir, .gguf or smollm2>``
scores with a separate causal LM instead, re-tokenizing the text (``rodeco_rewards.lm_scorer``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, get_args

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, check_positive_int, take_params
from rodeco_rewards.lm_scorer import LMScorer

Form = Literal["mean", "perplexity", "sum"]
FORMS: tuple[str, ...] = get_args(Form)
MAX_EXP = 700.0  # exp(700) ~ 1e304: a perplexity beyond it is clipped so that the score stays finite


def aggregate(lps: Sequence[float], form: str, empty_score: float) -> float:
    if not lps:
        return empty_score  # an empty response has no tokens to average
    if form == "sum":
        return float(sum(lps))
    mean = sum(lps) / len(lps)
    return mean if form == "mean" else -math.exp(min(-mean, MAX_EXP))


class LogProbReward:
    needs_logprobs = True

    def __init__(self, empty_score: float = -1e3, form: str = "mean", lm: LMScorer | None = None) -> None:
        if form not in FORMS:
            raise ConfigError("reward.form", form, "unknown form", f"use one of {', '.join(FORMS)}")
        self.empty_score, self.form, self.lm = empty_score, form, lm
        if lm is not None:
            self.needs_logprobs = False  # a separate LM computes its own: the loop need not collect them
        self.cost = RewardCost()
        # what its scores mean beyond its name (a calibration is tied to it): the form, and another LM's name
        lm_name = lm.name if lm is not None else ""
        self.identity = f"form={form}" + (f",model={lm_name}" if lm_name else "")

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        if self.lm is None:
            all_lps: Sequence[Sequence[float]] = [r.logprobs or () for r in requests]
        else:
            before = self.lm.tokens
            all_lps = self.lm.logprobs([r.prompt for r in requests], [r.response for r in requests])
            n = self.lm.tokens - before
            self.cost.tokens += n
            self.cost.flops += 2.0 * self.lm.n_matmul_params * n
        return [aggregate(lps, self.form, self.empty_score) for lps in all_lps]


@dataclass
class LogProbParams:
    form: Form = field(default="mean", metadata={"help": "mean, perplexity (-exp(mean cross-entropy)) or sum"})
    model: Optional[str] = field(
        default=None,
        metadata={"help": "null: the generator's own log-probs; or a causal LM (hub name, local dir, .gguf, smollm2)"},
    )
    empty_score: float = field(default=-1e3, metadata={"help": "the score of an empty response"})
    gguf_file: Optional[str] = None  # with model: the GGUF file inside it
    dtype: str = "auto"  # with model: its dtype (as generator.dtype)
    device: str = "auto"  # with model: its device (auto: the generator's)
    chat_template: bool = True  # with model: render the prompt with its chat template
    batch_tokens: int = 16384  # with model: padded tokens per forward pass


def build_logprob(params: dict[str, Any], ctx: BuildContext) -> LogProbReward:
    p = take_params("reward", params, LogProbParams)
    lm = None
    if p["model"] is not None:
        check_positive_int("reward.batch_tokens", p["batch_tokens"], LogProbParams.batch_tokens)
        lm = _load_lm(p, ctx)
    return LogProbReward(empty_score=float(p["empty_score"]), form=p["form"], lm=lm)


def _load_lm(p: dict[str, Any], ctx: BuildContext) -> LMScorer:
    from rodeco import load_model_and_tokenizer

    device = p["device"]
    if device == "auto" and ctx.generator is not None:
        device = str(ctx.generator.device)
    try:
        lm, tok = load_model_and_tokenizer(str(p["model"]), p["gguf_file"], dtype=str(p["dtype"]), device=str(device))
    except ConfigError as e:  # the loader speaks of generator.*; these values came from reward.*
        raise ConfigError(e.key.replace("generator.", "reward."), e.value, e.problem, e.fix) from e
    name = str(p["model"]) + (f":{p['gguf_file']}" if p["gguf_file"] else "")
    return LMScorer(lm, tok, chat_template=bool(p["chat_template"]), batch_tokens=p["batch_tokens"], name=name)
