"""The Llama-family engine (Llama, Mistral without sliding window, Qwen2), gpt-fast style, on one block pool.

It reuses the HF model's weights (fused: one QKV matmul, one gate+up matmul; ``rodeco.engines.llama.FastWeights``)
and its rotary embedding module. Each layer's keys and values lie in one pool of blocks of ``BLOCK`` tokens (the
paged kernel's vector: 8 or 16), keys by column (``[blocks, kv_heads, head_dim, BLOCK]``), values by row
(``[blocks, kv_heads, BLOCK, head_dim]``); each row names its blocks in order, and which block a token goes to is
decided by ``rodeco.engines.blocks.Blocks``. So:

- a prompt is forwarded once and each layer writes its tokens straight into blocks that its rows share by reference,
  with no padding to another prompt's length; it ends on a block boundary (its first block padded at the front, the
  padding skipped by attention), so a fan-out copies nothing and each row's own tokens start in a block of its own;
- a copied row (beam, particle filter) shares its parent's blocks and copies the one it writes into (copy-on-write);
- rejection, finished rows leaving, fan-out and admission copy nothing: they edit the block tables;
- a step's attention reads each row's own blocks in place (``rodeco.engines.native.paged_attention`` on CPU, else
  the torch path it replaces, ``paged_reference``), its own number of tokens.

The pool is fixed when the engine is made (``pool_tokens``: the session's budget, ``rodeco.common.budget``), as vLLM's
KV manager fixes its own; a session that asks for more blocks than the pool holds is a bug the loop's decision points
exist to prevent (``rodeco.engines.blocks.PoolFull``). Without a budget the pool grows as rows need it.

One decoder layer (``rodeco.engines.llama.decoder_layer``) serves the prefill, the eager step and the compiled step
(``rodeco.engines.compiled``); only the cache object it is handed differs (``PromptCache``, ``StepCache``). A row's
logits depend on its own tokens only (the kernel's contract, and the engine's row-invariant linears), so
Speculative Rejection's survivors are Best-of-N's samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from rodeco.common.hardware import is_cpu
from rodeco.engines import HFModel, native
from rodeco.engines.blocks import Blocks
from rodeco.engines.llama import FastWeights, PromptCache, StepCache, decoder_layer, rms_norm

if TYPE_CHECKING:
    from rodeco.engines.compiled import CompiledStep

SUPPORTED = ("llama", "mistral", "qwen2")
# tokens a block: one vector of the paged kernel's on this CPU (``native.WIDTH``: 8 on AVX2-only CPUs, 16 with
# AVX-512), the smallest block it reads; a smaller block wastes less of a row's last block and of a prompt's first
BLOCK = native.WIDTH


def supports(model: HFModel) -> str | None:
    """None if the engine can run ``model``, else why not."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {SUPPORTED}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "mlp_bias", False):
        return "mlp_bias is not supported"
    sw = getattr(cfg, "sliding_window", None)
    if sw is not None and getattr(cfg, "use_sliding_window", True) and sw < cfg.max_position_embeddings:
        return "sliding-window attention is not supported"
    if not hasattr(getattr(model, "model", None), "rotary_emb"):
        return "no rotary_emb module"
    return None


class LlamaEngine:
    name = "fast"
    shares_prefix = True  # a prompt's blocks are named by all its rows, counted once
    compilable = True  # generator.compile: the step as one graph (``rodeco.engines.compiled``)
    block = BLOCK
    aligned = True  # a prompt ends on a block boundary (``Blocks``): its rows share all its blocks
    parks = True  # rows can be set aside, their blocks kept, while the others step (``park``)

    def __init__(
        self,
        model: HFModel,
        compiled: CompiledStep | None = None,
        weights: FastWeights | None = None,
        pool_tokens: int | None = None,
    ) -> None:
        cfg = model.config
        self.model, self.compiled = model, compiled
        w = weights if weights is not None else self.prepare(model)
        self.layers = w.layers
        self.embed = model.model.embed_tokens.weight
        self.norm = model.model.norm.weight
        self.lm_head = w.lm_head
        self.rotary = model.model.rotary_emb
        self.eps = cfg.rms_norm_eps
        self.h, self.hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.d**-0.5
        capacity = None if pool_tokens is None else max(1, pool_tokens // BLOCK)
        self.blocks = Blocks(BLOCK, capacity)
        like = self.embed
        # a fixed pool is allocated once, uninitialised (the pages a block lands on are touched when it is first
        # handed out, and cleared then: ``_fit_pool``); a growing one as rows need it. Both are inference tensors, as
        # the pools a step grows are: a compiled step's guards see one kind of pool
        n = capacity or 0
        with torch.inference_mode():
            self.kpool = [like.new_empty(n, self.hkv, self.d, BLOCK) for _ in self.layers]
            self.vpool = [like.new_empty(n, self.hkv, BLOCK, self.d) for _ in self.layers]
        self.kernel = (
            is_cpu(like.device)
            and native.fits(self.d, self.h // self.hkv)
            and BLOCK % native.WIDTH == 0
            and native.available("paged_attention")
        )
        # the eager step's attention: the paged kernel where it serves, else the torch path it replaces
        self.attention = native.paged_attention if self.kernel else native.paged_reference
        self.pos = torch.empty(0, dtype=torch.long, device=like.device)  # [B] position of each row's next token
        self._parked_pos: dict[int, torch.Tensor] = {}  # the positions of rows set aside (``park``), by handle
        self.keep_hidden = False  # keep the final-layer hidden state of each forward's last position
        self.last_hidden: torch.Tensor | None = None  # [rows of the last forward, hidden]

    @staticmethod
    def prepare(model: HFModel, mkl: bool = False) -> FastWeights:
        """The fused and prepacked weights of ``model``: a generator builds them once and hands them to each
        session's engine, so a session does not prepack again. ``mkl``: packed for MKL's GEMM (``FastWeights``), as
        the compiled step asks for on an Intel CPU in fp32."""
        return FastWeights(model, mkl)

    @property
    def rows(self) -> int:
        return self.blocks.rows

    @property
    def length(self) -> int:
        """The longest row's tokens (its prompt's and its own): no row is padded to it."""
        return self.blocks.longest

    @property
    def allocated_tokens(self) -> int:
        """Tokens' worth of the blocks some row names (a shared block counted once): what the budget bounds."""
        return self.blocks.held_tokens

    @property
    def pool_tokens(self) -> int:
        """Tokens' worth of the pool's blocks, free or not: the memory the cache has taken."""
        return self.kpool[0].shape[0] * BLOCK if self.kpool else 0

    def _fit_pool(self) -> None:
        """A growing pool (no budget) follows the blocks' pool: a copy of each layer's, amortised (by half at
        least); a fixed pool was allocated whole. The blocks just handed out are cleared: a slot no token fills (a
        prompt's front padding) weighs nothing in attention, and must hold no stale value (NaN times 0)."""
        n, have = self.blocks.pool, self.kpool[0].shape[0]
        if n > have:
            for pools in (self.kpool, self.vpool):
                for li, old in enumerate(pools):
                    new = old.new_empty(n, *old.shape[1:])
                    new[:have] = old
                    pools[li] = new
        fresh = self.blocks.taken()
        if len(fresh):
            ids = torch.from_numpy(fresh).to(self.kpool[0].device)
            for pool in (*self.kpool, *self.vpool):
                pool.index_fill_(0, ids, 0)

    def _linear(self, x: torch.Tensor, name: str, li: int) -> torch.Tensor:
        return getattr(self.layers[li], name)(x)

    @torch.inference_mode()
    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prompts ``ids`` [P, L] (left-padded, ``mask`` 0 at the pad) join, one row each after the rows there are:
        forwarded once, each layer writing their tokens straight into new blocks. Returns their last logits [P, V]."""
        G, L = ids.shape
        dev = ids.device
        lens = mask.sum(-1).cpu().numpy().astype(np.int64)
        blk, off = self.blocks.add(lens)
        self._fit_pool()
        valid = mask.bool()
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)  # [G, L]
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril_()
        attn_mask = (causal[None] & valid[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None]
        at = torch.from_numpy(np.concatenate([i * L + np.arange(L - n, L) for i, n in enumerate(lens)])).to(dev)
        cache = PromptCache(
            self.kpool,
            self.vpool,
            torch.from_numpy(blk).to(dev),
            torch.from_numpy(off).to(dev),
            at,
            attn_mask[:, None],
            self.scale,
        )
        x = F.embedding(ids, self.embed)  # [G, L, d]
        cos, sin = self.rotary(x, pos)  # [G, L, D]
        cos, sin = cos[:, :, None], sin[:, :, None]  # over the heads
        for li, lay in enumerate(self.layers):
            x = decoder_layer(
                x, li, self._linear, lay.ln1, lay.ln2, self.h, self.hkv, self.d, self.eps, cos, sin, cache
            )
        self.pos = torch.cat([self.pos, pos[:, -1] + 1])
        return self._head(x[:, -1])

    def select(self, rows: torch.Tensor) -> None:
        """Keep (and repeat, reorder) rows by index: block tables edited, no cache copied."""
        self.blocks.select(rows.cpu().numpy())
        self.pos = self.pos.index_select(0, rows.to(self.pos.device))

    def park(self, rows: torch.Tensor) -> int:
        """Set rows (indices) aside, their blocks kept (``Blocks.park``): the others step without them. Returns the
        handle ``unpark`` takes."""
        idx = rows.cpu().numpy()
        keep = torch.from_numpy(np.setdiff1d(np.arange(self.rows), idx)).to(self.pos.device)
        handle = self.blocks.park(idx)
        self._parked_pos[handle] = self.pos.index_select(0, rows.to(self.pos.device))
        self.pos = self.pos.index_select(0, keep)
        return handle

    def unpark(self, handle: int) -> None:
        """Rows set aside by ``park`` come back after the rows there are, their cache as they left it."""
        self.blocks.unpark(handle)
        self.pos = torch.cat([self.pos, self._parked_pos.pop(handle)])

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """How many steps (at most ``most``) ``rows`` can take with the blocks they name within ``tokens``
        (``Blocks.steps_within``)."""
        return self.blocks.steps_within(rows, tokens, row_overhead, most)

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
        bk = self.blocks
        tables, lens, starts = (torch.from_numpy(x).to(dev) for x in (bk.tables, bk.lens, bk.starts))
        x = F.embedding(tokens, self.embed)  # [B, d]
        cos, sin = self.rotary(x, self.pos[:, None])  # [B, 1, D]
        self.pos = self.pos + 1
        if self.compiled is not None:
            logits, hidden = self.compiled(x, cos, sin, b, o, tables, lens, starts, self.kpool, self.vpool)
            self.last_hidden = hidden if self.keep_hidden else None
            return logits
        cache = StepCache(self.kpool, self.vpool, b, o, tables, lens, starts, self.scale, self.attention)
        for li, lay in enumerate(self.layers):
            x = decoder_layer(
                x, li, self._linear, lay.ln1, lay.ln2, self.h, self.hkv, self.d, self.eps, cos, sin, cache
            )
        return self._head(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the last layer's output; its normed state is kept in ``last_hidden`` when asked."""
        h = rms_norm(x, self.norm, self.eps)
        self.last_hidden = h if self.keep_hidden else None
        return self.lm_head(h)
