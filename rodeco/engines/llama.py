"""What the Llama engine's prefill, eager step (``rodeco.engines.fast``) and compiled step
(``rodeco.engines.compiled``) share: the one decoder layer (``decoder_layer``), which writes and attends through a
cache object (``PromptCache`` for a prefill, ``StepCache`` for a decode step), the RMS norm, the rotary embedding, and
the fused, prepacked weights (``FastWeights``: one QKV and one gate+up matmul per layer, and the LM head) with their
linear (``Linear``).

On CPU the weights are prepacked for oneDNN's matmul (the blocked layout PyTorch's own compiler uses), about 1.3x
faster than plain ``F.linear`` at decode batch sizes; they hold a second copy of the weights in memory. With ``mkl``
(the compiled step on an Intel CPU in fp32) they are packed for MKL's GEMM instead, through rodeco's native ops
(``rodeco.engines.native``), kept only if a row's products come out the same at every batch size
(``row_invariant``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rodeco.common.hardware import is_cpu
from rodeco.engines import HFModel, native

log = logging.getLogger(__name__)


class Linear:
    """``F.linear`` with weights prepacked for oneDNN on CPU when this build of PyTorch allows it; with ``mkl``,
    packed for MKL's GEMM instead (``rodeco::mkl_pack``: the compiled step's on an Intel CPU in fp32, where rodeco's
    kernels are built)."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, batch_hint: int = 64, mkl: bool = False) -> None:
        self.w, self.b, self.packed, self.mkl = w, b, None, None
        if mkl:
            self.mkl = native.mkl_pack(w.detach())
        elif is_cpu(w.device) and w.dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), batch_hint)
                x = torch.zeros(1, w.shape[1], dtype=w.dtype)
                torch.ops.mkldnn._linear_pointwise(x, packed, self.b, "none", [], "")
                self.packed = packed
            except (RuntimeError, AttributeError):  # an op this build lacks: plain linear
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mkl is not None:
            return native.mkl_linear(x, self.mkl, self.b, self.w.shape[0])
        if self.packed is None:
            return F.linear(x, self.w, self.b)
        flat = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.b, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class PagedCache:
    """Where a decoder layer's keys and values go, and what its queries attend to (``decoder_layer``)."""

    def attend(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write layer ``li``'s new keys ``k`` and values ``v`` into the cache, then attend with queries ``q``;
        shapes ``[..., heads, head_dim]`` -> ``[..., heads, head_dim]``."""
        raise NotImplementedError


@dataclass
class PromptCache(PagedCache):
    """A prefill's cache: prompts left-padded to ``[G, L]``; the valid tokens (``at``: their flat indices in
    ``G * L``, prompt by prompt) written into the pools at blocks ``blk``, offsets ``off``; attention over the prompt
    itself (``mask`` [G, 1, L, L]: causal, the pad masked), one layer's keys held at a time."""

    kpool: list[torch.Tensor]
    vpool: list[torch.Tensor]
    blk: torch.Tensor
    off: torch.Tensor
    at: torch.Tensor
    mask: torch.Tensor
    scale: float

    def attend(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        G, L, Hkv, D = k.shape
        self.kpool[li][self.blk, :, :, self.off] = k.reshape(G * L, Hkv, D)[self.at]
        self.vpool[li][self.blk, :, self.off] = v.reshape(G * L, Hkv, D)[self.at]
        g = q.shape[2] // Hkv
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [G, heads, L, D]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=self.scale)
        return o.transpose(1, 2)


@dataclass
class StepCache(PagedCache):
    """A decode step's cache: each row's new token written at block ``blk``, offset ``off`` [B] of the pools; its
    query heads attend over its own blocks (``tables`` [B, M], ``lens`` [B] slots, this token's included, the first
    ``starts`` [B] its prompt's padding) by ``kernel`` (``native.paged_attention`` or ``native.paged_reference``)."""

    kpool: list[torch.Tensor]
    vpool: list[torch.Tensor]
    blk: torch.Tensor
    off: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    starts: torch.Tensor
    scale: float
    kernel: Callable[..., torch.Tensor]

    def attend(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, H, D = q.shape
        Hkv = k.shape[1]
        self.kpool[li][self.blk, :, :, self.off] = k
        self.vpool[li][self.blk, :, self.off] = v
        # the query heads of one KV head as a sequence: [B, Hkv, g, D]
        q4 = q.view(B, Hkv, H // Hkv, D)
        o = self.kernel(q4, self.kpool[li], self.vpool[li], self.tables, self.lens, self.starts, self.scale)
        return o.reshape(B, H, D)


def decoder_layer(
    x: torch.Tensor,
    li: int,
    linear: Callable[[torch.Tensor, str, int], torch.Tensor],
    ln1: torch.Tensor,
    ln2: torch.Tensor,
    h: int,
    hkv: int,
    d: int,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: PagedCache,
) -> torch.Tensor:
    """Layer ``li`` of a Llama-family model: ``x`` [..., hidden] -> [..., hidden]; ``linear(x, name, li)`` applies its
    ``qkv``, ``o``, ``gate_up`` and ``down`` weights; ``cos``/``sin`` broadcast over the heads; ``cache`` writes the
    keys and values and attends."""
    lead = x.shape[:-1]
    q, k, v = linear(rms_norm(x, ln1, eps), "qkv", li).split([h * d, hkv * d, hkv * d], dim=-1)
    q = rope(q.view(*lead, h, d), cos, sin)
    k = rope(k.view(*lead, hkv, d), cos, sin)
    o = cache.attend(li, q, k, v.view(*lead, hkv, d))
    x = x + linear(o.reshape(*lead, h * d), "o", li)
    gate, up = linear(rms_norm(x, ln2, eps), "gate_up", li).chunk(2, dim=-1)
    return x + linear(F.silu(gate) * up, "down", li)


class Layer:
    def __init__(self, layer: HFModel, mkl: bool = False) -> None:
        a, m = layer.self_attn, layer.mlp
        b = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
        self.qkv = Linear(
            torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
            torch.cat(b).contiguous() if all(x is not None for x in b) else None,
            mkl=mkl,
        )
        self.o = Linear(a.o_proj.weight, a.o_proj.bias, mkl=mkl)
        self.gate_up = Linear(torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(), mkl=mkl)
        self.down = Linear(m.down_proj.weight, mkl=mkl)
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight


class FastWeights:
    """What the fast engine computes with besides the model: each layer's fused weights (one QKV, one gate+up),
    prepacked for oneDNN on CPU, and the LM head's; read from the model's weights when built. ``mkl``: packed for
    MKL's GEMM instead (``Linear``), if its rows come out the same at every batch size (``row_invariant``), else
    oneDNN's, with a warning."""

    def __init__(self, model: HFModel, mkl: bool = False) -> None:
        self.layers = [Layer(l, mkl) for l in model.model.layers]
        self.lm_head = Linear(model.lm_head.weight, mkl=mkl)
        self.mkl = mkl
        if mkl and not all(row_invariant(x) for x in {(x.w.shape, x.b is None): x for x in self.linears()}.values()):
            log.warning(
                "MKL's packed GEMM gave a row other products at another batch size on this CPU, so Speculative "
                "Rejection's survivors would not be Best-of-N's samples; the weights are prepacked for oneDNN"
            )
            FastWeights.__init__(self, model)

    @property
    def linear(self) -> str:
        """The linear kernel its matmuls run: ``mkl`` (MKL's packed GEMM), ``onednn`` (prepacked) or ``torch``
        (``F.linear``: a device or build without oneDNN's prepacking)."""
        return "mkl" if self.mkl else "onednn" if self.lm_head.packed is not None else "torch"

    def linears(self) -> list[Linear]:
        """Every linear: the layers' and the LM head's."""
        return [x for l in self.layers for x in (l.qkv, l.o, l.gate_up, l.down)] + [self.lm_head]


ROWS_CHECKED = (1, 2, 3, 5, 8, 17, 33, 64, 65)  # batch sizes ``row_invariant`` computes, against 80 rows


def row_invariant(lin: Linear) -> bool:
    """Whether ``lin`` gives each row the same output bit for bit at every batch size in ``ROWS_CHECKED`` as in a
    batch of 80 (random rows, seeded): what keeps a row's tokens independent of the rows beside it."""
    x = torch.randn(80, lin.w.shape[1], generator=torch.Generator().manual_seed(0)).to(lin.w.dtype)
    full = lin(x)
    return all(torch.equal(lin(x[:m].contiguous()), full[:m]) for m in ROWS_CHECKED)
