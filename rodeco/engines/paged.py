"""The fast engine on a paged KV cache (``generator.engine=paged``): the fast engine's weights and forward, its cache
in blocks of ``BLOCK`` tokens.

Each layer's keys and values lie in one pool of blocks (keys by column, ``[blocks, kv_heads, head_dim, BLOCK]``,
values by row, ``[blocks, kv_heads, BLOCK, head_dim]``); each row names its blocks in order, and which block a token
goes to is decided by ``rodeco.engines.blocks.Blocks``. So:

- a prompt is forwarded once and its tokens written into blocks its rows share by reference, with no padding: a row
  holds its own prompt's tokens, not the longest prompt's;
- a row's first token copies its prompt's partial last block (copy-on-write), and so does a copied row's (beam,
  particle filter) at its next token, for the one block it shares with its parent and writes into;
- rejection, finished rows leaving and fan-out copy nothing: they edit the block tables;
- a step's attention reads each row's own blocks in place (``rodeco.engines.native.paged_attention`` on CPU, else
  the torch path it replaces, ``paged_reference``), its own number of tokens, so no row reads another's padding.

A row's logits depend on its own tokens only (the kernel's contract, and the fast engine's row-invariant linears),
so Speculative Rejection's survivors are Best-of-N's samples. ``generator.compile`` compiles the step as one graph
(``rodeco.engines.compiled.CompiledStep`` with ``paged``: the same writes and attention, the paged kernel an opaque
op in it); never as CUDA graphs, whose fixed addresses and sizes a block table's growth does not keep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from rodeco.common.hardware import is_cpu
from rodeco.engines import HFModel, native
from rodeco.engines.blocks import Blocks
from rodeco.engines.fast import FastLlamaEngine
from rodeco.engines.llama import FastWeights, rope

if TYPE_CHECKING:
    from rodeco.engines.compiled import CompiledStep

BLOCK = 16  # tokens a block (rodeco's paged kernel reads blocks of a multiple of ``native.LANES``)


class PagedLlamaEngine(FastLlamaEngine):
    name = "paged"
    shares_prefix = True
    compilable = True  # generator.compile: the step as one graph (``CompiledStep`` with ``paged``), no CUDA graphs
    block = BLOCK

    def __init__(
        self, model: HFModel, compiled: CompiledStep | None = None, weights: FastWeights | None = None
    ) -> None:
        if compiled is not None and not compiled.paged:
            raise ValueError("the paged engine runs the paged compiled step (CompiledStep.of(..., paged=True))")
        super().__init__(model, weights=weights)
        self.compiled = compiled
        self.blocks = Blocks(BLOCK)
        like = self.embed
        # per layer: keys by column [blocks, kv_heads, head_dim, BLOCK], values by row [blocks, kv_heads, BLOCK, D]
        self.kpool = [like.new_empty(0, self.hkv, self.d, BLOCK) for _ in self.layers]
        self.vpool = [like.new_empty(0, self.hkv, BLOCK, self.d) for _ in self.layers]
        self.kernel = (
            is_cpu(like.device)
            and native.fits(self.d, self.h // self.hkv)
            and BLOCK % native.LANES == 0
            and native.available("paged_attention")
        )

    @property
    def rows(self) -> int:
        return self.blocks.rows

    @property
    def length(self) -> int:
        """The longest row's tokens (its prompt's and its own): no row is padded to it."""
        return self.blocks.longest

    @property
    def capacity(self) -> int:
        return self.length

    @property
    def allocated_tokens(self) -> int:
        """Tokens' worth of the blocks some row names (a shared block counted once)."""
        return self.blocks.held_tokens

    @property
    def pool_tokens(self) -> int:
        """Tokens' worth of the pool's blocks, free or not: the memory the cache has taken."""
        return self.kpool[0].shape[0] * BLOCK if self.kpool else 0

    def _fit_pool(self) -> None:
        """Grow the pools to the blocks' pool (a copy of each, amortised: it grows by half at least)."""
        n, have = self.blocks.pool, self.kpool[0].shape[0]
        if n > have:
            for pools in (self.kpool, self.vpool):
                for li, old in enumerate(pools):
                    new = old.new_zeros(n, *old.shape[1:])
                    new[:have] = old
                    pools[li] = new

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.blocks = Blocks(BLOCK)
        self.pos = torch.empty(0, dtype=torch.long, device=ids.device)
        return self._add(ids, mask)

    @torch.inference_mode()
    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self._add(ids, mask)

    def _add(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Forward prompts ``ids`` [P, L] (left-padded) once, write their tokens into new blocks, one row each after
        the rows there are. Returns their last logits [P, V]. (``_prompts`` keeps the keys in the plain layout: this
        engine's ``prompt_t`` stays False.)"""
        kps, vps, _, pos, logits = self._prompts(ids, mask)
        lens = mask.sum(-1).cpu().numpy().astype(np.int64)
        blk, off = self.blocks.add(lens)
        self._fit_pool()
        L, dev = ids.shape[1], ids.device
        g = torch.from_numpy(np.repeat(np.arange(len(lens)), lens)).to(dev)
        src = torch.from_numpy(np.concatenate([np.arange(L - n, L) for n in lens])).to(dev)
        b, o = torch.from_numpy(blk).to(dev), torch.from_numpy(off).to(dev)
        for kpool, vpool, kp, vp in zip(self.kpool, self.vpool, kps, vps):
            kpool[b, :, :, o] = kp[g, :, src]
            vpool[b, :, o] = vp[g, :, src]
        self.pos = torch.cat([self.pos, pos])
        return logits

    def select(self, rows: torch.Tensor) -> None:
        self.blocks.select(rows.cpu().numpy())
        self.pos = self.pos.index_select(0, rows)

    def reserve(self, capacity: int) -> None:
        pass  # blocks are taken as rows reach them

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B] -> logits [B, V]."""
        blk, off, src, dst = self.blocks.append()
        self._fit_pool()
        dev = tokens.device
        if len(src):  # copy-on-write: the shared blocks rows write into now
            s, d = torch.from_numpy(src).to(dev), torch.from_numpy(dst).to(dev)
            for pool in (*self.kpool, *self.vpool):
                pool[d] = pool[s]
        b, o = torch.from_numpy(blk).to(dev), torch.from_numpy(off).to(dev)
        tables, lens = torch.from_numpy(self.blocks.tables).to(dev), torch.from_numpy(self.blocks.lens).to(dev)
        attend = native.paged_attention if self.kernel else native.paged_reference
        B, g = tokens.shape[0], self.h // self.hkv
        x = F.embedding(tokens, self.embed)  # [B, d]
        cos, sin = self.rotary(x, self.pos[:, None])  # [B, 1, D]
        self.pos = self.pos + 1
        if self.compiled is not None:
            logits, hidden = self.compiled(x, cos, sin, b, o, tables, lens, self.kpool, self.vpool)
            self.last_hidden = hidden if self.keep_hidden else None
            return logits
        for li, lay in enumerate(self.layers):
            q, k, v = self._qkv(x, lay)  # q [B, H, D], k/v [B, Hkv, D]
            q = rope(q, cos, sin).view(B, self.hkv, g, self.d)  # query heads of one KV head as a sequence
            self.kpool[li][b, :, :, o] = rope(k, cos, sin)
            self.vpool[li][b, :, o] = v
            o_ = attend(q, self.kpool[li], self.vpool[li], tables, lens, self.scale)  # [B, Hkv, g, D]
            x = self._finish_layer(x, o_.reshape(B, -1), lay)
        return self._head(x)
