"""The fast engine's decode step compiled with ``torch.compile`` (``generator.compile``): the layer stack and the LM
head of one step as one inductor graph. Where the eager engine has prepacked oneDNN weights (CPU), the graph calls
its matmuls as they are, through an opaque custom op that names each by a handle (inductor cannot trace a prepacked
weight), ``rodeco::packed_linear``, a custom op in Python; inductor fuses what lies between them. On an Intel CPU in
fp32 those weights are packed for MKL's GEMM instead of oneDNN's (``CompiledStep.uses_mkl``; ``rodeco::mkl_linear``,
computed with the one packing at any batch size: a row's products do not depend on the batch, which ``FastWeights``
checks before it keeps them), the compiled decode 1.16x faster there. Elsewhere (CUDA) the matmuls are the model's
plain fused weights, folded into the graph by inductor's freezing. It reads the generator's fused weights (QKV,
gate+up: ``FastWeights``, not copied; the eager prefill of a compiled generator uses the same ones).

Attention, on CPU, is rodeco's own kernel (``rodeco.engines.native``, the opaque op ``rodeco::decode_attention``):
per row and KV head, the scores against the row's prompt keys (read through its prompt index, in place) and its own
keys, the softmax and the weighted values, in fp32, with keys stored by column. Elsewhere (CUDA; a CPU where the
kernel cannot be built, or a head_dim it does not fit) attention is written as products and sums
(``_attention``), which inductor turns into one loop per layer that reads each row's prompt keys and values through
the row's prompt index and its own keys and values once, with the scores, the softmax and the weighted values in
fp32 (the eager step's softmax is fp32 too). The step's matmuls and attention are where its time goes.

Shapes are dynamic (``dynamic=True``), not padded to buckets: the rows, the prompts, the prompt length and the rows'
own tokens are symbolic sizes, so rejections, finished rows, new rounds and new prompts reuse the graph; a graph is
compiled again only where dynamo specializes a size of 0 or 1 (one row, one prompt, the first own token), a bounded
handful (two in every run measured; ``CompiledStep.compiles`` counts them, ``tests/test_compile.py`` bounds them).
Nothing is padded. With inductor's attention the budget charges one transient beyond the eager step's
(``prompt_gather`` in ``rodeco.common.working``): the layer's prompt keys and values gathered per row, as written; in
the graphs inspected on CPU inductor fused the gather into the attention loop, so the charge is an upper bound. The
kernel gathers nothing, and the budget charges nothing for it.

A row's arithmetic does not depend on the other rows, the batch size or the round's capacity (the own tokens are the
slice ``:S + 1`` as in the eager step; under ``graphs`` the masked slots add nothing), so Speculative Rejection's
survivors are still Best-of-N's samples bit for bit under compile, with oneDNN's prepacked weights (CPU's). With the
plain weights (CUDA's) the matmuls may round otherwise at another batch size (on CPU, 1e-6 apart at 2, 4 and 6
rows); the GPU check's ``survivors`` step says whether CUDA's keep the samples. Against the eager step the logits
differ by round-off (inductor fuses and reorders).

``auto`` compiles on CUDA only: on CPU a graph of SmolLM2 takes minutes to compile (85 to 350 s for the two,
measured), which a short run does not win back; ``generator.compile=true`` asks for it (docs/results.md has the
speeds).

On CUDA the step runs one graph a round (``CompiledStep.graphs``), captured as a CUDA graph (inductor's
``triton.cudagraphs``): a CUDA graph holds fixed addresses and sizes, so the slot written is a tensor on the device
(the engine's ``s_dev``, incremented in place), attention reads the round's whole own capacity with the slots past
it masked (they hold zeros), and the caches are static inputs (inductor captures no graph that writes to any other
input). Sizes stay symbolic, so a new round (capacity, rows) records a new CUDA graph and compiles nothing. On CPU
the same step keeps a row's logits bit for bit at any capacity (``tests/test_compile.py``). **Untried on a GPU**: the
step logs so until ``scripts/gpu_check.py`` has run it.
"""

from __future__ import annotations

import itertools
import logging
import time
import types
import weakref
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch._dynamo.utils import counters

from rodeco.common.hardware import cpu_vendor, is_cpu, is_cuda
from rodeco.common.validation import ConfigError, check_compile
from rodeco.engines import Engine, HFModel, native
from rodeco.engines.llama import FastWeights, Linear, rms_norm, rope

log = logging.getLogger(__name__)


def compile_setting(value: Any, device: torch.device, engine: type[Engine]) -> bool:
    """``generator.compile`` as a bool for a model on ``device`` run by ``engine`` (an engine class): ``auto`` is
    True on CUDA with the fast engine, else False; ``true`` needs the fast engine."""
    v = check_compile(value)
    fast = bool(engine.compilable)
    if v == "true" and not fast:
        raise ConfigError(
            "generator.compile",
            value,
            f"only the fast engine's step is compiled, and this model runs on {engine.__name__}",
            "use generator.compile=auto or false, or generator.engine=fast",
        )
    return fast and (is_cuda(device) if v == "auto" else v == "true")


_PACKED: weakref.WeakValueDictionary[int, Linear] = weakref.WeakValueDictionary()  # handle -> prepacked linear
_HANDLES = itertools.count()


@torch.library.custom_op("rodeco::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """The fast engine's prepacked oneDNN linear ``handle`` applied to ``x``: an opaque call in the graph (inductor
    cannot trace a prepacked weight), so the compiled step keeps oneDNN's matmuls and fuses what lies between them."""
    return _PACKED[handle](x)


@packed_linear.register_fake
def _fake_linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], _PACKED[handle].w.shape[0])


def _handle(lin: Linear) -> int:
    """A new handle naming ``lin`` in the graph (``packed_linear``'s table, which forgets it when it is freed)."""
    h = next(_HANDLES)
    _PACKED[h] = lin
    return h


class _Weights(torch.nn.Module):
    """The step's plain weights: the fast engine's fused ones (``FastWeights``: one QKV, one gate+up matmul, shared,
    not copied) as parameters of a module, so inductor's freezing folds them into the graph as constants."""

    def __init__(self, model: HFModel, fused: FastWeights) -> None:
        super().__init__()

        def params(ts: list[torch.Tensor]) -> torch.nn.ParameterList:
            return torch.nn.ParameterList([torch.nn.Parameter(t.detach(), requires_grad=False) for t in ts])

        layers = fused.layers
        self.qkv = params([l.qkv.w for l in layers])
        biases = [l.qkv.b for l in layers if l.qkv.b is not None]
        self.qkv_bias = params(biases) if len(biases) == len(layers) else None
        self.o = params([l.o.w for l in layers])
        self.gate_up = params([l.gate_up.w for l in layers])
        self.down = params([l.down.w for l in layers])
        self.ln1 = params([l.ln1 for l in layers])
        self.ln2 = params([l.ln2 for l in layers])
        self.norm, self.head = params([model.model.norm.weight, fused.lm_head.w])


def _attention(
    q: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    ks: torch.Tensor,
    vs: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    own: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention as products and sums inductor fuses into loops that read each key and value once, in fp32:
    q [B, Hkv, g, D], the rows' prompt keys/values kp, vp [B, Hkv, P, D] and own ks, vs [B, Hkv, S, D], bias
    [B, 1, 1, P], ``own`` [S] which own slots hold tokens (None: all) -> [B, Hkv, g, D] in q's dtype."""
    qf = q.float()[:, :, :, None, :]
    sp = (qf * kp.float()[:, :, None]).sum(-1) * scale + bias
    so = (qf * ks.float()[:, :, None]).sum(-1) * scale
    if own is not None:  # the round's whole capacity: slots not yet written weigh nothing (they hold zeros)
        so = so.masked_fill(~own, float("-inf"))
    p = torch.softmax(torch.cat([sp, so], dim=-1), dim=-1)[..., None]  # [B, Hkv, g, P + S, 1]
    P = kp.shape[2]
    o = (p[:, :, :, :P] * vp.float()[:, :, None]).sum(-2) + (p[:, :, :, P:] * vs.float()[:, :, None]).sum(-2)
    return o.to(q.dtype)


class _Step(torch.nn.Module):
    """One decode step's layers and head as a pure function of its tensors (the caches written in place).
    ``packed``: call the engine's prepacked matmuls where it has them (CPU); False, or where it has none (CUDA): the
    plain weights, folded by freezing. ``kernel``: attention by rodeco's kernel (``rodeco.engines.native``: keys
    by column), else by ``_attention``."""

    def __init__(
        self,
        model: HFModel,
        fused: FastWeights,
        h: int,
        hkv: int,
        d: int,
        eps: float,
        packed: bool = True,
        kernel: bool = False,
        graphs: bool = False,
    ) -> None:
        super().__init__()
        self.w = _Weights(model, fused)
        self.h, self.hkv, self.d, self.eps, self.scale = h, hkv, d, eps, d**-0.5
        self.kernel, self.graphs = kernel, graphs
        layers = fused.layers
        lins = {
            "qkv": [l.qkv for l in layers],
            "o": [l.o for l in layers],
            "gate_up": [l.gate_up for l in layers],
            "down": [l.down for l in layers],
            "head": [fused.lm_head],
        }
        self.fused = fused  # the prepacked linears the handles name live as long as the step
        packs = packed and all(x.packed is not None or x.mkl is not None for ls in lins.values() for x in ls)
        self.handles = {n: [_handle(x) for x in ls] for n, ls in lins.items()} if packs else None

    def _linear(self, x: torch.Tensor, name: str, li: int) -> torch.Tensor:
        if self.handles is not None:
            return packed_linear(x, self.handles[name][li])
        w = self.w.head if name == "head" else getattr(self.w, name)[li]
        b = self.w.qkv_bias[li] if name == "qkv" and self.w.qkv_bias is not None else None
        return F.linear(x, w, b)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pbias: torch.Tensor,
        grp: torch.Tensor,
        s: int | torch.Tensor,
        kp: list[torch.Tensor],
        vp: list[torch.Tensor],
        k: list[torch.Tensor],
        v: list[torch.Tensor],
        at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, hidden] embedded tokens, cos/sin [B, 1, D], pbias [G, P] the prompts' bias, grp [B] each row's
        prompt, ``s`` the own slot written this step (with ``graphs``: a tensor [1] on the device, and attention reads
        the round's whole own capacity, masked past ``s``) -> (logits [B, V], the final normed hidden state [B,
        hidden]). ``at`` [B]: rows of different lengths (prompts that joined a running batch): each row writes its
        own slot ``at[row]`` (``s`` is the longest row's) and reads its own slots up to it, by inductor's attention
        (rodeco's kernel reads every row to ``s``)."""
        B, g, w = x.shape[0], self.h // self.hkv, self.w
        hd, kd = self.h * self.d, self.hkv * self.d
        kernel = self.kernel and at is None
        bias = None if kernel else pbias.index_select(0, grp)[:, None, None, :]  # [B, 1, 1, P]
        own = torch.arange(k[0].shape[2], device=x.device) <= s if self.graphs else None  # [capacity]
        if at is not None:  # [B, 1, 1, s + 1]: each row's own slots
            own = (torch.arange(k[0].shape[2], device=x.device)[: s + 1][None] <= at[:, None])[:, None, None]
        for li in range(len(w.qkv)):
            qkv = self._linear(rms_norm(x, w.ln1[li], self.eps), "qkv", li)
            q, kn, vn = qkv.split([hd, kd, kd], dim=-1)
            q = rope(q.view(B, self.h, self.d), cos, sin).view(B, self.hkv, g, self.d)
            kn = rope(kn.view(B, self.hkv, self.d), cos, sin)[:, :, None]
            if at is not None:  # each row its own slot
                assert isinstance(s, int)  # rows of different lengths run without graphs
                slot = at[:, None, None, None].expand(B, self.hkv, 1, self.d)
                k[li].scatter_(2, slot, kn)
                v[li].scatter_(2, slot, vn.view(B, self.hkv, 1, self.d))
                ks, vs = k[li][:, :, : s + 1], v[li][:, :, : s + 1]
            elif self.graphs:  # the slot from a tensor: one graph (and one CUDA graph) serves every step of a round
                assert isinstance(s, torch.Tensor)  # with graphs, ``s`` is the slot tensor
                k[li].index_copy_(2, s, kn)
                v[li].index_copy_(2, s, vn.view(B, self.hkv, 1, self.d))
                ks, vs = k[li], v[li]
            else:
                k[li].narrow(2, s, 1).copy_(kn)
                v[li].narrow(2, s, 1).copy_(vn.view(B, self.hkv, 1, self.d))  # narrow: ``[:, :, s] =`` specializes s
                ks, vs = k[li][:, :, : s + 1], v[li][:, :, : s + 1]
            if kernel:
                o = native.decode_attention(q, kp[li], vp[li], grp, pbias, ks, vs, self.scale)
            else:
                assert bias is not None  # computed above for attention without the kernel
                kpr, vpr = kp[li].index_select(0, grp), vp[li].index_select(0, grp)  # [B, Hkv, P, D]
                o = _attention(q, kpr, vpr, ks, vs, bias, self.scale, own)
            x = x + self._linear(o.reshape(B, -1), "o", li)
            gate, up = self._linear(rms_norm(x, w.ln2[li], self.eps), "gate_up", li).chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, "down", li)
        hidden = rms_norm(x, w.norm, self.eps)
        return self._linear(hidden, "head", 0), hidden


class _PagedStep(_Step):
    """The paged engine's step (``rodeco.engines.paged``): each layer writes the rows' new keys and values into their
    blocks of the layer's pools in place, and attends over each row's own blocks (rodeco's paged kernel on CPU,
    ``native.paged_reference``'s gather elsewhere)."""

    def forward(  # type: ignore[override]  # the paged cache's arguments
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        blk: torch.Tensor,
        off: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        kpool: list[torch.Tensor],
        vpool: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, hidden], cos/sin [B, 1, D], the block and offset each row writes ``blk``, ``off`` [B], the rows'
        block tables [B, M] and tokens ``lens`` [B] (this step's included), the layers' pools -> (logits [B, V], the
        final normed hidden state [B, hidden])."""
        B, g, w = x.shape[0], self.h // self.hkv, self.w
        hd, kd = self.h * self.d, self.hkv * self.d
        attend = native.paged_attention if self.kernel else native.paged_reference
        for li in range(len(w.qkv)):
            qkv = self._linear(rms_norm(x, w.ln1[li], self.eps), "qkv", li)
            q, kn, vn = qkv.split([hd, kd, kd], dim=-1)
            q = rope(q.view(B, self.h, self.d), cos, sin).view(B, self.hkv, g, self.d)
            kpool[li][blk, :, :, off] = rope(kn.view(B, self.hkv, self.d), cos, sin)
            vpool[li][blk, :, off] = vn.view(B, self.hkv, self.d)
            o = attend(q, kpool[li], vpool[li], tables, lens, self.scale)
            x = x + self._linear(o.reshape(B, -1), "o", li)
            gate, up = self._linear(rms_norm(x, w.ln2[li], self.eps), "gate_up", li).chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, "down", li)
        hidden = rms_norm(x, w.norm, self.eps)
        return self._linear(hidden, "head", 0), hidden


def _heads(model: HFModel) -> tuple[int, int, int]:
    """The model's query heads, KV heads and head_dim (``rodeco.engines.fast.supports``' models)."""
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_attention_heads, c.num_key_value_heads, d


def _kernel_serves(head_dim: int, group: int, cuda: bool, paged: bool = False) -> bool:
    """Where the compiled step's attention is rodeco's kernel by default: on CPU, a model it fits, once built. It
    is paired against inductor's attention by ``scripts/kernel_pairs.py`` (docs/results.md); the paged kernel
    against the torch gather by ``scripts/paged_pairs.py``."""
    kernel = "paged_attention" if paged else "decode_attention"
    return not cuda and native.fits(head_dim, group) and native.available(kernel)


class CompiledStep:
    """The compiled step of one model, built once per generator and shared by its sessions' engines. ``compiles``:
    graphs inductor has compiled for it; ``compile_seconds``: the time they took (first calls of new shapes);
    ``cudagraph_skips``: graphs inductor declined to capture as CUDA graphs (its reason is in the
    ``TORCH_LOGS=cudagraphs`` log).

    ``graphs`` (by default on CUDA): the step of a round is one graph, captured once as a CUDA graph: the slot written
    is a tensor on the device, attention reads the round's whole own capacity masked past it, and the engine marks
    its caches as static inputs (``torch._dynamo.mark_static_address``), zeroes their unwritten slots, and copies the
    outputs out of the graph's memory. Each new round (new caches, rows or capacity) records a graph again."""

    def __init__(
        self,
        model: HFModel,
        fused: FastWeights,
        h: int,
        hkv: int,
        d: int,
        eps: float,
        packed: bool = True,
        kernel: bool | None = None,
        graphs: bool | None = None,
        paged: bool = False,
    ) -> None:
        p = next(model.parameters())
        self.cuda = is_cuda(p.device)
        self.paged = paged  # the paged engine's step (``_PagedStep``): never one graph a round
        self.graphs = (self.cuda if graphs is None else graphs) and not paged
        if self.graphs and self.cuda:
            log.warning(
                "the compiled step runs one CUDA graph a round, which is untried on a GPU: tested on CPU only, "
                "until scripts/gpu_check.py's engine_bench, syncs and survivors steps run it"
            )
        # rodeco's attention kernel, which reads keys by column (``keys_by_column``); not under ``graphs``
        serves = _kernel_serves(d, h // hkv, self.cuda, paged)
        self.kernel = (serves if kernel is None else kernel) and not self.graphs
        step = _PagedStep if paged else _Step
        self.module = step(model, fused, h, hkv, d, eps, packed, self.kernel, self.graphs).eval()
        self.compiles = 0
        self.compile_seconds = 0.0
        self.cudagraph_skips = 0
        # dynamo keeps compiled graphs (and its recompile limit) per code object: each step gets a code object of its
        # own, so another model's or dtype's step never evicts this one's graphs nor exhausts its limit
        fwd = step.forward
        own = types.FunctionType(
            fwd.__code__.replace(), fwd.__globals__, fwd.__name__, fwd.__defaults__, fwd.__closure__
        )
        self.fn = torch.compile(types.MethodType(own, self.module), dynamic=True, backend=self._backend)

    @property
    def keys_by_column(self) -> bool:
        """Whether the engine stores keys by column (``[..., head_dim, tokens]``), prompt and own: the kernel's
        layout."""
        return self.kernel

    @staticmethod
    def uses_kernel(model: HFModel) -> bool:
        """Whether the compiled step of ``model`` runs rodeco's attention kernel (``_kernel_serves``: CPU, a head_dim
        and group it fits, the kernel built)."""
        h, hkv, d = _heads(model)
        return _kernel_serves(d, h // hkv, is_cuda(next(model.parameters()).device))

    @staticmethod
    def uses_mkl(model: HFModel) -> bool:
        """Whether the compiled step of ``model`` asks for its weights packed for MKL's GEMM (``rodeco::mkl_linear``;
        the engine's ``prepare(model, mkl=True)``, which keeps oneDNN's where MKL's rows would depend on the batch)
        rather than oneDNN's: on an Intel CPU, in fp32, where rodeco's kernels are built and PyTorch carries MKL. On an
        Intel Xeon it made the compiled decode 1.16x faster (docs/results.md); on AMD EPYC MKL's GEMM took 3 to 4
        times oneDNN's, and oneDNN stays."""
        p = next(model.parameters())
        return (
            is_cpu(p.device)
            and p.dtype == torch.float32
            and cpu_vendor() == "GenuineIntel"
            and native.available("mkl_linear")
        )

    @classmethod
    def of(
        cls,
        model: HFModel,
        fused: FastWeights,
        packed: bool = True,
        kernel: bool | None = None,
        graphs: bool | None = None,
        paged: bool = False,
    ) -> CompiledStep:
        """The compiled step of a model the fast engine runs (``rodeco.engines.fast.supports``), from the fused
        weights its engines use (``packed``: as ``_Step``'s; ``kernel``: rodeco's attention kernel, by default
        where ``uses_kernel``; ``graphs``: one graph a round, by default on CUDA; ``paged``: the paged engine's step,
        ``_PagedStep``, without graphs)."""
        return cls(model, fused, *_heads(model), model.config.rms_norm_eps, packed, kernel, graphs, paged)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        log.info("compiling the decode step (graph %d)", self.compiles + 1)
        patches = {"freezing": True, "triton.cudagraphs": self.cuda and self.graphs}
        skips = counters["inductor"]["cudagraph_skips"]
        out = compile_fx(gm, example_inputs, config_patches=patches)
        self.cudagraph_skips += counters["inductor"]["cudagraph_skips"] - skips
        self.compiles += 1  # counted once compiled: dynamo may restart a trace midway (a float argument specialized)
        return out

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``_Step.forward``'s arguments -> (logits, the final normed hidden state)."""
        before, t0 = self.compiles, time.perf_counter()
        if self.graphs and self.cuda:  # the previous step's outputs were copied out: the graph may reuse its memory
            torch.compiler.cudagraph_mark_step_begin()
        # use_duck_shape=False: sizes that happen to be equal (rows, prompt length) stay apart
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]  # patch() is set at import: no stub
            out = self.fn(*args)
        if self.graphs and self.cuda:  # a CUDA graph's outputs live in its memory, which its next replay overwrites
            out = (out[0].clone(), out[1].clone())
        if self.compiles != before:
            self.compile_seconds += time.perf_counter() - t0
        return out

    @staticmethod
    def adopt(tensors: list[torch.Tensor]) -> None:
        """Mark an engine's new caches as static inputs (``graphs``): written in place by the graph, at addresses a
        CUDA graph keeps (a new address records the graph again; dynamo does not recompile for it)."""
        for t in tensors:
            torch._dynamo.mark_static_address(t, guard=False)
