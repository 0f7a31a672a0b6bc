"""The Llama engine's decode step compiled with ``torch.compile`` (``generator.compile``): the layer stack and the
LM head of one step as one inductor graph, through the same decoder layer as the eager step
(``rodeco.engines.llama.decoder_layer`` with a ``StepCache``: each layer writes the rows' new keys and values into
their blocks of the layer's pools in place, and attends over each row's own blocks). Where the eager engine has
prepacked oneDNN weights (CPU), the graph calls its matmuls as they are, through an opaque custom op that names each
by a handle (inductor cannot trace a prepacked weight), ``rodeco::packed_linear``, a custom op in Python; inductor
fuses what lies between them. On an Intel CPU in fp32 those weights are packed for MKL's GEMM instead of oneDNN's
(``CompiledStep.uses_mkl``; ``rodeco::mkl_linear``, computed with the one packing at any batch size: a row's products
do not depend on the batch, which ``FastWeights`` checks before it keeps them). Elsewhere (CUDA) the matmuls are the
model's plain fused weights, folded into the graph by inductor's freezing. It reads the generator's fused weights
(``FastWeights``, not copied; the eager prefill of a compiled generator uses the same ones).

Attention, on CPU, is rodeco's paged kernel (``rodeco.engines.native``, the opaque op ``rodeco::paged_attention``),
which reads each row's blocks in place; elsewhere (CUDA; a CPU where the kernel cannot be built, or a head_dim it
does not fit) it is the torch path the kernel replaces (``native.paged_reference``: the row's blocks gathered, two
matmuls in fp32), which the budget charges as a transient (``prompt_gather`` in ``rodeco.common.working``).

Shapes are dynamic (``dynamic=True``), not padded to buckets: the rows, the block tables' width and the pool are
symbolic sizes, so rejections, finished rows, new rounds and new prompts reuse the graph; a graph is compiled again
only where dynamo specializes a size of 0 or 1, a bounded handful (``CompiledStep.compiles`` counts them,
``tests/test_compile.py`` bounds them). The step is never captured as a CUDA graph: a CUDA graph holds fixed sizes,
and a step's block tables change width as rows grow; on a GPU the compiled step runs as inductor's kernels, and
``generator.engine=vllm`` is the serving path.

A row's arithmetic does not depend on the other rows or the batch size, so Speculative Rejection's survivors are
Best-of-N's samples under compile, with oneDNN's prepacked weights (CPU's). With the plain weights (CUDA's) the
matmuls may round otherwise at another batch size; the GPU check's ``survivors`` step says whether CUDA's keep the
samples. Against the eager step the logits differ by round-off (inductor fuses and reorders).

``auto`` compiles on CUDA only: on CPU a graph of SmolLM2 takes minutes to compile, which a short run does not win
back; ``generator.compile=true`` asks for it (docs/results.md has the speeds).
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

from rodeco.common.hardware import cpu_vendor, is_cpu, is_cuda
from rodeco.common.validation import ConfigError, check_compile
from rodeco.engines import Engine, HFModel, native
from rodeco.engines.llama import FastWeights, Linear, StepCache, decoder_layer, rms_norm

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


class _Step(torch.nn.Module):
    """One decode step's layers and head as a pure function of its tensors (the pools written in place).
    ``packed``: call the engine's prepacked matmuls where it has them (CPU); False, or where it has none (CUDA): the
    plain weights, folded by freezing. ``kernel``: attention by rodeco's paged kernel, else by
    ``native.paged_reference``."""

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
    ) -> None:
        super().__init__()
        self.w = _Weights(model, fused)
        self.h, self.hkv, self.d, self.eps, self.scale = h, hkv, d, eps, d**-0.5
        self.kernel = kernel
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
        blk: torch.Tensor,
        off: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        starts: torch.Tensor,
        kpool: list[torch.Tensor],
        vpool: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, hidden], cos/sin [B, 1, D], the block and offset each row writes ``blk``, ``off`` [B], the rows'
        block tables [B, M], slots ``lens`` [B] (this step's included) and prompt padding ``starts`` [B], the layers'
        pools -> (logits [B, V], the final normed hidden state [B, hidden])."""
        w = self.w
        attend = native.paged_attention if self.kernel else native.paged_reference
        cache = StepCache(kpool, vpool, blk, off, tables, lens, starts, self.scale, attend)
        for li in range(len(w.qkv)):
            x = decoder_layer(
                x, li, self._linear, w.ln1[li], w.ln2[li], self.h, self.hkv, self.d, self.eps, cos, sin, cache
            )
        hidden = rms_norm(x, w.norm, self.eps)
        return self._linear(hidden, "head", 0), hidden


def _heads(model: HFModel) -> tuple[int, int, int]:
    """The model's query heads, KV heads and head_dim (``rodeco.engines.fast.supports``' models)."""
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_attention_heads, c.num_key_value_heads, d


def _kernel_serves(head_dim: int, group: int, cuda: bool) -> bool:
    """Where the compiled step's attention is rodeco's paged kernel by default: on CPU, a model it fits, once built.
    It is paired against the torch gather it replaces by ``scripts/paged_pairs.py`` (docs/results.md)."""
    return not cuda and native.fits(head_dim, group) and native.available("paged_attention")


class CompiledStep:
    """The compiled step of one model, built once per generator and shared by its sessions' engines. ``compiles``:
    graphs inductor has compiled for it; ``compile_seconds``: the time they took (first calls of new shapes)."""

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
    ) -> None:
        p = next(model.parameters())
        self.cuda = is_cuda(p.device)
        serves = _kernel_serves(d, h // hkv, self.cuda)
        self.kernel = serves if kernel is None else kernel
        self.module = _Step(model, fused, h, hkv, d, eps, packed, self.kernel).eval()
        self.compiles = 0
        self.compile_seconds = 0.0
        # dynamo keeps compiled graphs (and its recompile limit) per code object: each step gets a code object of its
        # own, so another model's or dtype's step never evicts this one's graphs nor exhausts its limit
        fwd = _Step.forward
        own = types.FunctionType(
            fwd.__code__.replace(), fwd.__globals__, fwd.__name__, fwd.__defaults__, fwd.__closure__
        )
        self.fn = torch.compile(types.MethodType(own, self.module), dynamic=True, backend=self._backend)

    @staticmethod
    def uses_kernel(model: HFModel) -> bool:
        """Whether the compiled step of ``model`` runs rodeco's paged kernel (``_kernel_serves``: CPU, a head_dim
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
    def of(cls, model: HFModel, fused: FastWeights, packed: bool = True, kernel: bool | None = None) -> CompiledStep:
        """The compiled step of a model the Llama engine runs (``rodeco.engines.fast.supports``), from the fused
        weights its engines use (``packed``: as ``_Step``'s; ``kernel``: rodeco's paged kernel, by default where
        ``uses_kernel``)."""
        return cls(model, fused, *_heads(model), model.config.rms_norm_eps, packed, kernel)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._inductor.compile_fx import compile_fx

        log.info("compiling the decode step (graph %d)", self.compiles + 1)
        out = compile_fx(gm, example_inputs, config_patches={"freezing": True})
        self.compiles += 1  # counted once compiled: dynamo may restart a trace midway (a float argument specialized)
        return out

    def __call__(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``_Step.forward``'s arguments -> (logits, the final normed hidden state)."""
        before, t0 = self.compiles, time.perf_counter()
        # use_duck_shape=False: sizes that happen to be equal (rows, table width) stay apart
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]  # patch() is set at import: no stub
            out = self.fn(*args)
        if self.compiles != before:
            self.compile_seconds += time.perf_counter() - t0
        return out
