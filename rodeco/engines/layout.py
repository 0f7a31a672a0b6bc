"""Engines without a model: the cache bookkeeping of ``hf`` and ``fast`` (rows, cached length, slots allocated),
for sessions that replay recorded tokens (``rodeco.replay``). They take the same calls as the real engines and
return placeholder logits, so a replayed run's peak KV memory and FLOPs are counted by the same code as a live
run's. ``tests/test_replay.py`` checks them call for call against the real engines."""

from __future__ import annotations

import numpy as np
import torch


class HFLayout:
    """``HFEngine``: every row holds the prompt and its own tokens; the cache grows by one slot per step."""

    shares_prefix = False
    keep_hidden, last_hidden = False, None  # no model, no hidden states (a replay reads the pool's)

    def __init__(self) -> None:
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

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += 1
        return torch.zeros(self.rows, 1)


class FastLayout:
    """``FastLlamaEngine``: each prompt's cache stored once, the rows' own tokens in a buffer of ``capacity - plen``
    slots per row, reallocated when a round reserves, when the batch shrinks, and when a step would overflow."""

    shares_prefix = True
    keep_hidden, last_hidden = False, None

    def __init__(self) -> None:
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

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.pending is not None or self.length >= self.capacity:
            self._realloc(max(self.capacity, self.length + 1))
        self.sfx += 1
        return torch.zeros(self.rows, 1)


LAYOUTS = {"HFEngine": HFLayout, "FastLlamaEngine": FastLayout}
