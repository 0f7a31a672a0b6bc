"""A fast engine for Llama-family models (Llama, Mistral without sliding window, Qwen2), gpt-fast style.

It reuses the HF model's weights (fused: one QKV matmul, one gate+up matmul) and its rotary embedding module, and
splits the KV cache in two: each prompt's keys and values are stored once (``[prompts, kv_heads, P, head_dim]``),
shared by all the rows that decode from it, and the generated tokens live in a per-round preallocated cache ``[rows,
kv_heads, capacity - P, head_dim]`` written in place each step. Decode attention scores a prompt's cached keys with
all its rows' queries in one matmul (the cache is read once per prompt, not once per row), scores the row's own
tokens separately, and takes one softmax over both. Fan-out copies nothing: a selection that does not shrink the
batch is only recorded and applied by the next ``reserve``. Pruning (a selection that shrinks it) reallocates at
once, one ``index_select`` per layer of the generated part, layer by layer, so memory is freed at the decision point
and old and new caches coexist for one layer at most. The ``heads / kv_heads`` query heads that share a KV head are
treated as a short query sequence, so grouped-query attention needs no repeated keys; when every prompt has as many
rows (Best-of-N), the prompt part of attention is one batched matmul over the prompts instead of a loop over them,
the same products. On CPU in bf16 the eager step stores the generated keys transposed (``keys_t``, a transposed
view): a step's scores then multiply by a plain matrix, where a transposed slice of the cache would be copied by the
bf16 matmul first (the logits are the same bit for bit). The compiled step with rodeco's attention kernel (CPU:
``rodeco.engines.native``) stores the prompt's keys and the generated ones by column (``prompt_t``, ``keys_t``), the
kernel's layout; with inductor's attention it keeps the plain layout. On CPU, weights
are prepacked for oneDNN's matmul (the blocked layout PyTorch's own compiler uses), which is about 1.3x faster than
plain ``F.linear`` at decode batch sizes; they are prepared once per generator (``FastWeights``, shared by its
sessions' engines) and hold a second copy of the weights in memory. A generator that compiles its step
(``rodeco.engines.compiled``) on an Intel CPU in fp32 packs them for MKL's GEMM instead, for its prefill and its
compiled step alike; the eager engine's stay oneDNN's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from rodeco.common.hardware import is_cpu
from rodeco.engines import HFModel
from rodeco.engines.llama import FastWeights, Layer, rms_norm, rope

if TYPE_CHECKING:
    from rodeco.engines.compiled import CompiledStep

log = logging.getLogger(__name__)

SUPPORTED = ("llama", "mistral", "qwen2")


def supports(model: HFModel) -> str | None:
    """None if the fast engine can run ``model``, else why not."""
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


class FastLlamaEngine:
    name = "fast"
    shares_prefix = True  # a prompt's cache is stored once, however many rows decode from it
    compilable = True  # generator.compile applies (rodeco.engines.compiled)
    block = 1  # token by token

    def __init__(
        self,
        model: HFModel,
        compiled: CompiledStep | None = None,
        weights: FastWeights | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        self.compiled = compiled  # generator.compile: the step's layers and head as one graph (rodeco.engines.compiled)
        # one graph a round (``CompiledStep.graphs``, CUDA): the slot written is ``s_dev``, a tensor on the device, and
        # the caches are static inputs whose unwritten slots hold zeros
        self.graphs = compiled is not None and compiled.graphs
        self.s_dev: torch.Tensor | None = None
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
        self.kp: list[torch.Tensor] = []  # per layer: prompt keys [G, kv_heads, P, head_dim], one per prompt
        self.vp: list[torch.Tensor] = []
        self.pbias = torch.empty(0, 0)  # [G, P]: 0, or -inf at left padding
        # per layer: generated keys [B, kv_heads, capacity - P, head_dim]; with ``keys_t`` a view of storage laid out
        # [B, kv_heads, head_dim, capacity - P], so that a step's scores read them as a plain matrix: on CPU a bf16
        # matmul copies a transposed slice first (2.5x slower a call); in fp32 the plain layout is kept
        self.k: list[torch.Tensor] = []
        self.keys_t = False
        self.prompt_t = False  # the prompt keys by column too (rodeco's attention kernel, under compile)
        self.v: list[torch.Tensor] = []
        self.grp = torch.empty(0, dtype=torch.long)  # [B] the prompt (prefix) each row decodes from
        self.segs: list[tuple[int, slice | torch.Tensor]] = []  # (prefix, its rows), from _segments
        self.even = False  # every prefix has as many rows, in prefix order: one batched matmul serves them all
        self.pos = torch.empty(0, dtype=torch.long)  # [B] position of the next token
        self.plen = 0  # P: padded prompt length
        self.sfx = 0  # generated tokens cached per row (the longest row's, when ``own`` is set)
        # per row, when rows hold different numbers of generated tokens (prompts admitted into a running batch,
        # ``admit``): each row's own tokens, left-aligned in its cache; the columns past them are masked. None: every
        # row holds ``sfx`` (a batch whose prompts started together), and nothing is masked
        self.own: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None  # pending row selection, applied at the next realloc
        self.keep_hidden = False  # keep the final-layer hidden state of each forward's last position
        self.last_hidden: torch.Tensor | None = None  # [rows of the last forward, hidden]

    @staticmethod
    def prepare(model: HFModel, mkl: bool = False) -> FastWeights:
        """The fused and prepacked weights of ``model``: a generator builds them once and hands them to each
        session's engine (``rodeco.core.generator.TorchGenerator.new_engine``), so a session does not prepack again.
        ``mkl``: packed for MKL's GEMM (``FastWeights``), as the compiled step asks for on an Intel CPU in fp32."""
        return FastWeights(model, mkl)

    @property
    def rows(self) -> int:
        return self.pos.shape[0] if self._rows is None else self._rows.shape[0]

    @property
    def length(self) -> int:
        return self.plen + self.sfx

    @property
    def capacity(self) -> int:
        return self.plen + (self.k[0].shape[2] if self.k else 0)

    @property
    def allocated_tokens(self) -> int:
        prefixes = self.kp[0].shape[0] if self.kp else 0
        return prefixes * self.plen + self.rows * (self.capacity - self.plen)

    def _realloc(self, capacity: int) -> None:
        rows = self._rows if self._rows is not None else torch.arange(self.pos.shape[0], device=self.pos.device)
        n, S = rows.shape[0], self.sfx
        cap = max(capacity - self.plen, S)
        own = self.own.index_select(0, rows) if self.own is not None else None
        for cache, t in ((self.k, self.keys_t), (self.v, False)):
            for i, old in enumerate(cache):  # one layer at a time: peak is one extra layer
                new = _cache(old, n, self.hkv, cap, self.d, t)
                new[:, :, :S] = old.index_select(0, rows)[:, :, :S]
                if self.graphs or own is not None:  # read (masked: zeros, never NaN times 0) by the round's steps
                    new[:, :, S:].zero_()
                cache[i] = new
                del old
        self.pos, self.grp, self._rows = self.pos.index_select(0, rows), self.grp.index_select(0, rows), None
        self._set_own(own)
        live = torch.unique(self.grp)
        if live.shape[0] < self.pbias.shape[0]:  # prompts with no row left free their prefix
            for cache, t in ((self.kp, self.prompt_t), (self.vp, False)):
                cache[:] = [_take(c, live, t) for c in cache]
            self.pbias, self.grp = self.pbias.index_select(0, live), torch.searchsorted(live, self.grp)
        self._group()
        if self.graphs:
            assert self.compiled is not None and self.s_dev is not None  # graphs: a compiled step, a slot from prefill
            self.compiled.adopt([*self.k, *self.v, *self.kp, *self.vp, self.pbias, self.grp, self.s_dev])

    def _set_own(self, own: torch.Tensor | None) -> None:
        """Rows' own token counts: kept per row while they differ, ``sfx`` the longest row's (an open batch's
        steps grow without end, its rows' lengths do not); once every row holds as many (the later rows caught up, or
        the others left), ``sfx`` is that count and nothing is masked."""
        if own is not None and (own.numel() == 0 or bool((own == own[0]).all())):
            self.sfx, own = int(own[0]) if own.numel() else 0, None
        elif own is not None:  # the longest row's count: no row reads past it (not the steps since the batch opened)
            self.sfx = int(own.max())
        self.own = own

    def _group(self) -> None:
        """Each prefix's rows (``segs``) and whether they are even, from ``grp``: once per cache reallocation."""
        self.segs = _segments(self.grp)
        self.even = _even(self.segs, self.grp.shape[0])

    def select(self, rows: torch.Tensor) -> None:
        self._rows = rows if self._rows is None else self._rows.index_select(0, rows)
        if self._rows.shape[0] < self.pos.shape[0]:  # shrinking: free memory now
            self._realloc(self.capacity)

    def reserve(self, capacity: int) -> None:
        if self._rows is not None or capacity != self.capacity:
            self._realloc(capacity)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        G, L = ids.shape
        dev, dt = ids.device, self.embed.dtype
        # keys by column: rodeco's attention kernel reads them so, prompt and own (the compiled step on CPU); the
        # eager step on CPU in bf16 stores its own keys so; inductor's attention reads a key's head_dim contiguously
        by_column = self.compiled is not None and self.compiled.keys_by_column
        self.keys_t = by_column or (is_cpu(dev) and dt != torch.float32 and self.compiled is None)
        self.prompt_t = by_column
        like = torch.empty(0, device=dev, dtype=dt)
        self.k = [_cache(like, G, self.hkv, 0, self.d, self.keys_t) for _ in self.layers]
        self.v = [torch.empty(G, self.hkv, 0, self.d, device=dev, dtype=dt) for _ in self.layers]
        self.plen, self.sfx, self._rows, self.own = L, 0, None, None
        self.s_dev = torch.zeros(1, dtype=torch.long, device=dev) if self.graphs else None
        self.grp = torch.arange(G, device=dev)
        self._group()
        self.kp, self.vp, self.pbias, self.pos, logits = self._prompts(ids, mask)
        return logits

    @torch.inference_mode()
    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prompts joining a running batch: each is forwarded once and gets one row, appended after the rows there
        are, holding no generated token yet (the session fans it out with ``select``). The prompts' caches are
        left-padded to the longest prompt, old and new (the pad masked); rows keep their own token counts
        (``own``). Returns the new prompts' last logits [P', V]. The compiled step admits (its steps over rows of
        different lengths are one more graph); as CUDA graphs (``graphs``) it does not."""
        if self.graphs:
            raise NotImplementedError("the compiled step as CUDA graphs does not admit prompts into a running batch")
        if self._rows is not None:
            self._realloc(self.capacity)
        G0, B0, P = self.pbias.shape[0], self.pos.shape[0], ids.shape[0]
        kp, vp, pbias, pos, logits = self._prompts(ids, mask)
        L = max(self.plen, ids.shape[1])
        pad = lambda c, t: _pad_prompt(c, L, t)  # noqa: E731
        self.kp = [_cat(pad(a, self.prompt_t), pad(b, self.prompt_t), self.prompt_t) for a, b in zip(self.kp, kp)]
        self.vp = [_cat(pad(a, False), pad(b, False), False) for a, b in zip(self.vp, vp)]
        self.pbias = torch.cat([_pad_bias(self.pbias, L), _pad_bias(pbias, L)])
        self.plen = L
        dev = self.pos.device
        own = self.own if self.own is not None else torch.full((B0,), self.sfx, dtype=torch.long, device=dev)
        cap = self.k[0].shape[2] if self.k else 0
        for cache, t in ((self.k, self.keys_t), (self.v, False)):
            for i, old in enumerate(cache):
                new = _cache(old, B0 + P, self.hkv, cap, self.d, t)
                new[:B0] = old
                new[B0:].zero_()
                cache[i] = new
        self.pos = torch.cat([self.pos, pos])
        self.grp = torch.cat([self.grp, torch.arange(G0, G0 + P, device=dev)])
        self._group()
        self._set_own(torch.cat([own, torch.zeros(P, dtype=torch.long, device=dev)]))
        if self.own is not None:  # the masked columns are read: zeros, never NaN times 0
            past = torch.arange(cap, device=dev)[None] >= self.own[:, None]  # [B, cap]
            for c in (*self.k, *self.v):
                c.masked_fill_(past[:, None, :, None], 0)
        return logits

    def _prompts(
        self, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward prompts ``ids`` [G, L] (left-padded, ``mask`` 0 at the pad): their caches per layer (keys in the
        ``prompt_t`` layout), the pad's bias [G, L], the next token's position [G] and the last logits [G, V]."""
        G, L = ids.shape
        dev, dt = ids.device, self.embed.dtype
        like = torch.empty(0, device=dev, dtype=dt)
        kps = [_cache(like, G, self.hkv, L, self.d, self.prompt_t) for _ in self.layers]
        vps = [torch.empty(G, self.hkv, L, self.d, device=dev, dtype=dt) for _ in self.layers]
        valid = mask.bool()
        pbias = torch.zeros(G, L, device=dev).masked_fill_(~valid, float("-inf"))
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)  # [G, L]
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril_()
        attn_mask = (causal[None] & valid[:, None, :]) | torch.eye(L, dtype=torch.bool, device=dev)[None]
        x = F.embedding(ids, self.embed)  # [G, L, d]
        cos, sin = self.rotary(x, pos)  # [G, L, D]
        cos, sin = cos[:, None], sin[:, None]
        g = self.h // self.hkv
        for li, lay in enumerate(self.layers):
            q, k, v = self._qkv(x, lay)  # q [G, L, H, D]
            q = rope(q.transpose(1, 2), cos, sin)  # [G, H, L, D]
            k = rope(k.transpose(1, 2), cos, sin)  # [G, Hkv, L, D]
            v = v.transpose(1, 2)
            kps[li].copy_(k)
            vps[li].copy_(v)
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask[:, None], scale=self.scale)
            x = self._finish_layer(x, o.transpose(1, 2).reshape(G, L, -1), lay)
        return kps, vps, pbias, pos[:, -1] + 1, self._head(x[:, -1])

    def _qkv(self, x: torch.Tensor, lay: Layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = lay.qkv(rms_norm(x, lay.ln1, self.eps))
        hd, kd = self.h * self.d, self.hkv * self.d
        q, k, v = qkv.split([hd, kd, kd], dim=-1)
        shape = x.shape[:-1]
        return q.view(*shape, self.h, self.d), k.view(*shape, self.hkv, self.d), v.view(*shape, self.hkv, self.d)

    def _finish_layer(self, x: torch.Tensor, attn: torch.Tensor, lay: Layer) -> torch.Tensor:
        x = x + lay.o(attn)
        gate, up = lay.gate_up(rms_norm(x, lay.ln2, self.eps)).chunk(2, dim=-1)
        return x + lay.down(F.silu(gate) * up)

    def _by_prefix(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Per prompt: ``a[rows] @ b[prompt]`` with the rows' query heads as one matrix, so a prompt's cache is
        read once for all its rows. a: [B, Hkv, g, X], b: [G, Hkv, X, Y] -> [B, Hkv, g, Y]. Prompts with as many rows
        each, in order (Best-of-N's batches), are one batched matmul of the same per-prompt products."""
        B, H, g, X = a.shape
        G = b.shape[0]
        if G > 1 and self.even:
            k = B // G
            res = a.view(G, k, H, g, X).transpose(1, 2).reshape(G, H, k * g, X) @ b
            return res.view(G, H, k, g, -1).transpose(1, 2).reshape(B, H, g, -1)
        out = a.new_empty(B, H, g, b.shape[-1]) if len(self.segs) > 1 else None
        for j, r in self.segs:
            aj = a[r]
            k = aj.shape[0]
            res = (aj.permute(1, 0, 2, 3).reshape(H, k * g, X) @ b[j]).view(H, k, g, -1).permute(1, 0, 2, 3)
            if out is None:
                return res
            out[r] = res
        assert out is not None  # every row has a prefix: segs is not empty
        return out

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B] -> logits [B, V]."""
        if self._rows is not None or self.length >= self.capacity:
            self._realloc(max(self.capacity, self.length + 1))
        B, S, own = tokens.shape[0], self.sfx, self.own
        x = F.embedding(tokens, self.embed)  # [B, d]
        cos, sin = self.rotary(x, self.pos[:, None])  # [B, 1, D]
        if self.compiled is not None:
            s = self.s_dev if self.graphs else S
            at = () if own is None else (own,)  # rows of different lengths: each row's own column (one more graph)
            logits, hidden = self.compiled(x, cos, sin, self.pbias, self.grp, s, self.kp, self.vp, self.k, self.v, *at)
            self.last_hidden = hidden if self.keep_hidden else None
            self.sfx, self.pos = S + 1, self.pos + 1
            if self.graphs:
                assert self.s_dev is not None  # set by prefill when the step runs as graphs
                self.s_dev.add_(1)
            if own is not None:
                self._set_own(own + 1)
            return logits
        bias = self.pbias.index_select(0, self.grp)[:, None, None, :]  # [B, 1, 1, P]
        obias = None  # rows of different lengths: each row's own columns past its token are masked
        if own is not None:
            cols = torch.arange(S + 1, device=own.device)
            obias = torch.zeros(B, S + 1, device=own.device).masked_fill_(cols > own[:, None], float("-inf"))
            obias, cell = obias[:, None, None, :], (torch.arange(B, device=own.device), own)
        g = self.h // self.hkv
        for li, lay in enumerate(self.layers):
            q, k, v = self._qkv(x, lay)  # q [B, H, D], k/v [B, Hkv, D]
            q = rope(q, cos, sin).view(B, self.hkv, g, self.d)  # query heads of one KV head as a sequence
            if own is None:
                self.k[li][:, :, S] = rope(k, cos, sin)
                self.v[li][:, :, S] = v
            else:  # each row's next column
                self.k[li].transpose(1, 2)[cell] = rope(k, cos, sin)
                self.v[li].transpose(1, 2)[cell] = v
            o = self._attend(q, li, bias, obias)  # [B, Hkv, g, D]
            x = self._finish_layer(x, o.reshape(B, -1), lay)
        self.sfx, self.pos = S + 1, self.pos + 1
        if own is not None:
            self._set_own(own + 1)
        return self._head(x)

    def _attend(self, q: torch.Tensor, li: int, bias: torch.Tensor, obias: torch.Tensor | None = None) -> torch.Tensor:
        """Layer ``li``'s attention of the rows' queries ``q`` [B, Hkv, g, D] over their prompt's cache and their own
        ``sfx + 1`` tokens -> [B, Hkv, g, D]. The scores are fp32 [B, heads, context]: scaled in place, and freed
        once softmaxed, so a row holds two fp32 copies of its scores at most (``rodeco.common.working``)."""
        S, P = self.sfx, self.plen
        ks, vs = self.k[li][:, :, : S + 1], self.v[li][:, :, : S + 1]
        kpt = self.kp[li].transpose(-1, -2)  # [G, Hkv, D, P]
        s = torch.cat([self._by_prefix(q, kpt), q @ ks.transpose(-1, -2)], dim=-1).float().mul_(self.scale)
        s[..., :P] += bias
        if obias is not None:
            s[..., P:] += obias
        p = torch.softmax(s, dim=-1).to(q.dtype)  # [B, Hkv, g, P + S + 1]
        del s
        return self._by_prefix(p[..., :P], self.vp[li]) + p[..., P:] @ vs

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the last layer's output; its normed state is kept in ``last_hidden`` when asked."""
        h = rms_norm(x, self.norm, self.eps)
        self.last_hidden = h if self.keep_hidden else None
        return self.lm_head(h)


def _cache(like: torch.Tensor, rows: int, heads: int, length: int, dim: int, transposed: bool) -> torch.Tensor:
    """An empty cache ``[rows, heads, length, dim]`` like ``like``; ``transposed``: a view of storage laid out
    ``[rows, heads, dim, length]``, so that its ``transpose(-1, -2)`` slices are plain matrices."""
    if transposed:
        return like.new_empty(rows, heads, dim, length).transpose(-1, -2)
    return like.new_empty(rows, heads, length, dim)


def _pad_prompt(cache: torch.Tensor, length: int, transposed: bool) -> torch.Tensor:
    """A prompt cache ``[G, heads, P, dim]`` left-padded with zeros to ``length`` positions, in the same layout."""
    G, H, P, D = cache.shape
    if P == length:
        return cache
    new = _cache(cache, G, H, length, D, transposed)
    new[:, :, : length - P].zero_()
    new[:, :, length - P :] = cache
    return new


def _cat(a: torch.Tensor, b: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Caches ``a`` then ``b`` along the rows, in their layout (``torch.cat`` alone lays a transposed pair out plainly,
    and rodeco's attention kernel reads the prompt keys by column)."""
    if transposed:
        return torch.cat([a.transpose(-1, -2), b.transpose(-1, -2)]).transpose(-1, -2)
    return torch.cat([a, b])


def _pad_bias(bias: torch.Tensor, length: int) -> torch.Tensor:
    """A prompt bias ``[G, P]`` left-padded with ``-inf`` (masked) to ``length``."""
    pad = bias.new_full((bias.shape[0], length - bias.shape[1]), float("-inf"))
    return torch.cat([pad, bias], dim=1)


def _take(cache: torch.Tensor, rows: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``cache.index_select(0, rows)`` in the same layout (``transposed``: as ``_cache`` makes it)."""
    if transposed:
        return cache.transpose(-1, -2).index_select(0, rows).transpose(-1, -2)
    return cache.index_select(0, rows)


def _even(segs: list[tuple[int, slice | torch.Tensor]], rows: int) -> bool:
    """Whether the segments are prefixes 0, 1, ... in order, each a range of the same number of rows."""
    k = rows // max(len(segs), 1)
    return (
        all(
            isinstance(r, slice) and j == i and r.start == i * k and r.stop == (i + 1) * k
            for i, (j, r) in enumerate(segs)
        )
        and k * len(segs) == rows
    )


def _segments(grp: torch.Tensor) -> list[tuple[int, slice | torch.Tensor]]:
    """Each prefix's rows, computed once per cache reallocation: contiguous ranges when rows are grouped by prompt
    (the loop keeps them so), else index tensors."""
    g = grp.tolist()
    if any(a > b for a, b in zip(g, g[1:])):
        return [(j, (grp == j).nonzero()[:, 0]) for j in sorted(set(g))]
    segs: list[tuple[int, slice | torch.Tensor]] = []
    start = 0
    for i in range(1, len(g) + 1):
        if i == len(g) or g[i] != g[start]:
            segs.append((g[start], slice(start, i)))
            start = i
    return segs
