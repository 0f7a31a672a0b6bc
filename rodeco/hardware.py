"""What the CPU can do, as far as rodeco's choices depend on it: its model name and the instruction-set flags bf16
matmuls depend on (Linux ``/proc/cpuinfo``; elsewhere none are known), and whether it multiplies bf16 natively."""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")  # what engine_bench records
BF16 = ("avx512_bf16", "amx_bf16")  # native bf16 dot products: oneDNN runs bf16 matmuls at their own peak


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    p = Path("/proc/cpuinfo")
    info = p.read_text() if p.exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return model, frozenset(flags)


def cpu_vendor() -> str:
    """The CPU's vendor as ``/proc/cpuinfo`` names it (``GenuineIntel``, ``AuthenticAMD``), or ``""``."""
    p = Path("/proc/cpuinfo")
    info = p.read_text() if p.exists() else ""
    return next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("vendor_id")), "")


def cpu_facts() -> dict[str, Any]:
    """The CPU's model name and its bf16/AMX-related flags (``FLAGS``), and torch's threads."""
    import torch

    model, flags = _cpuinfo()
    return {"model": model, "flags": {f: f in flags for f in FLAGS}, "threads": torch.get_num_threads()}


def native_bf16() -> bool:
    """Whether the CPU has native bf16 matmuls (AVX512-BF16 or AMX-BF16); False where its flags cannot be read."""
    return bool(set(BF16) & _cpuinfo()[1])
