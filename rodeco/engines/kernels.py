"""rodeco's own CPU kernels, which the fast engine's compiled step calls on CPU (``rodeco.engines.compiled``): decode
attention (``decode_attention.cpp``, the op ``rodeco::decode_attention``), in place of the attention inductor
generates, and the prepacked linears called without Python (``packed_linear.cpp``, ``rodeco::packed_linear_c``:
oneDNN's, or MKL's packed GEMM, ``rodeco::mkl_linear``, on an Intel CPU in fp32); and the top-k its engine's sampling
takes (``topk.cpp``, ``rodeco::topk``: ``topk`` below).

It is built on first use with PyTorch's extension builder (``torch.utils.cpp_extension.load``: a C++ compiler and
ninja, which ``torch.compile`` on CPU needs too), for this machine's CPU (``-march=native``), into PyTorch's
extension cache (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) under a name that carries the
CPU's model and flags and the PyTorch version, so a home directory shared by unlike machines keeps one build each.
The first build takes about 30 s; later processes load it. Where it cannot be built (no compiler, a platform the
flags do not suit) the compiled step keeps inductor's attention and the linears' Python op, and says so in the log.

What the kernel computes, for each row and KV head: the scores of the head's query heads against the row's prompt
keys (read through the row's prompt index, with the prompt's padding bias) and its own keys, the softmax, and the
weighted values, all in fp32 whatever the cache's dtype. Keys are read by column (``[..., head_dim, tokens]`` in
storage, token stride 1), values by row. A row's arithmetic depends on its inputs only: not the other rows, the
batch size, the round's capacity or the number of threads, so Speculative Rejection's survivors stay Best-of-N's
samples bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from rodeco.hardware import cpu_facts

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(n) for n in ("decode_attention.cpp", "packed_linear.cpp", "topk.cpp")]  # one build
LANES = 16  # head_dim must be a multiple of it (the kernel's vector width in fp32)
MOST_GROUP = 8  # query heads a KV head at most (the kernel is instantiated for 1..8)
_built: bool | None = None


def extension_name() -> str:
    """The build's name: the source, this CPU (model and flags) and PyTorch's version, hashed."""
    c = cpu_facts()
    key = "|".join(
        [
            *(f.read_text() for f in SOURCES),
            c["model"],
            repr(sorted(c["flags"].items())),
            torch.__version__,
            torch.backends.cpu.get_cpu_capability(),
        ]
    )
    return "rodeco_decode_attention_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def decode_attention_available() -> bool:
    """Whether ``rodeco::decode_attention`` is loaded, building it the first time it is asked for (once a process)."""
    global _built
    if _built is None:
        _built = _build()
    return _built


def packed_linear_available() -> bool:
    """Whether ``rodeco::packed_linear_c`` (``packed_linear.cpp``: the prepacked oneDNN linears called without
    Python) is loaded; it is built with the attention kernel, once a process."""
    return decode_attention_available() and hasattr(torch.ops.rodeco, "packed_linear_c")


def mkl_linear_available() -> bool:
    """Whether ``rodeco::mkl_linear`` (``packed_linear.cpp``: MKL's packed fp32 GEMM) can run: the kernels are built
    and this build of PyTorch carries MKL's packed GEMM (x86 builds do)."""
    return decode_attention_available() and hasattr(torch.ops.rodeco, "mkl_ready") and torch.ops.rodeco.mkl_ready()


def topk_available() -> bool:
    """Whether ``rodeco::topk`` (``topk.cpp``) is loaded; it is built with the attention kernel, once a process."""
    return decode_attention_available() and hasattr(torch.ops.rodeco, "topk")


def fits(head_dim: int, group: int) -> bool:
    """Whether the kernel serves a model with this ``head_dim`` and ``group`` query heads a KV head."""
    return head_dim % LANES == 0 and 1 <= group <= MOST_GROUP


def _build() -> bool:
    name = extension_name()
    try:
        from torch.utils.cpp_extension import load

        load(
            name=name,
            sources=[str(f) for f in SOURCES],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001  no compiler, no ninja, flags this platform rejects: inductor's attention
        log.warning(
            "rodeco's CPU kernels could not be built (%s: %s); the compiled step uses the attention "
            "inductor generates and the linears' Python op",
            type(e).__name__,
            str(e).strip().splitlines()[-1:],
        )
        return False
    if not hasattr(torch.ops.rodeco, "decode_attention"):
        log.warning(
            "rodeco's CPU kernels were built but registered no attention op; inductor's attention and the "
            "linears' Python op are used"
        )
        return False

    @torch.library.register_fake("rodeco::decode_attention")
    def _(
        q: torch.Tensor,
        kp: torch.Tensor,
        vp: torch.Tensor,
        grp: torch.Tensor,
        bias: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        return q.new_empty(q.shape)

    log.info("rodeco's decode attention kernel is loaded (%s)", name)
    return True


def decode_attention(
    q: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    grp: torch.Tensor,
    bias: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hkv, g, D] (one token a row), the prompts' keys and values kp, vp [G, Hkv, P, D], each row's prompt
    ``grp`` [B] (int64), the prompts' fp32 bias [G, P] (0, or -inf at padding), the rows' own keys and values
    k, v [B, Hkv, S, D] -> the attention output [B, Hkv, g, D] in q's dtype. Keys by column (``kp.stride(2) ==
    k.stride(2) == 1``); q, values with head_dim contiguous; ``fits(D, g)``."""
    return torch.ops.rodeco.decode_attention(q, kp, vp, grp, bias, k, v, scale)


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` of [rows, vocabulary] logits, the same values and indices: ``rodeco::topk`` where it
    takes ``x`` (fp32, contiguous, on CPU; ``topk_available``), and ``torch.topk`` for the rows it marks inexact (two
    of their k + 1 largest values equal, so that the order of the tied indices is torch's to choose, or a NaN), as
    for any other ``x``. It reads each row about once where ``torch.topk`` sorts it (docs/results.md, issue 29: 375
    against 1,924 µs at 64 rows of 49,152)."""
    if (
        x.dim() != 2
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or not x.is_contiguous()
        or not 1 <= k < x.shape[-1]
        or not topk_available()
    ):
        return x.topk(k, dim=-1)
    vals, idx, exact = torch.ops.rodeco.topk(x, k)
    if not bool(exact.all()):
        r = (~exact).nonzero().squeeze(1)
        vals[r], idx[r] = x.index_select(0, r).topk(k, dim=-1)
    return vals, idx
