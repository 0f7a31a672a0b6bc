"""``scripts/serve_bench.py``'s prompts and arrivals: the prompts of a data option (or ``gold``: the gold
yardstick's report problems), the untimed warm-up texts after them, and the seeded Poisson arrival times;
``scripts/serve_bench_judged.py`` reads a recorded run's prompts the same way."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

GOLD = "gold"  # --data gold: the gold yardstick's report problems, each with its record (the gold judge's answer)


def load(data: str, limit: int) -> list[Any]:
    """The first ``limit`` prompts of ``data`` (a conf/data option, its file under the data root; ``gold``:
    ``gold_problems``)."""
    import rodeco
    from rodeco.tasks import prompts_of

    if data == GOLD:
        return gold_problems(limit)
    d = rodeco.load_config([f"data={data}", f"data.limit={limit}"]).data
    return prompts_of(d)


def gold_problems(limit: int) -> list[Any]:
    """``limit`` reasoning-gym problems of the gold yardstick's tasks, at its settings and on its report seed
    (``rodeco.experiments.bench.gold_tasks``), the tasks taken in turn, a repeated text dropped, indexed by their
    place here; each keeps its record as ``meta``, what the ``gold`` judge checks an answer against."""
    import rodeco
    from rodeco.experiments.bench.gold_bench import task_config
    from rodeco.experiments.bench.gold_tasks import CANDIDATES, REPORT_SEED
    from rodeco.tasks import prompts_of

    per = -(-limit // len(CANDIDATES)) + 2  # a few to spare for repeated texts
    by_task = []
    for task, cfg in CANDIDATES.items():
        over = ["data=reasoning_gym", f"data.task={task}", task_config(cfg), f"data.size={per}"]
        by_task.append(prompts_of(rodeco.load_config([*over, f"data.seed={REPORT_SEED}"]).data))
    seen: set[str] = set()
    out: list[Any] = []
    for turn in zip(*by_task):
        for p in turn:
            if p.text not in seen:
                seen.add(p.text)
                out.append(dataclasses.replace(p, index=len(out)))
    return out[:limit]


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
