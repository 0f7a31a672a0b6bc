"""An arrival trace replayed over a recorded pool: requests join the open batch (``rodeco.core.loop.decode_open``) at
their recorded arrival times on a modelled clock, so the scheduling (admission, queueing, each prompt's own clock and
budget) is tested and studied without a live model.

The clock (``ModelledClock``) is modelled, never measured: a decode step of the replay's session costs
``step(rows, context)`` seconds (``rodeco.experiments.analysis.TimeModel`` fits it to the pool's measured steps), an
admitted prompt its prefill as the pool measured it, a reward call what it cost when it was computed; with nothing
running it jumps to the next arrival. Latencies read on it are modelled latencies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rodeco.common.protocols import LoopHooks, Policy
from rodeco.common.state import PromptRef, PromptResult
from rodeco.core.contracts import Scorer
from rodeco.core.loop import LoopSettings, OpenStats, Request, decode_open
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.replays.pool_session import ReplayGenerator
from rodeco.replays.replay import check_replayable, pool_served


@dataclass(frozen=True)
class Arrival:
    """A request of the trace: the pool prompt it asks for, ``at`` seconds after the trace began, and its own budget
    (``kv_tokens``; None: the run's ``budget.kv_tokens``), as a server gives each request one."""

    at: float
    index: int
    kv_tokens: int | None = None


@dataclass
class Replayed:
    """A request's result and its modelled times (seconds on the ``ModelledClock``)."""

    arrival: Arrival
    admitted_s: float = float("nan")
    done_s: float = float("nan")
    result: PromptResult | None = None

    @property
    def modelled_latency_s(self) -> float:
        return self.done_s - self.arrival.at

    @property
    def modelled_queue_s(self) -> float:
        return self.admitted_s - self.arrival.at


class ModelledClock:
    """Modelled seconds since the trace began (see the module doc): the replay's decode steps through ``step``, the
    prefills ``charge``d, the pool-served rewards' charged seconds, and the idle time jumped over."""

    def __init__(
        self, gen: ReplayGenerator, step: Callable[[int, int], float], rewards: Sequence[PoolReward] = ()
    ) -> None:
        self.gen, self.step, self.rewards = (
            gen,
            step,
            list(rewards),
        )  # each once (``rodeco.replays.replay.pool_served``)
        self.reward0 = sum(r.seconds for r in self.rewards)
        self.decode, self.counted, self.other = 0.0, 0, 0.0  # decode: the first ``counted`` steps of the session

    def now(self) -> float:
        sess = self.gen.opened
        if sess is not None:
            st = sess.stats
            for rows, ctx in zip(st.step_rows[self.counted :], st.step_context[self.counted :]):
                self.decode += self.step(rows, ctx)
            self.counted = len(st.step_rows)
        return self.decode + self.other + sum(r.seconds for r in self.rewards) - self.reward0

    def charge(self, seconds: float) -> None:
        self.other += seconds

    def idle_until(self, t: float) -> None:
        self.other += max(0.0, t - self.now())


class TraceSource:
    """``rodeco.core.loop.Source`` of requests arriving at their times on ``clock``: a call gives those that arrived
    by now; a waiting call (nothing running) moves the clock to the next arrival."""

    def __init__(self, requests: Sequence[tuple[float, Request]], clock: ModelledClock) -> None:
        self.queue = deque(sorted(requests, key=lambda x: x[0]))
        self.clock = clock

    def take(self, wait: bool) -> list[Request] | None:
        if not self.queue:
            return None
        if wait:
            self.clock.idle_until(self.queue[0][0])
        now, got = self.clock.now(), []
        while self.queue and self.queue[0][0] <= now:
            got.append(self.queue.popleft()[1])
        return got


def replay_arrivals(
    pool: Pool,
    gen: ReplayGenerator,
    reward: Scorer,
    policy: Callable[[], Policy],
    arrivals: Sequence[Arrival],
    s: LoopSettings,
    step: Callable[[int, int], float],
    kv_tokens: int | None = None,
    partial: Scorer | None = None,
    check_tokens: int = 16,
    max_prompts: int | None = None,
    hooks: LoopHooks | None = None,
) -> tuple[list[Replayed], OpenStats, ModelledClock]:
    """The requests of ``arrivals`` through the open loop over the pool under ``s`` (each with its own budget,
    ``s.budget``, and a policy from ``policy()``), the running ones' budgets adding up to at most ``kv_tokens`` and
    their number to ``max_prompts`` (a server's ``serve.batch_requests``).
    Returns each request's result and modelled times, in arrival order, what the open decode did, and its clock.
    A prompt's own settings are checked as ``replay_batch`` checks them (``check_replayable``: at most the pool's
    ``max_new_tokens`` and candidates, its sampling and seed). ``hooks`` (a ``Plugins``) are fired by the loop at
    each decision point and each request's end."""
    check_replayable(pool, s, s.n)
    clock = ModelledClock(gen, step, pool_served(reward, partial))
    out = [Replayed(a) for a in arrivals]
    requests = []
    for rec in out:
        p = pool.prompt(rec.arrival.index)
        gen.add(p)
        own = (
            s
            if rec.arrival.kv_tokens is None
            else replace(s, budget=replace(s.budget, kv_tokens=rec.arrival.kv_tokens))
        )
        requests.append((rec.arrival.at, _request(rec, p.text, p.prefill_seconds, own, policy(), clock)))
    source = TraceSource(requests, clock)
    stats = decode_open(
        gen,
        reward,
        source,
        kv_tokens,
        partial=partial,
        check_tokens=check_tokens,
        max_prompts=max_prompts,
        hooks=hooks,
    )
    return out, stats, clock


def _request(
    rec: Replayed, text: str, prefill_s: float, s: LoopSettings, policy: Policy, clock: ModelledClock
) -> Request:
    def admitted() -> None:
        rec.admitted_s = clock.now()
        clock.charge(prefill_s)  # its prefill, as the pool measured it

    def done(r: PromptResult) -> None:
        rec.result, rec.done_s = r, clock.now()

    return Request([PromptRef(rec.arrival.index, text)], s, policy, done, on_admit=admitted)
