"""Engines without a model: the cache bookkeeping of ``hf``, the Llama engine and ``vllm`` (rows, cached length, slots
allocated, the steps a quota allows), for sessions that replay recorded tokens (``rodeco.replays.replay``). They take
the same calls as the real engines and return placeholder logits, so a replayed run's peak KV memory, decision points
and FLOPs are counted by the same code as a live run's. ``tests/test_replay.py`` checks them call for call against the
real engines."""

from __future__ import annotations

import numpy as np
import torch

from rodeco.common.budget import block_shared
from rodeco.engines import Unparked
from rodeco.engines.blocks import Blocks
from rodeco.engines.hf import padded_steps
from rodeco.engines.vllm_session import alone_steps_within


def _token_by_token(layout: object, block: int) -> None:
    """``hf`` allocates token by token: a pool of its records no block, or block 1."""
    if block != 1:
        raise ValueError(f"{type(layout).__name__} allocates token by token, not in blocks of {block}")


class HFLayout(Unparked):
    """``HFEngine``: every row holds the prompt and its own tokens, left-padded to the longest row; the cache grows by
    one slot per step and drops the leading positions no row reads (``lead``: each row's padding) when rows leave.
    Prompts that join are padded, or pad the rows there, to the longer of the two."""

    shares_prefix, aligned = False, False
    compact_fraction = 0.25  # finished rows leave the batch once they are this share of it (rodeco.core.session)
    keep_hidden, last_hidden = False, None  # no model, no hidden states (a replay reads the pool's)

    def __init__(self, block: int, pool_tokens: int | None = None) -> None:
        _token_by_token(self, block)
        self.length = 0
        self.lead = np.zeros(0, dtype=np.int64)  # per row: the leading positions it does not read

    @property
    def rows(self) -> int:
        return len(self.lead)

    @property
    def allocated_tokens(self) -> int:
        return self.rows * self.length

    def select(self, rows: torch.Tensor) -> None:
        self.lead = self.lead[rows.cpu().numpy()]
        drop = int(self.lead.min()) if self.rows else 0
        self.lead, self.length = self.lead - drop, self.length - drop

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        longest = int((self.length - self.lead[rows]).max()) if len(rows) else 0
        return padded_steps(len(rows), longest, tokens, row_overhead, most)

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lead = ids.shape[1] - mask.sum(-1).cpu().numpy().astype(np.int64)
        if not self.rows:
            self.length, self.lead = ids.shape[1], lead
            return torch.zeros(len(lead), 1)
        L = max(self.length, ids.shape[1])
        self.lead = np.concatenate([self.lead + L - self.length, lead + L - ids.shape[1]])
        self.length = L
        return torch.zeros(len(lead), 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += 1
        return torch.zeros(self.rows, 1)


class VLLMLayout(Unparked):
    """vLLM (``rodeco.engines.vllm``): blocks of ``block`` tokens; each prompt's full blocks before its last token
    stored once while any of its rows lives, each row holding the rest of its prompt and its own tokens in whole
    blocks (``rodeco.common.budget.block_shared``). A finished row leaves at once (``compact_fraction`` 0). An upper
    bound of vLLM's count: it also counts the row's latest token, whose keys vLLM stores only at the next step. A prompt
    that joins a running batch is not prefilled once (``rodeco.engines.vllm``: each of its rows prefills it), so
    each of its rows holds the whole prompt in its own blocks; its rows count their own tokens."""

    shares_prefix, aligned = True, False
    compact_fraction = 0.0
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int, pool_tokens: int | None = None) -> None:  # vLLM's pool is its own
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

    def select(self, rows: torch.Tensor) -> None:
        r = rows.cpu().numpy()
        self.grp, self.tail, self.full, self.own = self.grp[r], self.tail[r], self.full[r], self.own[r]

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self._prompts(mask, shared=not self.rows)  # into an empty batch a prompt is prefilled once, shared
        return torch.zeros(ids.shape[0], 1)

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """As the live vLLM session counts (``alone_steps_within``). A row holds one token more than it has fed
        (``own``): the one pending, or the one the session samples from the prefill without a step
        (``TorchSession.steps_within``)."""
        plen = (self.full + self.tail)[rows]
        return alone_steps_within(plen, self.grp[rows], self.own[rows] + 1, self.block, tokens, row_overhead, most)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.own = self.own + 1
        return torch.zeros(self.rows, 1)


class BlockLayout(Unparked):
    """``LlamaEngine``: blocks of ``block`` tokens, a prompt's shared by its rows by reference and copied by a row
    when it writes into a shared one; the same bookkeeping as the engine's (``rodeco.engines.blocks.Blocks``), with
    no tensors, its pool fixed at ``pool_tokens`` as the engine's is. A finished row leaves once finished rows are a
    quarter of the batch, as on the engine. (Pools recorded token by token replay with blocks of one token.)"""

    shares_prefix, aligned = True, True
    compact_fraction = 0.25
    keep_hidden, last_hidden = False, None

    def __init__(self, block: int, pool_tokens: int | None = None) -> None:
        self.blocks = Blocks(block, None if pool_tokens is None else max(1, pool_tokens // block))

    @property
    def rows(self) -> int:
        return self.blocks.rows

    @property
    def length(self) -> int:
        return self.blocks.longest

    @property
    def allocated_tokens(self) -> int:
        return self.blocks.held_tokens

    def select(self, rows: torch.Tensor) -> None:
        self.blocks.select(rows.cpu().numpy())

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        return self.blocks.steps_within(rows, tokens, row_overhead, most)

    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.blocks.add(mask.sum(-1).cpu().numpy().astype(np.int64))
        return torch.zeros(ids.shape[0], 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.blocks.append()
        return torch.zeros(self.rows, 1)


Layout = HFLayout | BlockLayout | VLLMLayout

# by the engine's id (``EngineInfo.name``; ``paged``: the Llama engine's other name)
LAYOUTS: dict[str, type[Layout]] = {"hf": HFLayout, "fast": BlockLayout, "paged": BlockLayout, "vllm": VLLMLayout}
