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
def _cpuinfo_text() -> str:
    p = Path("/proc/cpuinfo")
    return p.read_text() if p.exists() else ""


def _field(name: str) -> str | None:
    """The first ``name : value`` line's value in ``/proc/cpuinfo``, or None."""
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo_text().splitlines() if line.startswith(name)), None)


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model = _field("model name")
    return model if model is not None else platform.processor(), frozenset((_field("flags") or "").split())


def cpu_vendor() -> str:
    """The CPU's vendor as ``/proc/cpuinfo`` names it (``GenuineIntel``, ``AuthenticAMD``), or ``""``."""
    return _field("vendor_id") or ""


def cpu_facts() -> dict[str, Any]:
    """The CPU's model name and its bf16/AMX-related flags (``FLAGS``), and torch's threads."""
    import torch

    model, flags = _cpuinfo()
    return {"model": model, "flags": {f: f in flags for f in FLAGS}, "threads": torch.get_num_threads()}


def native_bf16() -> bool:
    """Whether the CPU has native bf16 matmuls (AVX512-BF16 or AMX-BF16); False where its flags cannot be read."""
    return bool(set(BF16) & _cpuinfo()[1])
