"""Engines without a model: the cache bookkeeping of ``hf``, ``fast`` and ``vllm`` (rows, cached length, slots
allocated), for sessions that replay recorded tokens (``rodeco.replay``). They take the same calls as the real
engines and return placeholder logits, so a replayed run's peak KV memory and FLOPs are counted by the same code as
a live run's. ``tests/test_replay.py`` checks them call for call against the real engines."""

from __future__ import annotations

import numpy as np
import torch

from rodeco.budget import block_shared


def _token_by_token(layout: object, block: int) -> None:
    """rodeco's own engines allocate token by token: a pool of theirs records no block, or block 1."""
    if block != 1:
        raise ValueError(f"{type(layout).__name__} allocates token by token, not in blocks of {block}")


class HFLayout:
    """``HFEngine``: every row holds the prompt and its own tokens; the cache grows by one slot per step."""

    shares_prefix = False
    compact_fraction = 0.25  # finished rows leave the batch once they are this share of it (rodeco.session)
    keep_hidden, last_hidden = False, None  # no model, no hidden states (a replay reads the pool's)

    def __init__(self, block: int) -> None:
        _token_by_token(self, block)
        self.rows, self.length = 0, 0

    @property
    def allocated_tokens(self) -> int:
        return self.rows * self.length

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.rows, self.length = ids.shape
        return torch.zeros(self.rows, 1)

    def select(self, rows: torch.Tensor) -> None:
        self.rows = int(rows.shape[0])

    def reserve(self, capacity: int) -> None:
        pass

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a replay's layout does not admit prompts into a running batch")

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += 1
        return torch.zeros(self.rows, 1)


class FastLayout:
    """``FastLlamaEngine``: each prompt's cache stored once, the rows' own tokens in a buffer of ``capacity - plen``
    slots per row, reallocated when a round reserves, when the batch shrinks, and when a step would overflow."""

    shares_prefix = True
    compact_fraction = 0.25
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int) -> None:
        _token_by_token(self, block)
        self.plen = self.sfx = self.own = self.prefixes = 0  # own: the buffer's slots per row
        self.grp = np.zeros(0, dtype=np.int64)  # the prefix of each allocated row
        self.pending: np.ndarray | None = None  # a selection not applied yet

    @property
    def rows(self) -> int:
        return len(self.grp) if self.pending is None else len(self.pending)

    @property
    def length(self) -> int:
        return self.plen + self.sfx

    @property
    def capacity(self) -> int:
        return self.plen + self.own

    @property
    def allocated_tokens(self) -> int:
        return self.prefixes * self.plen + self.rows * self.own

    def _realloc(self, capacity: int) -> None:
        rows = self.pending if self.pending is not None else np.arange(len(self.grp))
        self.own = max(capacity - self.plen, self.sfx)
        self.grp, self.pending = self.grp[rows], None
        live = np.unique(self.grp)
        if len(live) < self.prefixes:  # prompts with no row left free their prefix
            self.prefixes, self.grp = len(live), np.searchsorted(live, self.grp)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        G, L = ids.shape
        self.plen, self.sfx, self.own, self.prefixes = L, 0, 0, G
        self.grp, self.pending = np.arange(G), None
        return torch.zeros(G, 1)

    def select(self, rows: torch.Tensor) -> None:
        r = rows.cpu().numpy()
        self.pending = r if self.pending is None else self.pending[r]
        if len(self.pending) < len(self.grp):  # shrinking: the real engine frees memory now
            self._realloc(self.capacity)

    def reserve(self, capacity: int) -> None:
        if self.pending is not None or capacity != self.capacity:
            self._realloc(capacity)

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a replay's layout does not admit prompts into a running batch")

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.pending is not None or self.length >= self.capacity:
            self._realloc(max(self.capacity, self.length + 1))
        self.sfx += 1
        return torch.zeros(self.rows, 1)


class VLLMLayout:
    """vLLM (``rodeco.engines.vllm``): blocks of ``block`` tokens; each prompt's full blocks before its last token
    stored once while any of its rows lives, each row holding the rest of its prompt and its own tokens in whole
    blocks (``rodeco.budget.block_shared``). A finished row leaves at once (``compact_fraction`` 0). An upper bound
    of vLLM's count: it also counts the row's latest token, whose keys vLLM stores only at the next step."""

    shares_prefix = True
    compact_fraction = 0.0
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int) -> None:
        self.block, self.plen, self.own = block, 0, 0  # own: tokens each row generated into the cache
        self.tail = np.zeros(0, dtype=np.int64)  # per row: the prompt tokens it holds itself
        self.full = np.zeros(0, dtype=np.int64)  # per row: its prompt's shared tokens
        self.grp = np.zeros(0, dtype=np.int64)  # per row: its prompt

    @property
    def rows(self) -> int:
        return len(self.grp)

    @property
    def length(self) -> int:
        return self.plen + self.own

    @property
    def allocated_tokens(self) -> int:
        live = np.unique(self.grp)
        shared = int(sum(self.full[self.grp == g][0] for g in live))
        own = -(-(self.tail + self.own) // self.block) * self.block
        return shared + int(own.sum())

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lens = mask.sum(-1).cpu().numpy().astype(np.int64)
        self.full = block_shared(lens, self.block)
        self.tail = lens - self.full
        self.grp, self.plen, self.own = np.arange(len(lens)), int(lens.max()), 0
        return torch.zeros(len(lens), 1)

    def select(self, rows: torch.Tensor) -> None:
        r = rows.cpu().numpy()
        self.grp, self.tail, self.full = self.grp[r], self.tail[r], self.full[r]

    def reserve(self, capacity: int) -> None:
        pass

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("a replay's layout does not admit prompts into a running batch")

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.own += 1
        return torch.zeros(self.rows, 1)


# by the engine's id (``EngineInfo.name``)
LAYOUTS: dict[str, type[HFLayout | FastLayout | VLLMLayout]] = {"hf": HFLayout, "fast": FastLayout, "vllm": VLLMLayout}
