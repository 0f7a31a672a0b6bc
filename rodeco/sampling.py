"""Token sampling: temperature, top-k, top-p, by inverse CDF with counter-based per-row random numbers.

Each candidate draws its uniform at step ``t`` from ``hash(seed, candidate_id, t)``, so a candidate's text does
not depend on which other rows are in the batch: Speculative Rejection's survivors are exactly the Best-of-N
samples with the same ids and seed, cut where they were rejected. That makes the two methods comparable on one
pool of samples, and makes ``alpha = 0`` reproduce Best-of-N exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from rodeco.state import SamplingParams

__all__ = ["SamplingParams", "sample", "scaled", "uniforms"]

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


def uniforms(seed: int, candidate_ids: np.ndarray, step: int) -> np.ndarray:
    """Uniform(0, 1) draws, one per candidate, a pure function of (seed, candidate id, step)."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) + np.uint64(step) * np.uint64(0xD1B54A32D192ED03))
        x = _splitmix64(key ^ (candidate_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


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
        vals, idx = x.topk(p.top_k, dim=-1)  # [B, k], sorted descending
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
