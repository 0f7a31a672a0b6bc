"""Admission by latency slack: a step-time model of the engine and a plan of the batch's future.

``StepModel`` says how long one decode step takes: ``a + b * rows + c * rows * context`` seconds for ``rows`` rows
holding ``context`` cached tokens each (a fixed cost, the weights read once per row, attention over every row's
cache). It is fitted by least squares to measured steps (``SessionStats.step_rows``, ``step_context``,
``step_seconds``) and refitted as more arrive (``StepTimes``).

``plan`` simulates the batch: the running jobs and the queued ones (which start in arrival order, as the loop admits
them, when their memory fits beside the running ones') decode together, a step at a time for all their rows, each to
its length; a job's rows and length are upper bounds (rows only leave, except a search policy's copies, which its
memory bounds; a row may stop before its length), so the plan errs late. The batch's bounds (``Limits``: memory,
jobs and rows at once) hold in the plan as in the loop. A new job is accepted when, queued behind
the others, it finishes within its deadline and pushes no other job past its own (a job the plan already has late is
not made later). ``choose_rows`` asks it for the most rows a job may start with, down to a floor; a job no start
fits is refused, with the seconds until it could start.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rodeco.common.protocols import Generator
from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec


@dataclass(frozen=True)
class StepModel:
    """Seconds of one decode step: ``a + b * rows + c * rows * context`` (``context``: cached tokens a row)."""

    a: float
    b: float
    c: float

    def seconds(self, rows: int, context: float) -> float:
        return self.a + self.b * rows + self.c * rows * context

    def run_seconds(self, rows: int, context: float, steps: int) -> float:
        """``steps`` steps of ``rows`` rows from ``context`` cached tokens a row (one more a row each step)."""
        return steps * (self.a + self.b * rows) + self.c * rows * (steps * context + steps * (steps - 1) / 2)

    @classmethod
    def fit(cls, rows: Sequence[float], context: Sequence[float], seconds: Sequence[float]) -> StepModel:
        """Least squares over measured steps, each coefficient kept at 0 or above (a negative one is dropped and the
        rest refitted), then again without the steps slower than the first fit by more than three times the median
        gap (a pause that is not the engine's: another process, the garbage collector). Needs at least one step."""
        if not len(seconds):
            raise ValueError("a step-time model needs at least one measured step")
        r, x, y = (np.asarray(v, dtype=np.float64) for v in (rows, context, seconds))
        first = cls._fit(r, x, y)
        gap = y - (first.a + first.b * r + first.c * r * x)
        keep = gap <= 3 * np.median(np.abs(gap)) + 1e-12
        return cls._fit(r[keep], x[keep], y[keep]) if keep.sum() >= 3 and not keep.all() else first

    @classmethod
    def _fit(cls, r: np.ndarray, x: np.ndarray, y: np.ndarray) -> StepModel:
        cols = np.stack([np.ones_like(r), r, r * x], 1)
        keep = [0, 1, 2]
        coef = np.zeros(3)
        while keep:
            sol, *_ = np.linalg.lstsq(cols[:, keep], y, rcond=None)
            if (sol >= 0).all():
                coef[keep] = sol
                break
            keep.pop(int(np.argmin(sol)))
        if not keep:  # every coefficient negative: the mean step as a fixed cost
            coef[0] = max(float(y.mean()), 0.0)
        return cls(*map(float, coef))


@dataclass
class StepTimes:
    """The measured steps a server has seen (the last ``window``) and the model fitted to them, refitted every
    ``refit_every`` new steps."""

    model: StepModel
    window: int = 2048
    refit_every: int = 64
    rows: deque[float] = field(init=False)
    context: deque[float] = field(init=False)
    seconds: deque[float] = field(init=False)
    _new: int = 0

    def __post_init__(self) -> None:
        self.rows, self.context, self.seconds = (deque(maxlen=self.window) for _ in range(3))

    def add(self, rows: Sequence[float], context: Sequence[float], seconds: Sequence[float]) -> None:
        self.rows.extend(rows)
        self.context.extend(context)
        self.seconds.extend(seconds)
        self._new += len(seconds)
        if self._new >= self.refit_every:
            self.model = StepModel.fit(list(self.rows), list(self.context), list(self.seconds))
            self._new = 0


@dataclass(frozen=True)
class Work:
    """A job as the plan sees it: its rows (an upper bound), the tokens a row holds now (its prompt and what it has
    decoded), the steps it has left (an upper bound), the KV tokens it reserves, its deadline (seconds from now),
    whether it is running (a queued one starts when its memory fits) and the soonest it may start."""

    rows: int
    context: int
    steps_left: int
    reserved: int
    deadline: float
    running: bool = True
    not_before: float = 0.0


@dataclass(frozen=True)
class Decision:
    """``accept``: the job meets its deadline queued behind the others now, pushing none past its own; ``start`` and
    ``finish`` are when the plan has it start and finish (seconds from now). Refused, ``retry_after`` is the seconds
    until a start would meet its target (the same length of time from then) and harm none: ``inf`` when the plan
    finds none."""

    accept: bool
    start: float
    finish: float
    retry_after: float


@dataclass(frozen=True)
class Limits:
    """What bounds the batch as the loop admits: the KV tokens the running jobs' reservations may add up to, the
    most jobs and the most rows decoding at once (None: no bound), and the steps between admissions."""

    kv_tokens: int | None = None
    max_jobs: int | None = None
    max_rows: int | None = None
    chunk: int = 8

    def fits(self, live: Sequence[Work], job: Work) -> bool:
        if not live:
            return True  # alone, a job always starts (one above every bound never does: ``never``)
        return (
            (self.kv_tokens is None or sum(j.reserved for j in live) + job.reserved <= self.kv_tokens)
            and (self.max_jobs is None or len(live) + 1 <= self.max_jobs)
            and (self.max_rows is None or sum(j.rows for j in live) + job.rows <= self.max_rows)
        )

    def never(self, job: Work) -> bool:
        return (self.kv_tokens is not None and job.reserved > self.kv_tokens) or (
            self.max_rows is not None and job.rows > self.max_rows
        )


def simulate(jobs: Sequence[Work], model: StepModel, limits: Limits) -> list[tuple[float, float]]:
    """Each job's (start, finish) in seconds from now: the running jobs and the queued ones (in order, each once its
    ``not_before`` has come and it fits beside the running ones (``Limits.fits``); the first that cannot start holds
    the ones behind it) decode ``limits.chunk`` steps at a time together. A queued job above the limits never
    starts, nor do the ones behind it: (inf, inf)."""
    start = [0.0 if j.running else math.inf for j in jobs]
    finish = [math.inf] * len(jobs)
    left = [j.steps_left for j in jobs]
    ctx = [float(j.context) for j in jobs]
    live = [i for i, j in enumerate(jobs) if j.running]
    queue = deque(i for i, j in enumerate(jobs) if not j.running)
    t = 0.0
    while live or queue:
        for i in [i for i in live if left[i] <= 0]:
            finish[i] = t
            live.remove(i)
        if queue and limits.never(jobs[queue[0]]):
            queue.clear()  # it never fits: it and the ones behind it never start
        if not live and queue:
            t = max(t, jobs[queue[0]].not_before)
        while queue and jobs[queue[0]].not_before <= t and limits.fits([jobs[i] for i in live], jobs[queue[0]]):
            start[queue[0]] = t
            live.append(queue.popleft())
        if not live:
            continue
        steps = min(limits.chunk, min(left[i] for i in live))
        rows = sum(jobs[i].rows for i in live)
        mean_ctx = sum(jobs[i].rows * ctx[i] for i in live) / max(rows, 1)
        t += model.run_seconds(rows, mean_ctx, steps)
        for i in live:
            left[i] -= steps
            ctx[i] += steps
    return list(zip(start, finish))


def plan(jobs: Sequence[Work], new: Work, model: StepModel, limits: Limits) -> Decision:
    """Whether ``new`` (its deadline: seconds from its arrival), queued behind ``jobs``, meets its deadline without
    pushing any of them past its own, and if not, when it could start (see the module doc). The start is searched
    among the times a planned job leaves, by bisection: a later start harms the others less and leaves the new job
    the same time to run, so the plan takes the answer as monotone in the wait (a few simulations, not one a job)."""
    before = simulate(jobs, model, limits)

    def at(wait: float) -> tuple[bool, float, float]:
        job = dataclasses.replace(new, running=False, not_before=wait)
        after = simulate([*jobs, job], model, limits)
        s, f = after[-1]
        harmless = all(a[1] <= max(j.deadline, b[1]) + 1e-9 for j, b, a in zip(jobs, before, after))
        return harmless and f - wait <= new.deadline, s, f

    ok, s, f = at(0.0)
    if ok:
        return Decision(True, s, f, 0.0)
    waits = sorted({x for _, x in before if 0.0 < x < math.inf})
    if not waits or not at(waits[-1])[0]:
        return Decision(False, s, f, math.inf)
    lo, hi = -1, len(waits) - 1  # at(waits[hi]) holds; at(waits[lo]) does not (lo = -1: no wait)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(waits[mid])[0] else (mid, hi)
    return Decision(False, s, f, waits[hi])


def choose_rows(jobs: Sequence[Work], new: Work, least: int, model: StepModel, limits: Limits) -> tuple[int, Decision]:
    """The most rows, from ``new.rows`` down to ``least``, that ``plan`` accepts ``new`` starting with, and that
    decision; where none is, ``least`` and its decision (its ``retry_after``). Fewer rows finish sooner and press the
    others less, so the plan takes acceptance as monotone in the rows and searches them by bisection."""
    d = plan(jobs, new, model, limits)
    if d.accept or new.rows <= least:
        return new.rows, d
    low = plan(jobs, dataclasses.replace(new, rows=least), model, limits)
    if not low.accept:
        return least, low
    lo, hi, best = least, new.rows, low  # lo is accepted, hi is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        dm = plan(jobs, dataclasses.replace(new, rows=mid), model, limits)
        lo, hi, best = (mid, hi, dm) if dm.accept else (lo, mid, best)
    return lo, best


def measure_steps(
    gen: Generator, rows: Sequence[int] = (1, 8, 32), steps: int = 24, prompt: str = "Count slowly from one to fifty."
) -> StepModel:
    """The step-time model of ``gen``'s engine, fitted at start-up: one prompt decoded ``steps`` tokens at each of
    ``rows`` rows (EOS ignored), its first step of each dropped (warm-up)."""
    sess = gen.open_session(SessionSpec(ignore_eos=True))
    ids = gen.encode(prompt)
    r: list[float] = []
    x: list[float] = []
    y: list[float] = []
    try:
        for k, n in enumerate(rows):
            sess.admit([ids], [OpenPrompt(n=n, max_new_tokens=steps, sampling=SamplingParams(), seed=k, stream_key=k)])
            st, first = sess.stats, len(sess.stats.step_seconds)
            while sess.rows:
                sess.decode(until=sess.t + steps)
                sess.retire_finished()
            got = min(len(st.step_rows), len(st.step_context), len(st.step_seconds))
            r += st.step_rows[first + 1 : got]
            x += st.step_context[first + 1 : got]
            y += st.step_seconds[first + 1 : got]
    finally:
        sess.close()
    return StepModel.fit(r, x, y)
