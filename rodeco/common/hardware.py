"""The machine's answers to every device question rodeco asks, in one place.

- The devices: whether CUDA is here (``cuda_available``) and how many devices it has (``cuda_count``), whether a
  device is the CPU or a CUDA one (``is_cpu``, ``is_cuda``), a ``*.device`` setting resolved (``resolve_device``),
  the CUDA devices holding a model's layers (``cuda_devices``, ``cuda_layers``), waiting for what is queued on them
  (``synchronize``) and handing cached memory back (``empty_cache``).
- The CPU, as far as rodeco's choices depend on it: its model name and the instruction-set flags bf16 matmuls depend
  on (Linux ``/proc/cpuinfo``; elsewhere none are known), and whether it multiplies bf16 natively.

What an engine does on its device (host syncs, draws on the device, admission) is declared by its
``rodeco.common.protocols.EngineInfo``, not asked of the device again."""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rodeco.common.validation import ConfigError

if TYPE_CHECKING:
    import torch

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


def cuda_available() -> bool:
    """Whether a CUDA device is here (torch is imported on first call)."""
    import torch

    return torch.cuda.is_available()


def cuda_count() -> int:
    """How many CUDA devices are visible (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if cuda_available() else 0


def is_cuda(device: torch.device | str) -> bool:
    """Whether ``device`` (a ``torch.device`` or its name: ``cuda``, ``cuda:1``, ``cpu``) is a CUDA device."""
    return str(device).startswith("cuda")


def is_cpu(device: torch.device | str) -> bool:
    """Whether ``device`` is the CPU."""
    return str(device) == "cpu" or str(device).startswith("cpu:")


def resolve_device(device: str, key: str = "generator.device") -> torch.device:
    """The setting ``key``'s device: ``auto`` is CUDA where it is available, else the CPU; a CUDA device where
    there is none, or a name that is no device, is a ``ConfigError`` naming ``key``."""
    import torch

    if device == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    if is_cuda(device) and not cuda_available():
        raise ConfigError(key, device, "CUDA is not available here", f"use {key}=cpu or auto")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(key, device, "not a device", f"use {key}=auto, cpu, cuda or cuda:N") from None


def cuda_layers(device: torch.device | str, layers: Mapping[str, int]) -> dict[str, int]:
    """``layers`` (how many layers each device holds, as ``Generator.layer_devices`` counts them) restricted to
    CUDA's, or ``device`` holding them all."""
    return {d: k for d, k in layers.items() if is_cuda(d)} or {str(device): 1}


def cuda_devices(device: torch.device | str, layers: Callable[[], Mapping[str, int]] = dict) -> list[str]:
    """The CUDA devices a model on ``device`` runs on: none unless it is a CUDA one; else ``cuda_layers``' devices.
    ``layers`` (the model's ``layer_devices``) is asked only on CUDA."""
    return list(cuda_layers(device, layers())) if is_cuda(device) else []


def synchronize(devices: Iterable[str]) -> None:
    """Wait for the work queued on ``devices`` (no ``torch.cuda`` call when there is none)."""
    devs = list(devices)
    if devs:
        import torch

        for d in devs:
            torch.cuda.synchronize(torch.device(d))


def empty_cache() -> None:
    """Hand the CUDA caching allocator's free blocks back, where there is CUDA."""
    if cuda_available():
        import torch

        torch.cuda.empty_cache()
