"""Learned decision-time scorers: heads that predict a candidate's *final* reward from its partial state, to be used
as ``partial_reward`` (they must earn their place against ``same``: see ``rodeco experiment=value_train``).

- ``value_head``: a linear or one-hidden-layer head on the generator's final-layer hidden state at the decision
  point (``needs_hidden_states``) and the position.
- ``text_value``: the same kind of head on the embedded reward's own features of the partial text (MiniLM
  embeddings and surface statistics) and the position.

Position features: ``log(1 + L)`` and ``L / T`` (``T`` the training pool's ``max_new_tokens``). A head file
(``.npz``: weights; ``.json``: what it was trained on and how it did on validation prompts) predicts the final
reward standardized within the prompt: only the ranking within a prompt matters to a policy.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, atomic_write, take_params

ASSETS = Path(__file__).parent / "assets"
KINDS = ("value_head", "text_value")


@dataclass
class Head:
    """``y = relu(x' W1 + b1) w2 + b2`` (one hidden layer) or ``y = x' w + b`` (``W1`` empty), on standardized
    features ``x' = (x - mean) / std``."""

    mean: np.ndarray
    std: np.ndarray
    w1: np.ndarray  # [F, H] or [0, 0] for a linear head
    b1: np.ndarray
    w2: np.ndarray  # [H] or [F]
    b2: float
    meta: dict[str, Any]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mean) / self.std
        if self.w1.size:
            z = np.maximum(z @ self.w1 + self.b1, 0.0)
        return z @ self.w2 + self.b2

    @property
    def matmul_params(self) -> int:
        return int(self.w1.size + self.w2.size)

    @property
    def identity(self) -> str:
        h = hashlib.sha256()
        for a in (self.mean, self.std, self.w1, self.b1, self.w2, np.asarray([self.b2])):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return h.hexdigest()[:16]

    def save(self, stem: Path) -> None:
        atomic_write(stem.with_suffix(".npz"), npz_bytes(mean=self.mean, std=self.std, w1=self.w1, b1=self.b1,
                                                         w2=self.w2, b2=np.asarray(self.b2)))
        atomic_write(stem.with_suffix(".json"), json.dumps({**self.meta, "identity": self.identity}, indent=1) + "\n")

    @classmethod
    def load(cls, stem: Path, key: str = "reward.head") -> Head:
        if not stem.with_suffix(".npz").is_file() or not stem.with_suffix(".json").is_file():
            raise ConfigError(key, str(stem), "no head there (.npz and .json)",
                              "train one: rodeco experiment=value_train pool=TRAINING_POOL")
        d = np.load(stem.with_suffix(".npz"))
        meta = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
        return cls(d["mean"], d["std"], d["w1"], d["b1"], d["w2"], float(d["b2"]), meta)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def position_features(lengths: np.ndarray, max_new: int) -> np.ndarray:
    L = np.asarray(lengths, dtype=np.float64)
    return np.stack([np.log1p(L), L / max_new], axis=1)


class ValueHead:
    """``value_head``: the head on the generator's hidden state at the decision point and the position."""

    needs_hidden_states = True

    def __init__(self, head: Head) -> None:
        self.head, self.identity = head, head.identity
        self.max_new = int(head.meta["max_new_tokens"])
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        if any(r.hidden_state is None for r in requests):
            raise ConfigError("partial_reward", "value_head", "a request carries no hidden state (a finished "
                              "response, or a pool recorded without them)", "use it as partial_reward only")
        h = np.stack([np.asarray(r.hidden_state, dtype=np.float64) for r in requests])
        x = np.concatenate([h, position_features([len(r.response_ids) for r in requests], self.max_new)], axis=1)
        self.cost.calls += 1
        self.cost.flops += 2.0 * self.head.matmul_params * len(requests)
        return self.head(x).tolist()


class TextValue:
    """``text_value``: the head on the embedded reward's features of the partial text and the position."""

    def __init__(self, head: Head, encoder) -> None:
        self.head, self.encoder, self.identity = head, encoder, head.identity
        self.max_new = int(head.meta["max_new_tokens"])
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        if not requests:
            return []
        before = self.encoder.tokens
        x = text_features(self.encoder, requests, self.max_new)
        n = self.encoder.tokens - before
        self.cost.tokens += n
        self.cost.flops += 2.0 * self.encoder.n_matmul_params * n
        self.cost.calls += 1
        return self.head(x).tolist()


def text_features(encoder, requests: Sequence[ScoreRequest], max_new: int) -> np.ndarray:
    """``text_value``'s inputs: the embedded reward's features of each (prompt, partial response), and the position."""
    from rodeco_rewards.minilm.reward import features

    x = features(encoder, [r.prompt for r in requests], [r.response for r in requests])
    return np.concatenate([x.astype(np.float64),
                           position_features([len(r.response_ids) for r in requests], max_new)], axis=1)


def minilm_encoder(device: str = "cpu"):
    """The embedded reward's encoder, with the committed head's ``max_length``."""
    from rodeco_rewards.minilm.encoder import SentenceEncoder, minilm_dir
    from rodeco_rewards.minilm.head import load_head
    from rodeco_rewards.minilm.reward import ASSET_STEM

    _, meta = load_head(ASSET_STEM)
    return SentenceEncoder(minilm_dir(), max_length=int(meta["max_length"]), device=device)


def _head_stem(kind: str, given: Any) -> Path:
    if given is None:
        return ASSETS / kind
    p = Path(str(given)).expanduser()
    return p.with_suffix("") if p.suffix in (".npz", ".json") else p


@dataclass
class HeadParams:
    head: Optional[str] = field(default=None, metadata={"help": "null: the committed head (rodeco "
                                                                 "experiment=value_train); or a path to another"})


def build_value_head(params: dict[str, Any], ctx: BuildContext) -> ValueHead:
    p = take_params("reward", params, HeadParams)
    return ValueHead(Head.load(_head_stem("value_head", p["head"])))


def build_text_value(params: dict[str, Any], ctx: BuildContext) -> TextValue:
    p = take_params("reward", params, HeadParams)
    return TextValue(Head.load(_head_stem("text_value", p["head"])), minilm_encoder())


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    d = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b / d) if d > 0 else float("nan")
