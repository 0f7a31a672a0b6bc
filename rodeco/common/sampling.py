"""Token sampling: temperature, top-k, top-p, by inverse CDF with counter-based per-row random numbers.

Each candidate draws its uniform at step ``t`` from ``hash(seed, candidate_id, t)``, so a candidate's text does
not depend on which other rows are in the batch: Speculative Rejection's survivors are exactly the Best-of-N
samples with the same ids and seed, cut where they were rejected. That makes the two methods comparable on one
pool of samples, and makes ``alpha = 0`` reproduce Best-of-N exactly.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import torch

from rodeco.common.state import SamplingParams

__all__ = ["SamplingParams", "copy_stream", "device_uniforms", "row_keys", "sample", "scaled", "uniforms"]

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
# splitmix64's constants, and the step's: numpy's draws (``uniforms``) and the device's (``device_uniforms``) share them
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_STEP = 0xD1B54A32D192ED03


@overload
def _splitmix64(x: np.ndarray) -> np.ndarray: ...
@overload
def _splitmix64(x: np.uint64) -> np.uint64: ...  # one seed for all rows
def _splitmix64(x: np.ndarray | np.uint64) -> np.ndarray | np.uint64:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(_GOLDEN)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)) & _M64
        return x ^ (x >> np.uint64(31))


COPY_BIT = 1 << 62  # set in every copy's stream; a starting row's stream is its candidate number (below 2**24)


def copy_stream(parent: int, step: int, sibling: int) -> int:
    """The stream of the ``sibling``-th copy (0, 1, ...) made of the row of stream ``parent`` after ``step`` tokens: a
    pure function of its lineage, so the same copy has the same stream under any policy, and siblings' differ."""
    x = np.array([parent & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _splitmix64(
            _splitmix64(x ^ np.uint64(0xA0761D6478BD642F)) + np.uint64(step) * np.uint64(0xE7037ED1A0B428DB)
        )
        x = _splitmix64(x + np.uint64(sibling) * np.uint64(0x8EBC6AF09C88C6E3))
    return int(x[0] & np.uint64(COPY_BIT - 1)) | COPY_BIT


def row_keys(prompt_keys: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """Each row's key into ``uniforms``: ``(prompt key << 24) | stream`` for a starting row (as before copies
    existed), a hash of both with the top bit set for a copy (whose stream has ``COPY_BIT``), so no two rows share
    one."""
    k, st = prompt_keys.astype(np.uint64), streams.astype(np.uint64)
    out = (k << np.uint64(24)) | st
    copy = (st & np.uint64(COPY_BIT)) != 0
    if copy.any():
        with np.errstate(over="ignore"):
            mixed = _splitmix64(st[copy] ^ _splitmix64(k[copy] * np.uint64(_GOLDEN)))
        out[copy] = mixed | np.uint64(1 << 63)
    return out


def uniforms(seed: int | np.ndarray, keys: np.ndarray, step: int | np.ndarray) -> np.ndarray:
    """Uniform(0, 1) draws, one per row, a pure function of (seed, the row's key (``row_keys``), step); ``seed`` is
    one for all or one per row (a server's batch: each request's own), ``step`` one for all or one per row (prompts
    on their own clocks)."""
    seeds = (
        np.asarray(seed).astype(np.int64).astype(np.uint64)
        if isinstance(seed, np.ndarray)
        else np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    )
    with np.errstate(over="ignore"):
        steps = np.uint64(step) if isinstance(step, int) else np.asarray(step).astype(np.uint64)
        key = _splitmix64(seeds + steps * np.uint64(_STEP))
        x = _splitmix64(key ^ (keys.astype(np.uint64) * np.uint64(_GOLDEN)))
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _int64(c: int) -> int:
    """The 64-bit pattern of ``c`` as the int64 that holds it (two's complement)."""
    c &= 0xFFFFFFFFFFFFFFFF
    return c - (1 << 64) if c >> 63 else c


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """``x`` (int64 holding uint64 bits) shifted right by ``s`` as uint64 is (torch's ``>>`` on int64 keeps the
    sign)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix64_t(x: torch.Tensor) -> torch.Tensor:
    """``_splitmix64`` on int64 tensors: the same bits (int64 addition and multiplication wrap as uint64's do)."""
    x = x + _int64(_GOLDEN)
    x = (x ^ _srl(x, 30)) * _int64(_MIX1)
    x = (x ^ _srl(x, 27)) * _int64(_MIX2)
    return x ^ _srl(x, 31)


def device_uniforms(seed: int | torch.Tensor, keys: torch.Tensor, step: int) -> torch.Tensor:
    """``uniforms`` computed where ``keys`` live, bit for bit: ``keys`` [B] the ``row_keys`` as int64 (``.view(
    np.int64)``), ``seed`` one int or an int64 tensor [B]. A CUDA step draws its numbers with a few elementwise
    kernels and copies nothing from the host (``uniforms`` is numpy's, copied each step). float64 [B]."""
    inc = _int64(step * _STEP)
    key: torch.Tensor | int
    if isinstance(seed, torch.Tensor):
        key = _splitmix64_t(seed + inc)
    else:  # one seed: its step key is one number
        key = _int64(int(_splitmix64(np.array([(seed + inc) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]))
    x = _splitmix64_t(key ^ (keys * _int64(_GOLDEN)))
    return (_srl(x, 11).double() + 0.5) / float(1 << 53)


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits`` in fp32 divided by ``temperature``, with one [B, V] copy at most: the fp32 copy of lower-precision
    logits is private, so it is divided in place; fp32 logits are the caller's, so dividing copies them once; at
    temperature 1 fp32 logits are returned as they are (``x / 1.0`` is ``x`` exactly, so the draw is unchanged)."""
    x = logits.float()
    if temperature == 1.0:
        return x
    return x.div_(temperature) if x is not logits else x / temperature


def sample(logits: torch.Tensor, u: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits: [B, V], u: [B] uniforms in (0, 1) -> token ids [B]."""
    if p.greedy:
        return logits.argmax(dim=-1)
    x = scaled(logits, p.temperature)
    if p.top_k and p.top_k < x.shape[-1]:
        vals, idx = x.topk(p.top_k, dim=-1)  # [B, k], descending
    elif p.top_p < 1.0:
        vals, idx = x.sort(dim=-1, descending=True)
    else:
        vals, idx = x, None
    del x  # a private copy is freed here unless the draw reads it
    probs = torch.softmax(vals, dim=-1)
    if p.top_p < 1.0:  # keep the smallest prefix whose mass reaches top_p (at least one token)
        cum = probs.cumsum(dim=-1)
        probs = probs.masked_fill(cum - probs >= p.top_p, 0.0)
    cdf = probs.cumsum(dim=-1)  # [B, k]
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    choice = torch.searchsorted(cdf, target).clamp_(max=cdf.shape[-1] - 1)  # [B, 1]
    return choice.squeeze(-1) if idx is None else idx.gather(-1, choice).squeeze(-1)
