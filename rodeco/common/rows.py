"""Which prompt, candidate and random stream each active row of a session is, in batch order: the bookkeeping every
session shares (``rodeco.core.session.TorchSession``, which replays a pool's rows too, and
``rodeco.engines.vllm_session.VLLMSession``), with the two things each needs of it: reordering (selections and
copies) and a leaving row's response (the EOS token is not part of it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rodeco.common.state import Row, fork_order


def _ids() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class RowBook:
    """Per active row, in batch order: ``prompt_of`` its prompt's position in the batch (the batch key), ``cand``
    its candidate id, ``stream`` its random stream within its prompt (``rodeco.common.sampling.copy_stream`` for
    a copy's)."""

    prompt_of: np.ndarray = field(default_factory=_ids)
    cand: np.ndarray = field(default_factory=_ids)
    stream: np.ndarray = field(default_factory=_ids)

    def __len__(self) -> int:
        return len(self.prompt_of)

    def fan_out(self, prompts: int, n: int, first: int) -> None:
        """``n`` rows per prompt, prompt by prompt: candidates (and streams) ``first .. first + n - 1``."""
        self.prompt_of = np.repeat(np.arange(prompts), n)
        self.cand = np.tile(np.arange(n), prompts) + first
        self.stream = self.cand.copy()

    def admit(self, first_prompt: int, n: list[int], first: list[int]) -> None:
        """Rows of prompts joining the batch, after the rows there are: prompt ``first_prompt + j`` gets ``n[j]`` rows,
        candidates (and streams) ``first[j] .. first[j] + n[j] - 1``."""
        prompts = np.repeat(np.arange(first_prompt, first_prompt + len(n)), n)
        cands = np.concatenate([np.arange(k) + f for k, f in zip(n, first)]) if n else _ids()
        self.prompt_of = np.concatenate([self.prompt_of, prompts]).astype(np.int64)
        self.cand = np.concatenate([self.cand, cands]).astype(np.int64)
        self.stream = np.concatenate([self.stream, cands]).astype(np.int64)

    def take(self, order: Sequence[int] | np.ndarray) -> None:
        """Keep the rows ``order`` names (batch indices of the rows before), in that order; a repeat copies a row."""
        idx = np.asarray(order, dtype=np.int64)
        self.prompt_of, self.cand, self.stream = self.prompt_of[idx], self.cand[idx], self.stream[idx]

    def fork(self, parents: list[int], ids: list[int], streams: list[int]) -> tuple[list[int], list[int]]:
        """Copy ``j`` of row ``parents[j]`` becomes candidate ``ids[j]`` on stream ``streams[j]``, right after its
        parent (rows stay grouped by prompt). Returns (the new batch as batch indices of the old one, each copy's new
        batch index), for the session to reorder what it holds per row the same way."""
        order, slots = fork_order(len(self), parents)
        self.take(order)
        self.cand[slots], self.stream[slots] = ids, streams
        return order, slots

    def leaving(
        self,
        i: int,
        ids: list[int],
        logprobs: list[float] | None,
        reason: str,
        eos_ids: Any = (),
        top: list[list[float]] | None = None,
    ) -> Row:
        """Row ``i`` as it leaves the batch with its tokens ``ids`` (and their log-probs, and the top-k log-probs at
        each position), for ``reason``; a response that ended by EOS (``reason == "eos"`` and its last token one of
        ``eos_ids``) leaves without that token, which is kept as the row's ``stop``."""
        stop = None
        if reason == "eos" and ids and ids[-1] in eos_ids:
            stop, ids = ids[-1], ids[:-1]
            logprobs = logprobs[:-1] if logprobs is not None else None
            top = top[:-1] if top is not None else None
        return Row(
            int(self.prompt_of[i]),
            int(self.cand[i]),
            list(ids),
            logprobs,
            reason,
            stop,
            stream=int(self.stream[i]),
            top_logprobs=top,
        )


class BookColumn:
    """A session attribute (``prompt_of``, ``cand``, ``stream``) that is its ``book``'s array of the same name, so
    that readers of ``rodeco.common.protocols.Session`` see the session's rows as the book keeps them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> np.ndarray:
        return getattr(obj.book, self.name)

    def __set__(self, obj: Any, value: np.ndarray) -> None:
        setattr(obj.book, self.name, np.asarray(value, dtype=np.int64))
