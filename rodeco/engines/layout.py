"""Engines without a model: the cache bookkeeping of ``hf``, ``fast`` and ``vllm`` (rows, cached length, slots
allocated), for sessions that replay recorded tokens (``rodeco.replays.replay``). They take the same calls as the real
engines and return placeholder logits, so a replayed run's peak KV memory and FLOPs are counted by the same code as
a live run's. ``tests/test_replay.py`` checks them call for call against the real engines."""

from __future__ import annotations

import numpy as np
import torch

from rodeco.common.budget import block_shared
from rodeco.engines.blocks import Blocks


def _token_by_token(layout: object, block: int) -> None:
    """rodeco's own engines allocate token by token: a pool of theirs records no block, or block 1."""
    if block != 1:
        raise ValueError(f"{type(layout).__name__} allocates token by token, not in blocks of {block}")


class HFLayout:
    """``HFEngine``: every row holds the prompt and its own tokens, left-padded to the longest row; the cache grows by
    one slot per step and drops the leading positions no row reads (``lead``: each row's padding) when rows leave.
    Prompts that join are padded, or pad the rows there, to the longer of the two."""

    shares_prefix = False
    compact_fraction = 0.25  # finished rows leave the batch once they are this share of it (rodeco.core.session)
    keep_hidden, last_hidden = False, None  # no model, no hidden states (a replay reads the pool's)

    def __init__(self, block: int) -> None:
        _token_by_token(self, block)
        self.length = 0
        self.lead = np.zeros(0, dtype=np.int64)  # per row: the leading positions it does not read

    @property
    def rows(self) -> int:
        return len(self.lead)

    @property
    def allocated_tokens(self) -> int:
        return self.rows * self.length

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.length = ids.shape[1]
        self.lead = self.length - mask.sum(-1).cpu().numpy().astype(np.int64)
        return torch.zeros(len(self.lead), 1)

    def select(self, rows: torch.Tensor) -> None:
        self.lead = self.lead[rows.cpu().numpy()]
        drop = int(self.lead.min()) if self.rows else 0
        self.lead, self.length = self.lead - drop, self.length - drop

    def reserve(self, capacity: int) -> None:
        pass

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lead = ids.shape[1] - mask.sum(-1).cpu().numpy().astype(np.int64)
        L = max(self.length, ids.shape[1])
        self.lead = np.concatenate([self.lead + L - self.length, lead + L - ids.shape[1]])
        self.length = L
        return torch.zeros(len(lead), 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += 1
        return torch.zeros(self.rows, 1)


class FastLayout:
    """``FastLlamaEngine``: each prompt's cache stored once, the rows' own tokens in a buffer of ``capacity - plen``
    slots per row, reallocated when a round reserves, when the batch shrinks, and when a step would overflow. Prompts
    that join get a prefix each (every prefix padded to the longest prompt); rows then count their own tokens
    (``counts``) until they hold as many again, and ``sfx`` is the longest row's count."""

    shares_prefix = True
    compact_fraction = 0.25
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int) -> None:
        _token_by_token(self, block)
        self.plen = self.sfx = self.own = self.prefixes = 0  # own: the buffer's slots per row
        self.grp = np.zeros(0, dtype=np.int64)  # the prefix of each allocated row
        self.counts: np.ndarray | None = None  # each allocated row's own tokens while they differ
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
        self._set_counts(self.counts[rows] if self.counts is not None else None)
        live = np.unique(self.grp)
        if len(live) < self.prefixes:  # prompts with no row left free their prefix
            self.prefixes, self.grp = len(live), np.searchsorted(live, self.grp)

    def _set_counts(self, counts: np.ndarray | None) -> None:
        """As the engine's ``_set_own``: one count once every row holds as many, else the longest row's."""
        if counts is not None and (len(counts) == 0 or bool((counts == counts[0]).all())):
            self.sfx, counts = int(counts[0]) if len(counts) else 0, None
        elif counts is not None:
            self.sfx = int(counts.max())
        self.counts = counts

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        G, L = ids.shape
        self.plen, self.sfx, self.own, self.prefixes = L, 0, 0, G
        self.grp, self.pending, self.counts = np.arange(G), None, None
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
        if self.pending is not None:
            self._realloc(self.capacity)
        P = ids.shape[0]
        counts = self.counts if self.counts is not None else np.full(len(self.grp), self.sfx, dtype=np.int64)
        self.plen = max(self.plen, ids.shape[1])
        self.grp = np.concatenate([self.grp, np.arange(self.prefixes, self.prefixes + P)])
        self.prefixes += P
        self._set_counts(np.concatenate([counts, np.zeros(P, dtype=np.int64)]))
        return torch.zeros(P, 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.pending is not None or self.length >= self.capacity:
            self._realloc(max(self.capacity, self.length + 1))
        self.sfx += 1
        if self.counts is not None:
            self._set_counts(self.counts + 1)
        return torch.zeros(self.rows, 1)


class VLLMLayout:
    """vLLM (``rodeco.engines.vllm``): blocks of ``block`` tokens; each prompt's full blocks before its last token
    stored once while any of its rows lives, each row holding the rest of its prompt and its own tokens in whole
    blocks (``rodeco.common.budget.block_shared``). A finished row leaves at once (``compact_fraction`` 0). An upper
    bound of vLLM's count: it also counts the row's latest token, whose keys vLLM stores only at the next step. A prompt
    that joins a running batch is not prefilled once (``rodeco.engines.vllm``: each of its rows prefills it), so
    each of its rows holds the whole prompt in its own blocks; its rows count their own tokens."""

    shares_prefix = True
    compact_fraction = 0.0
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int) -> None:
        self.block = block
        self._clear()

    def _clear(self) -> None:
        self.plen, self.prompts = 0, 0
        self.own = np.zeros(0, dtype=np.int64)  # per row: the tokens it generated into the cache
        self.tail = np.zeros(0, dtype=np.int64)  # per row: the prompt tokens it holds itself
        self.full = np.zeros(0, dtype=np.int64)  # per row: its prompt's shared tokens
        self.grp = np.zeros(0, dtype=np.int64)  # per row: its prompt

    @property
    def rows(self) -> int:
        return len(self.grp)

    @property
    def length(self) -> int:
        return self.plen + (int(self.own.max()) if self.rows else 0)

    @property
    def allocated_tokens(self) -> int:
        live = np.unique(self.grp)
        shared = int(sum(self.full[self.grp == g][0] for g in live))
        own = -(-(self.tail + self.own) // self.block) * self.block
        return shared + int(own.sum())

    def _prompts(self, mask: torch.Tensor, shared: bool) -> None:
        lens = mask.sum(-1).cpu().numpy().astype(np.int64)
        full = block_shared(lens, self.block) if shared else np.zeros_like(lens)
        self.full, self.tail = np.concatenate([self.full, full]), np.concatenate([self.tail, lens - full])
        self.grp = np.concatenate([self.grp, np.arange(self.prompts, self.prompts + len(lens))])
        self.own = np.concatenate([self.own, np.zeros(len(lens), dtype=np.int64)])
        self.plen, self.prompts = max(self.plen, int(lens.max())), self.prompts + len(lens)

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self._clear()
        self._prompts(mask, shared=True)
        return torch.zeros(ids.shape[0], 1)

    def select(self, rows: torch.Tensor) -> None:
        r = rows.cpu().numpy()
        self.grp, self.tail, self.full, self.own = self.grp[r], self.tail[r], self.full[r], self.own[r]

    def reserve(self, capacity: int) -> None:
        pass

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self._prompts(mask, shared=False)
        return torch.zeros(ids.shape[0], 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.own = self.own + 1
        return torch.zeros(self.rows, 1)


class PagedLayout:
    """``PagedLlamaEngine``: blocks of ``block`` tokens, a prompt's shared by its rows by reference and copied by a
    row when it writes into a shared one; the same bookkeeping as the engine's (``rodeco.engines.blocks.Blocks``),
    with no tensors. A finished row leaves once finished rows are a quarter of the batch, as on the fast engine."""

    shares_prefix = True
    compact_fraction = 0.25
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int) -> None:
        self.blocks = Blocks(block)

    @property
    def rows(self) -> int:
        return self.blocks.rows

    @property
    def length(self) -> int:
        return self.blocks.longest

    @property
    def allocated_tokens(self) -> int:
        return self.blocks.held_tokens

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.blocks = Blocks(self.blocks.size)
        return self.admit(ids, mask)

    def select(self, rows: torch.Tensor) -> None:
        self.blocks.select(rows.cpu().numpy())

    def reserve(self, capacity: int) -> None:
        pass

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.blocks.add(mask.sum(-1).cpu().numpy().astype(np.int64))
        return torch.zeros(ids.shape[0], 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.blocks.append()
        return torch.zeros(self.rows, 1)


Layout = HFLayout | FastLayout | PagedLayout | VLLMLayout

# by the engine's id (``EngineInfo.name``)
LAYOUTS: dict[str, type[Layout]] = {"hf": HFLayout, "fast": FastLayout, "paged": PagedLayout, "vllm": VLLMLayout}
