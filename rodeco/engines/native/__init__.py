"""rodeco's native CPU kernels, behind one boundary: this package builds them, says which are available, and holds
every call of them. Each is asked for by name (``available(name)``):

- ``paged_attention`` (``attention.cpp``, ``rodeco::paged_attention``): decode attention over the Llama engine's
  paged cache, each row's tokens in blocks of a pool named by the row's block table, read in place; against the
  plain torch path it replaces (``paged_reference``: the row's blocks gathered, then two matmuls), paired by
  ``scripts/paged_pairs.py`` (the kernel alone) and ``scripts/kernel_pairs.py`` (in the compiled step);
- ``mkl_linear`` (``mkl_linear.cpp``, ``rodeco::mkl_pack`` and ``rodeco::mkl_linear``): MKL's packed fp32 GEMM, the
  compiled step's linears on an Intel CPU (``rodeco.engines.llama.Linear``); available where PyTorch carries MKL.

Each stays only while it earns its place against the path it replaces, paired in one run on the CPU it targets
(docs/results.md has the figures, and those of the kernels removed for missing it).

They are one extension, ``rodeco_native_<hash>``, built on first use with PyTorch's extension builder
(``torch.utils.cpp_extension.load``: a C++ compiler and ninja, which ``torch.compile`` on CPU needs too), for this
machine's CPU (``-march=native``), into PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``, default
``~/.cache/torch_extensions``) under a name that hashes the sources, the CPU's model and flags and the PyTorch
version, so a home directory shared by unlike machines keeps one build each. The first build takes about 30 s;
later processes load it. Where it cannot be built (no compiler, a platform the flags do not suit) no kernel is
available: the engine reads its blocks through the torch path, the compiled step keeps oneDNN's linears, and the
log says so.

What the attention kernel computes, for each row and KV head: the scores of the head's query heads against the
row's keys (read through its block table, its prompt's front padding skipped), the softmax, and the weighted
values, all in fp32 whatever the cache's dtype. Keys are read by column (``[..., head_dim, tokens]`` in storage,
token stride 1), values by row. A row's arithmetic depends on its inputs only: not the other rows, the batch size or
the number of threads, so Speculative Rejection's survivors stay Best-of-N's samples bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from rodeco.common.hardware import cpu_facts

log = logging.getLogger(__name__)

KERNELS = ("paged_attention", "mkl_linear")
SOURCES = [Path(__file__).with_name(n) for n in ("attention.cpp", "mkl_linear.cpp")]  # one extension
LANES = 16  # head_dim must be a multiple of it (the widest vector the kernels use: 16 fp32 lanes, AVX-512's)


def vector_lanes() -> int:
    """fp32 lanes of the kernels' vectors on this CPU, as ``attention.cpp`` is built for it (``-march=native``): 8 on
    an AVX2-only CPU, 16 elsewhere (AVX-512; and the generic vectors of a CPU without AVX2). The paged kernel reads
    blocks of a multiple of it, so the Llama engine's blocks are this many tokens (``rodeco.engines.fast.BLOCK``)."""
    flags = cpu_facts()["flags"]
    return 8 if flags["avx2"] and not flags["avx512f"] else 16


WIDTH = vector_lanes()
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
    return "rodeco_native_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def available(kernel: str) -> bool:
    """Whether the native kernel ``kernel`` (one of ``KERNELS``) can run here, building the extension the first time
    any is asked for (once a process)."""
    global _built
    if kernel not in KERNELS:
        raise ValueError(f"no native kernel {kernel!r}: rodeco's are {', '.join(KERNELS)}")
    if _built is None:
        _built = _build()
    if not _built:
        return False
    if kernel == "mkl_linear":  # built everywhere; runs where this build of PyTorch carries MKL's packed GEMM
        return bool(torch.ops.rodeco.mkl_ready())
    return True


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
    except Exception as e:  # noqa: BLE001  no compiler, no ninja, flags this platform rejects: the torch paths
        log.warning(
            "rodeco's native CPU kernels could not be built (%s: %s); the compiled step uses the attention "
            "PyTorch computes and oneDNN's linears",
            type(e).__name__,
            str(e).strip().splitlines()[-1:],
        )
        return False

    if (built := int(torch.ops.rodeco.lanes())) != WIDTH:  # the compiler saw another CPU than /proc/cpuinfo
        log.warning("rodeco's native kernels were built for %d lanes, not %d: they are not used", built, WIDTH)
        return False
    torch.library.register_fake("rodeco::paged_attention")(_like_query)

    log.info("rodeco's native kernels are loaded (%s)", name)
    return True


def _like_query(q: torch.Tensor, *rest: object) -> torch.Tensor:
    """``paged_attention``'s output as a graph sees it while tracing: shaped like the query."""
    return q.new_empty(q.shape)


def paged_attention(
    q: torch.Tensor,
    kpool: torch.Tensor,
    vpool: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [B, Hkv, g, D] (one token a row), a paged cache's pools of blocks of ``bs`` tokens, keys by column kpool
    [N, Hkv, D, bs] and values vpool [N, Hkv, bs, D] (both contiguous), each row's blocks in order ``tables`` [B, M]
    (int64; entries past its slots are not read), its slots ``lens`` [B] and the padding before its first token
    ``starts`` [B] (int64, ``0 <= starts < lens``; those slots are skipped) -> the attention output [B, Hkv, g, D] in
    q's dtype, computed in fp32. ``D`` a multiple of ``LANES``, ``bs`` of ``WIDTH``; needs
    ``available("paged_attention")``."""
    return torch.ops.rodeco.paged_attention(q, kpool, vpool, tables, lens, starts, scale)


def paged_reference(
    q: torch.Tensor,
    kpool: torch.Tensor,
    vpool: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """What ``paged_attention`` computes, in torch: each row's blocks gathered (``tables`` padded with any valid block
    past its slots), its scores and softmax in fp32 with the slots before ``starts`` and past ``lens`` masked, the
    weighted values."""
    B, H, g, D = q.shape
    M, bs = tables.shape[1], kpool.shape[-1]
    k = kpool[tables].permute(0, 2, 1, 4, 3).reshape(B, H, M * bs, D)  # [B, H, M * bs, D]
    v = vpool[tables].permute(0, 2, 1, 3, 4).reshape(B, H, M * bs, D)
    s = (q.float() @ k.float().transpose(-1, -2)).mul_(scale)  # [B, H, g, M * bs]
    at = torch.arange(M * bs, device=q.device)[None]
    out = (at >= lens[:, None]) | (at < starts[:, None])
    p = torch.softmax(s.masked_fill_(out[:, None, None], float("-inf")), dim=-1)
    return (p @ v.float()).to(q.dtype)


def mkl_pack(w: torch.Tensor) -> torch.Tensor:
    """``w`` [out, in] (fp32) packed for MKL's GEMM (``available("mkl_linear")``), for ``mkl_linear``."""
    return torch.ops.rodeco.mkl_pack(w)


def mkl_linear(x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None, n: int) -> torch.Tensor:
    """``x @ w.T + b`` with ``w`` packed by ``mkl_pack`` (``n``: its output size); a row's products are the same at
    every batch size."""
    return torch.ops.rodeco.mkl_linear(x, packed, b, n)
