"""``scripts/serve_bench.py``'s prompts and arrivals: the prompts of a data option, the untimed warm-up texts after
them, and the seeded Poisson arrival times; ``scripts/serve_bench_judged.py`` reads a recorded run's prompts the
same way."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np


def load(data: str, limit: int) -> list[Any]:
    """The first ``limit`` prompts of ``data`` (a conf/data option, its file under the data root)."""
    import rodeco
    from rodeco.tasks import prompts_of

    d = rodeco.load_config([f"data={data}", f"data.limit={limit}"]).data
    return prompts_of(d)


def load_prompts(a: argparse.Namespace) -> tuple[list[Any], list[str]]:
    """The first ``--requests`` prompts of ``--data`` (a conf/data option, its file under the data root), and
    the ``--warmup`` texts after them (none of the measured prompts: a server's prefix cache starts cold on those)."""
    prompts = load(a.data, a.requests + a.warmup)
    k = min(a.requests, max(1, len(prompts) - a.warmup))
    warm = [p.text for p in prompts[k:]] or ["Say hello in one short sentence."]
    return prompts[:k], warm


def arrivals(k: int, rate: float, seed: int) -> np.ndarray:
    """``k`` arrival times in seconds from the phase's start, the first at 0: exponential gaps at ``rate`` per
    second (seeded), or all at 0 for rate 0."""
    if rate == 0:
        return np.zeros(k)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=k)
    t = np.cumsum(gaps)
    return t - t[0]
