"""``verifier``: a reward trained on gold labels (Cobbe et al. 2021: a verifier trained on the generator's own
samples, labelled by the answer checker), one model across tasks.

It reads what the generator already computed for each row, so scoring costs a dot product:

- the final-layer hidden state at the row's last step (``needs_hidden_states``): after reading the response so far
  (a partial row), or the whole response (a finished one, the state that sampled its EOS);
- trace statistics (``STATS``): the mean, lowest and last-16 mean token log-probs (``needs_logprobs``), the mean,
  lowest-group and last-16 token confidences (``needs_top_logprobs``: DeepConf's), and the position (``log(1 + L)``,
  ``L / T``) and whether the response is finished.

The head is linear, one weight vector per length bucket (``rodeco_rewards.learned_heads.Head``), fitted by
``rodeco experiment=verifier_train`` on pools of training problems whose candidates the task's checker labelled, at
prefixes (8, 16, 32, ... tokens) and at the end: a logistic regression of the labels (``pointwise``), or weights
that order a problem's right rows above its wrong ones with offsets calibrated to the rate of right answers
(``pairwise``). A score is the head's log-odds that the response's final answer will
be right: it ranks rows at decision points (``partial_reward=verifier``), picks the winner (``reward=verifier``) and,
as a vote's weight, weighs answers (``winner.rule=weighted``: ``softmax(log-odds / temperature)``). The head's
``features`` (``hidden+stats``, ``stats`` or ``hidden``) say which of them it reads; a ``stats`` head needs no hidden
state (and runs on vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import (
    BuildContext,
    ConfigError,
    RewardCost,
    ScoreRequest,
    group_confidences,
    take_params,
    token_confidence,
)
from rodeco_rewards.learned_heads import ASSETS, Head

STATS = (
    "mean_logprob",
    "min_logprob",
    "tail_logprob",
    "mean_confidence",
    "lowest_group_confidence",
    "tail_confidence",
    "log_length",
    "length_share",
    "finished",
)
FEATURES = ("hidden+stats", "stats", "hidden")
TOP_K = 5  # a token's confidence: -mean of its top-5 log-probs (the confidence reward's default)
WINDOW = 16  # tokens in a group, and in a tail


def trace_stats(
    logprobs: Sequence[float], top: Sequence[Sequence[float]] | None, finished: bool, max_new: int
) -> np.ndarray:
    """[len(STATS)] a response's trace statistics (see the module doc); an empty response's are zeros but its
    position."""
    n = len(logprobs)
    out = np.zeros(len(STATS))
    if n:
        lp = np.asarray(logprobs, dtype=np.float64)
        out[:3] = lp.mean(), lp.min(), lp[-WINDOW:].mean()
        if top:
            c = token_confidence(top, TOP_K)
            out[3:6] = c.mean(), group_confidences(c, WINDOW).min(), c[-WINDOW:].mean()
    out[6:] = np.log1p(n), n / max_new, float(finished)
    return out


def features(requests: Sequence[ScoreRequest], kind: str, max_new: int) -> np.ndarray:
    """[E, F] the features a head of ``kind`` reads, one row per request."""
    cols = []
    if kind != "hidden":
        cols.append(np.stack([trace_stats(r.logprobs or (), r.top_logprobs, not r.partial, max_new) for r in requests]))
    if kind != "stats":
        missing = [r.candidate_id for r in requests if r.hidden_state is None]
        if missing:
            raise ConfigError(
                "reward.head",
                kind,
                "reads the generator's hidden states, which these requests do not carry (the vllm engine, or a pool "
                "recorded without them)",
                "decode with a rodeco engine, replay a pool recorded with experiment_args.hidden_states=true, or "
                "use a stats head",
            )
        cols.insert(0, np.stack([np.asarray(r.hidden_state, dtype=np.float64) for r in requests]))
    return np.concatenate(cols, axis=1)


class Verifier:
    """The ``verifier`` reward: a trained head's log-odds that the response's answer is right."""

    needs_logprobs = True

    def __init__(self, head: Head) -> None:
        self.head, self.identity = head, head.identity
        self.kind = str(head.meta["features"])
        self.max_new = int(head.meta["max_new_tokens"])
        self.needs_hidden_states = self.kind != "stats"
        self.needs_top_logprobs = TOP_K if self.kind != "hidden" else 0
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        if not requests:
            return []
        x = features(requests, self.kind, self.max_new)
        self.cost.calls += 1
        self.cost.flops += 2.0 * self.head.matmul_params * len(requests) + 10.0 * sum(
            len(r.response_ids) for r in requests
        )  # the dot product, and the statistics' few operations a token
        return self.head(x, [len(r.response_ids) for r in requests]).tolist()


@dataclass
class VerifierParams:
    head: Optional[str] = field(
        default=None,
        metadata={"help": "a head's path without its suffix (.npz and .json); null: the committed verifier"},
    )


def head_path(name: str | None) -> Path:
    """A head's stem: a committed asset's name (``verifier``), or a path."""
    if name is None:
        return ASSETS / "verifier"
    p = Path(name)
    return p if p.parent != Path(".") or p.with_suffix(".npz").is_file() else ASSETS / name


def build_verifier(params: dict[str, Any], ctx: BuildContext) -> Verifier:
    p = take_params("reward", params, VerifierParams)
    stem = head_path(p["head"])
    if not stem.with_suffix(".npz").is_file():
        raise ConfigError(
            "reward.head",
            str(p["head"]),
            f"no verifier at {stem}.npz",
            "train one: rodeco experiment=verifier_train (experiment_args.install=true writes the committed one)",
        )
    head = Head.load(stem)
    kind = head.meta.get("features")
    if kind not in FEATURES:
        raise ConfigError("reward.head", str(stem), f"not a verifier head (features={kind!r})", "train one")
    gen = ctx.generator
    trained_on = head.meta.get("generator")
    if gen is not None and trained_on and gen.name != trained_on:
        raise ConfigError(
            "reward.head",
            str(stem),
            f"was trained on {trained_on}'s samples and states, not {gen.name}'s",
            "train a verifier on this generator's pools (rodeco experiment=verifier_train)",
        )
    return Verifier(head)
