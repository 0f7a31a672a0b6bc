"""Learned decision-time scorers: heads that predict a candidate's *final* reward from its partial state, to be used
as ``partial_reward`` (they must earn their place against ``same``: see ``rodeco experiment=value_train``).

- ``value_head``: a linear or one-hidden-layer head on the generator's final-layer hidden state at the decision
  point (``needs_hidden_states``) and the position.
- ``text_value``: a linear head on the embedded reward's own features of the partial text (MiniLM embeddings and
  surface statistics) and the position, anchored on the reward's own head: with no training data it *is* ``same``
  (``text_value_anchor``), and training moves it away from that only as far as the data pays for.

Position features: ``log(1 + L)`` and ``L / T`` (``T`` the training pool's ``max_new_tokens``). A head has one set
of weights per length bucket (``edges``: the buckets' inclusive upper bounds, e.g. ``[8, 16, 32, 64]`` for
<=8, 9-16, 17-32, 33-64, 65+); each request is scored on its own, by its length's bucket. A head file (``.npz``:
weights; ``.json``: what it was trained on, what was chosen, and its verdict against ``same``) orders the candidates
of one prompt at one length: only that order matters to a policy. Files written before buckets (one weight vector,
no ``edges``) load as a head with one bucket, and keep their identity.
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
N_POSITION = 2  # the position features at the end of every head's inputs


def bucket_of(lengths: Any, edges: Sequence[int] | np.ndarray) -> np.ndarray:
    """The length bucket of each length: ``edges`` are the inclusive upper bounds of all buckets but the last."""
    return np.searchsorted(np.asarray(edges, dtype=np.int64), np.asarray(lengths, dtype=np.int64), side="left")


def bucket_names(edges: Sequence[int]) -> list[str]:
    """``[8, 16]`` -> ``['<=8', '9-16', '17+']``; no edges: ``['all']``."""
    if not len(edges):
        return ["all"]
    lo = [None, *[e + 1 for e in edges]]
    hi = [*edges, None]
    return [f"<={h}" if a is None else f"{a}+" if h is None else f"{a}-{h}" for a, h in zip(lo, hi)]


@dataclass
class Head:
    """Per length bucket ``k``: ``y = relu(x' W1[k] + b1[k]) w2[k] + b2[k]`` (one hidden layer) or
    ``y = x' w2[k] + b2[k]`` (``W1`` empty), on standardized features ``x' = (x - mean) / std``.

    The arrays carry a leading bucket axis (``w2 [B, F]`` or ``[B, H]``, ``b2 [B]``, ``w1 [B, F, H]`` or
    ``[B, 0, 0]``, ``b1 [B, H]``); arrays without it (one weight vector, as written before buckets) are read as
    one bucket."""

    mean: np.ndarray
    std: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: Any  # [B] (a float: one bucket)
    meta: dict[str, Any]
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [B - 1]

    def __post_init__(self) -> None:
        self.w2 = np.atleast_2d(np.asarray(self.w2, dtype=np.float64))
        n = len(self.w2)
        self.b2 = np.asarray(self.b2, dtype=np.float64).reshape(n)
        w1, b1 = np.asarray(self.w1, dtype=np.float64), np.asarray(self.b1, dtype=np.float64)
        self.w1 = w1[None] if w1.ndim == 2 else w1
        self.b1 = b1[None] if b1.ndim == 1 else b1
        self.edges = np.asarray(self.edges, dtype=np.int64).reshape(-1)
        if len(self.edges) != n - 1 or len(self.w1) != n or len(self.b1) != n:
            raise ValueError(
                f"a head with {n} buckets needs {n - 1} edges and {n} of w1, b1 "
                f"(got {len(self.edges)}, {len(self.w1)}, {len(self.b1)})"
            )

    @classmethod
    def linear(
        cls, mean: np.ndarray, std: np.ndarray, w: np.ndarray, b: Any, meta: dict[str, Any], edges: Sequence[int] = ()
    ) -> Head:
        """A linear head: ``w [B, F]`` (or ``[F]``), ``b [B]`` (or a float)."""
        n = len(np.atleast_2d(w))
        return cls(mean, std, np.zeros((n, 0, 0)), np.zeros((n, 0)), w, b, meta, np.asarray(edges, dtype=np.int64))

    @property
    def buckets(self) -> int:
        return len(self.w2)

    def __call__(self, x: np.ndarray, lengths: Any = None) -> Any:
        """Scores of rows ``x [E, F]`` (a float for one row ``[F]``) at decision lengths ``lengths [E]`` (needed
        only when the head has more than one bucket)."""
        x = np.asarray(x, dtype=np.float64)
        X = np.atleast_2d(x)
        if lengths is None:
            if self.buckets > 1:
                raise ValueError(f"a head with {self.buckets} length buckets needs the lengths")
            k = np.zeros(len(X), dtype=np.int64)
        else:
            k = bucket_of(np.atleast_1d(lengths), self.edges)
        Z = (X - self.mean) / self.std
        out = np.empty(len(X))
        for b in np.unique(k):
            m = k == b
            z = np.maximum(Z[m] @ self.w1[b] + self.b1[b], 0.0) if self.w1[b].size else Z[m]
            out[m] = z @ self.w2[b] + self.b2[b]
        return float(out[0]) if x.ndim == 1 else out

    @property
    def matmul_params(self) -> int:
        """Multiply-adds of one request (one bucket's weights)."""
        return int(self.w1[0].size + self.w2[0].size)

    @property
    def identity(self) -> str:
        h = hashlib.sha256()
        for a in (self.mean, self.std, self.w1, self.b1, self.w2, self.b2):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        if self.edges.size:  # a one-bucket head hashes as before buckets existed
            h.update(np.ascontiguousarray(self.edges, dtype=np.int64).tobytes())
        return h.hexdigest()[:16]

    def save(self, stem: Path) -> None:
        atomic_write(
            stem.with_suffix(".npz"),
            npz_bytes(mean=self.mean, std=self.std, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2, edges=self.edges),
        )
        atomic_write(stem.with_suffix(".json"), json.dumps({**self.meta, "identity": self.identity}, indent=1) + "\n")

    @classmethod
    def load(cls, stem: Path, key: str = "reward.head") -> Head:
        if not stem.with_suffix(".npz").is_file() or not stem.with_suffix(".json").is_file():
            raise ConfigError(
                key,
                str(stem),
                "no head there (.npz and .json)",
                "train one: rodeco experiment=value_train pool=TRAINING_POOL",
            )
        d = np.load(stem.with_suffix(".npz"))
        meta = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
        edges = d["edges"] if "edges" in d.files else np.zeros(0, dtype=np.int64)  # before buckets: one bucket
        return cls(d["mean"], d["std"], d["w1"], d["b1"], d["w2"], d["b2"], meta, edges)


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=True, **arrays)  # numpy's default, named: **arrays cannot then be read as it
    return buf.getvalue()


def position_features(lengths: Sequence[int] | np.ndarray, max_new: int) -> np.ndarray:
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
            raise ConfigError(
                "partial_reward",
                "value_head",
                "a request carries no hidden state (a pool recorded without them, or the vllm engine)",
                "replay a pool recorded with experiment_args.hidden_states=true, or decode with a rodeco engine",
            )
        h = np.stack([np.asarray(r.hidden_state, dtype=np.float64) for r in requests])
        lengths = [len(r.response_ids) for r in requests]
        x = np.concatenate([h, position_features(lengths, self.max_new)], axis=1)
        self.cost.calls += 1
        self.cost.flops += 2.0 * self.head.matmul_params * len(requests)
        return self.head(x, lengths).tolist()


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
        return self.head(x, [len(r.response_ids) for r in requests]).tolist()


def text_value_anchor(rm_head, max_new: int) -> Head:
    """``text_value`` with no training data: the embedded reward's own linear head (``BTHead``) as a one-bucket head
    on ``text_value``'s inputs (weight 0 on the position features), so that it scores exactly as ``same`` does
    (``minilm_rm``'s partial score). Training fits ``w = a * w_rm + delta`` around it."""
    from rodeco_rewards.minilm.head import head_identity

    if rm_head.shape.hidden:
        raise ConfigError(
            "reward.head",
            f"hidden={rm_head.shape.hidden}",
            "text_value anchors on a linear reward head, this one has a hidden layer",
            "use the committed minilm_rm head (hidden 0)",
        )
    w = rm_head.first_layer.weight.detach().double().numpy()[0]
    b = float(rm_head.first_layer.bias.detach().double().numpy()[0])
    pad = np.zeros(N_POSITION)
    mean = np.concatenate([rm_head.mu.double().numpy(), pad])
    std = np.concatenate([rm_head.sigma.double().numpy(), pad + 1.0])
    return Head.linear(
        mean,
        std,
        np.concatenate([w, pad]),
        b,
        {"kind": "text_value", "max_new_tokens": max_new, "anchor": f"minilm_rm:{head_identity(rm_head)}"},
    )


def text_features(encoder, requests: Sequence[ScoreRequest], max_new: int) -> np.ndarray:
    """``text_value``'s inputs: the embedded reward's features of each (prompt, partial response), and the position."""
    from rodeco_rewards.minilm.reward import features

    x = features(encoder, [r.prompt for r in requests], [r.response for r in requests])
    return np.concatenate(
        [x.astype(np.float64), position_features([len(r.response_ids) for r in requests], max_new)], axis=1
    )


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
    head: Optional[str] = field(
        default=None,
        metadata={"help": "null: the committed head (rodeco experiment=value_train); or a path to another"},
    )


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
