"""The fast engine's decode step compiled with ``torch.compile`` (``generator.compile``): the layer stack and the LM
head of one step as one inductor graph, from the model's plain weights with inductor's freezing (constants folded,
weights prepacked by inductor itself: the engine's own prepacked oneDNN weights cannot be traced). It reads the
eager engine's fused weights (QKV, gate+up: ``FastWeights``, not copied) and holds inductor's folded constants, as
the eager step holds its prepacked ones.

Shapes are dynamic (``dynamic=True``), not padded to buckets: the rows, the prompts, the prompt length and the rows'
own tokens are symbolic sizes, so rejections, finished rows, new rounds and new prompts reuse the graph; a graph is
compiled again only where dynamo specializes a size of 0 or 1 (one row, one prompt, the first own token), a bounded
handful (two in every run measured; ``CompiledStep.compiles`` counts them, ``tests/test_compile.py`` bounds them).
Nothing is padded, so nothing is charged to the budget beyond what the eager step holds, but for one transient: a
layer's prompt keys and values are gathered per row (``[rows, kv_heads, P, head_dim]``, one layer at a time), where
the eager step reads each prompt's once for all its rows, a loop over prompts that would recompile as their rows
change.

A row's arithmetic does not depend on the other rows, the batch size or the round's capacity (the own tokens are the
slice ``:S + 1`` as in the eager step), so Speculative Rejection's survivors are still Best-of-N's samples bit for
bit under compile. Against the eager step the logits differ by round-off (inductor fuses and reorders).

``auto`` compiles on CUDA only. On the CPU measured (docs/results.md, issue 29) the compiled step decoded 0.89x to
1.06x the eager step's tokens a second in bf16 and about half in fp32, where oneDNN's prepacked weights beat
inductor's, after about 100 s of compiling each graph of SmolLM2; ``generator.compile=true`` asks for it anyway.
On CUDA the graph is captured as CUDA graphs (inductor's ``triton.cudagraphs``, one per shape seen); that path has
not run on a GPU yet.
"""

from __future__ import annotations

import logging
import time
import types
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F

from rodeco.engines.fast import FastWeights, _rms_norm, _rope
from rodeco.validation import ConfigError, check_compile

log = logging.getLogger(__name__)

def compile_setting(value: Any, device: torch.device, engine: type) -> bool:
    """``generator.compile`` as a bool for a model on ``device`` run by ``engine`` (an engine class): ``auto`` is
    True on CUDA with the fast engine, else False; ``true`` needs the fast engine."""
    v = check_compile(value)
    fast = getattr(engine, "compilable", False)
    if v == "true" and not fast:
        raise ConfigError("generator.compile", value, f"only the fast engine's step is compiled, and this model runs "
                          f"on {engine.__name__}", "use generator.compile=auto or false, or generator.engine=fast")
    return fast and (device.type == "cuda" if v == "auto" else v == "true")


class _Weights(torch.nn.Module):
    """The step's plain weights: the fast engine's fused ones (``FastWeights``: one QKV, one gate+up matmul, shared,
    not copied) as parameters of a module, so inductor's freezing folds them into the graph as constants."""

    def __init__(self, model: torch.nn.Module, fused: FastWeights) -> None:
        super().__init__()

        def params(ts: list[torch.Tensor]) -> torch.nn.ParameterList:
            return torch.nn.ParameterList([torch.nn.Parameter(t.detach(), requires_grad=False) for t in ts])

        layers = fused.layers
        self.qkv = params([l.qkv.w for l in layers])
        self.qkv_bias = params([l.qkv.b for l in layers]) if all(l.qkv.b is not None for l in layers) else None
        self.o = params([l.o.w for l in layers])
        self.gate_up = params([l.gate_up.w for l in layers])
        self.down = params([l.down.w for l in layers])
        self.ln1 = params([l.ln1 for l in layers])
        self.ln2 = params([l.ln2 for l in layers])
        self.norm, self.head = params([model.model.norm.weight, fused.lm_head.w])


class _Step(torch.nn.Module):
    """One decode step's layers and head as a pure function of its tensors (the caches written in place)."""

    def __init__(self, model: torch.nn.Module, fused: FastWeights, h: int, hkv: int, d: int, eps: float) -> None:
        super().__init__()
        self.w = _Weights(model, fused)
        self.h, self.hkv, self.d, self.eps, self.scale = h, hkv, d, eps, d ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, grp: torch.Tensor,
                s: int, kp: list[torch.Tensor], vp: list[torch.Tensor], k: list[torch.Tensor],
                v: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, hidden] embedded tokens, cos/sin [B, 1, D], bias [B, 1, 1, P], grp [B] each row's prompt, ``s`` the
        own slot written this step -> (logits [B, V], the final normed hidden state [B, hidden])."""
        B, g, w = x.shape[0], self.h // self.hkv, self.w
        hd, kd = self.h * self.d, self.hkv * self.d
        for li in range(len(w.qkv)):
            bias_qkv = w.qkv_bias[li] if w.qkv_bias is not None else None
            qkv = F.linear(_rms_norm(x, w.ln1[li], self.eps), w.qkv[li], bias_qkv)
            q, kn, vn = qkv.split([hd, kd, kd], dim=-1)
            q = _rope(q.view(B, self.h, self.d), cos, sin).view(B, self.hkv, g, self.d)
            k[li].narrow(2, s, 1).copy_(_rope(kn.view(B, self.hkv, self.d), cos, sin)[:, :, None])
            v[li].narrow(2, s, 1).copy_(vn.view(B, self.hkv, 1, self.d))  # narrow: ``[:, :, s] =`` specializes s
            kpr, vpr = kp[li].index_select(0, grp), vp[li].index_select(0, grp)  # [B, Hkv, P, D]
            ks, vs = k[li][:, :, : s + 1], v[li][:, :, : s + 1]
            sp = (q @ kpr.transpose(-1, -2)).float() * self.scale + bias
            so = (q @ ks.transpose(-1, -2)).float() * self.scale
            p = torch.softmax(torch.cat([sp, so], dim=-1), dim=-1).to(q.dtype)
            P = kpr.shape[2]
            o = p[..., :P] @ vpr + p[..., P:] @ vs
            x = x + F.linear(o.reshape(B, -1), w.o[li])
            gate, up = F.linear(_rms_norm(x, w.ln2[li], self.eps), w.gate_up[li]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w.down[li])
        hidden = _rms_norm(x, w.norm, self.eps)
        return F.linear(hidden, w.head), hidden


class CompiledStep:
    """The compiled step of one model, built once per generator and shared by its sessions' engines. ``compiles``:
    graphs inductor has compiled for it; ``compile_seconds``: the time they took (first calls of new shapes)."""

    def __init__(self, model: torch.nn.Module, fused: FastWeights, h: int, hkv: int, d: int, eps: float) -> None:
        self.module = _Step(model, fused, h, hkv, d, eps).eval()
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.compiles = 0
        self.compile_seconds = 0.0
        # dynamo keeps compiled graphs (and its recompile limit) per code object: each step gets a code object of its
        # own, so another model's or dtype's step never evicts this one's graphs nor exhausts its limit
        fwd = _Step.forward
        own = types.FunctionType(fwd.__code__.replace(), fwd.__globals__, fwd.__name__, fwd.__defaults__,
                                 fwd.__closure__)
        self.fn = torch.compile(types.MethodType(own, self.module), dynamic=True, backend=self._backend)

    @classmethod
    def of(cls, model: torch.nn.Module, fused: FastWeights) -> CompiledStep:
        """The compiled step of a model the fast engine runs (``rodeco.engines.fast.supports``), from the fused
        weights its engines use."""
        c = model.config
        d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(model, fused, c.num_attention_heads, c.num_key_value_heads, d, c.rms_norm_eps)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        self.compiles += 1
        log.info("compiling the decode step (graph %d)", self.compiles)
        patches = {"freezing": True, "triton.cudagraphs": self.cuda}
        return compile_fx(gm, example_inputs, config_patches=patches)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``_Step.forward``'s arguments -> (logits, the final normed hidden state)."""
        before, t0 = self.compiles, time.perf_counter()
        with fx_config.patch(use_duck_shape=False):  # sizes that happen to be equal (rows, prompt length) stay apart
            out = self.fn(*args)
        if self.compiles != before:
            self.compile_seconds += time.perf_counter() - t0
        return out
