"""The decoding loop: Best-of-N, Speculative Rejection and search (particle filtering, beam search) are policies of
this one loop, and a closed batch, a server's open batch and a replayed arrival trace are sources of it.

A source yields cohorts (``Request``): prompts admitted together, which share a clock, a budget and each call of
their policy. ``decode_batch`` is a source of one cohort that then closes; a server's request is a cohort of one
prompt, joining whatever runs.

while cohorts are running or may still arrive:
    admit the waiting cohorts, in arrival order, while their budgets fit beside the running ones'
        (each prompt forwarded once, its cache fanned out to n rows)
    decode to the earliest decision point of a running cohort (where its rows would outgrow its budget, or its
        policy's decision_tokens) or vote check (winner.stop_tokens), pausing every check_tokens tokens to admit and
        to let cancelled prompts leave
    the cohorts at their decision point or vote check hand their finished rows (reward) and, at a decision point,
        their active rows (partial_reward) to the scoring, all in one round of calls; where it runs on a worker
        thread, their rows are set aside (their clocks stopped) while the other cohorts decode
    each cohort whose scores are back: a prompt whose vote is settled (winner.stop) stops its rows; a prompt with
        no row left gets its result; at its decision point, counts = policy(view of its prompts, their scores),
        applied (0: the row leaves the cache; c > 1: c - 1 copies join it)
the winner rule picks each prompt's winner among its finished candidates (by default the highest reward)

A cohort's decision points are counted on its own clock from its own budget (``LoopSettings.budget``: the KV memory
its rows may hold, as a batch of its prompts alone holds it), so a seeded cohort gets the answer it gets decoding
alone, whatever else is running, and whenever its scores come back. Policies that decide across prompts
(``allocate``) see their cohort's prompts.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import closing
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rodeco.common.budget import Budget
from rodeco.common.protocols import Generator, LanguageModel, LoopHooks, Policy, Session
from rodeco.common.state import Compute, Counts, PromptRef, PromptResult, RoundView, Row
from rodeco.common.stops import StopStrings
from rodeco.common.validation import ConfigError
from rodeco.common.winner import WinnerRule
from rodeco.core.accounting import Accounting
from rodeco.core.contracts import Scorer, policy_info, select_checked
from rodeco.core.rounds import (
    START_BY_POLICY,
    LoopSettings,
    apply_counts,
    open_prompt,
    recorded_for,
    round_view,
    rows_per_prompt,
    session_spec,
    top_logprobs_read,
    winner_of,
)
from rodeco.core.scoring import Call, Inline, Scored, Worker
from rodeco.core.trace import Trace

__all__ = [
    "START_BY_POLICY",
    "Cancelled",
    "LoopSettings",
    "OpenStats",
    "Request",
    "Source",
    "decode_batch",
    "decode_open",
]


@dataclass
class Request:
    """A cohort: ``prompts`` with their settings (rows, sampling, length, stop strings, seed and their budget:
    ``settings.budget.kv_tokens`` is the memory their rows may hold, prompts included) and their policy, which sees
    them together at each decision point. ``on_done`` receives each prompt's result as soon as it has no row left;
    ``on_round`` each decision point; ``on_admit`` is called when the cohort joins the batch; ``on_error`` the error
    that refused it (its settings cannot run; without it, the error ends the decode) or ``Cancelled`` naming the
    prompts that were cancelled, as they leave. ``cancelled()`` says which prompts leave now: True (all of them) or
    their positions in ``prompts``; it is asked every ``check_tokens`` tokens and at every decision point, and a
    cancelled prompt's rows leave and it gets no result. Its rows are candidates ``first``, ``first + 1``, ... of
    each prompt (a cohort that opens the batch only)."""

    prompts: Sequence[PromptRef]
    settings: LoopSettings
    policy: Policy
    on_done: Callable[[PromptResult], None]
    on_round: Callable[[RoundView, list[Counts]], None] | None = None
    on_error: Callable[[Exception], None] | None = None
    on_admit: Callable[[], None] | None = None
    cancelled: Callable[[], bool | Collection[int]] | None = None
    first: int = 0
    arrived: float = field(default_factory=time.monotonic)


class Cancelled(Exception):
    """A request's ``cancelled()`` said so: the prompts at ``prompts`` (positions in its ``prompts``) get no result,
    and their ``rows`` left the batch."""

    def __init__(self, why: str, prompts: Sequence[int], rows: int = 0) -> None:
        super().__init__(why)
        self.prompts, self.rows = list(prompts), rows


StepsFeed = Callable[[list[int], list[int], list[float]], None]  # a stretch's steps: rows, context a row, seconds


class Source(Protocol):
    def take(self, wait: bool) -> list[Request] | None:
        """The requests that arrived since the last call, in arrival order; with ``wait``, block until one arrives.
        None once the source is closed and has nothing left."""
        ...


@dataclass
class OpenStats:
    """What a decode did: cohorts admitted, and per decode call the rows and prompts in the batch."""

    admitted: int = 0
    step_rows: list[int] = field(default_factory=list)
    step_prompts: list[int] = field(default_factory=list)
    peak_reserved: int = 0
    cancelled_rows: int = 0


@dataclass(frozen=True)
class _Limits:
    """What the running cohorts may hold together: their budgets (``kv_tokens``), their rows at the start
    (``max_rows``) and their prompts (``max_prompts``); None: no bound."""

    kv_tokens: int | None = None
    max_rows: int | None = None
    max_prompts: int | None = None


WAIT_S = 0.02  # the longest the loop waits for scores with nothing to decode before it looks for arrivals again


@dataclass
class _Round:
    """A round of scoring handed over (``rodeco.core.scoring``): the cohorts waiting for it, its calls, where each
    deciding cohort's active rows are in them (by ``id`` of the cohort: call index, first row, rows) and the
    scores' future (one ``Scored`` per call)."""

    cohorts: list[_Cohort]
    calls: list[Call]
    partial: dict[int, tuple[int, int, int]]
    future: Future[list[Scored]]


@dataclass
class _Cohort:
    """An admitted cohort: its request, batch keys, budget (``Budget.for_batch`` of its prompts alone), start
    length, rows per prompt at the start, decision interval, its winner rule (its policy's, where the policy sets
    one), the top-k log-probs its policy reads, and the decision points it has passed. Its clock is its prompts'
    in the session (``Session.clock``: steps since they joined, less the steps their rows were set aside)."""

    req: Request
    ids: list[list[int]]
    budget: Budget
    base: int
    n: int
    every: int | None
    reserved: int
    winner: WinnerRule
    top_k: int = 0
    keys: list[int] = field(default_factory=list)
    rounds: int = 0
    until: int = -1  # this round's decision point on its clock (-1: not set yet), fixed when the round starts
    left: list[Row] = field(default_factory=list)  # rows that finished this round, scored when it ends
    gone: set[int] = field(default_factory=set)  # keys given a result or cancelled
    scoring: _Round | None = None  # the round of scoring it waits for (None: it decodes)
    aside: int | None = None  # its rows' handle while they are set aside (``Session.park``)
    aside_at: float = 0.0  # when they were set aside

    @property
    def live(self) -> int:
        """Its prompts still decoding (neither given a result nor cancelled)."""
        return len(self.keys) - len(self.gone)

    @property
    def rows_at_start(self) -> int:
        return self.n * len(self.ids)

    def clock(self, sess: Session) -> int:
        return sess.clock(self.keys[0])  # its prompts joined together and are set aside together

    def rows(self, sess: Session) -> np.ndarray:
        """Its rows' batch indices, in order."""
        return np.nonzero(np.isin(sess.prompt_of, self.keys))[0]

    @property
    def vote_every(self) -> int | None:
        """Tokens between its vote checks (``winner.stop``), None: its vote does not stop."""
        return self.winner.stop_tokens if self.winner.stop is not None else None

    def at_vote_check(self, sess: Session) -> bool:
        clock, every = self.clock(sess), self.vote_every
        return every is not None and clock > 0 and clock % every == 0

    def at_point(self, sess: Session) -> bool:
        """At its decision point, with rows to decide on."""
        return self.clock(sess) >= self.until and bool(self.rows(sess).size)

    def next_stop(self, sess: Session) -> int:
        """Where its decoding stops next on its own clock: its decision point, or its next vote check."""
        if self.vote_every is None:
            return self.until
        return min(self.until, (self.clock(sess) // self.vote_every + 1) * self.vote_every)

    def next_point(self, sess: Session) -> int:
        """Its next decision point on its own clock: where the blocks its rows hold would outgrow its quota (its
        ``budget.kv_tokens``, asked of the session's block bookkeeping as vLLM's scheduler asks its KV manager), or
        its policy's next ``decision_tokens``, at most its ``max_new_tokens``."""
        s, clock = self.req.settings, self.clock(sess)
        until = s.max_new_tokens
        if s.budget.kv_tokens is not None:
            rows, w = self.rows(sess), s.budget.row_overhead
            until = clock + sess.steps_within(rows, s.budget.kv_tokens, w, s.max_new_tokens - clock)
        if self.every:
            until = min(until, (clock // self.every + 1) * self.every)
        return until

    def text(self, gen: LanguageModel) -> Callable[[list[int]], str]:
        """A response as rewards and results read it: cut at its stop strings."""
        return StopStrings(tuple(self.req.settings.stop)).text(gen.decode_text)


def decode_batch(
    gen: Generator,
    scorer: Scorer,
    policy: Policy,
    prompts: Sequence[PromptRef | tuple[int, str]],
    s: LoopSettings,
    on_round: Callable | None = None,
    on_done: Callable | None = None,
    partial: Scorer | None = None,
    first: int = 0,
    cancelled: Callable[[Session], Collection[int]] | None = None,
    hooks: LoopHooks | None = None,
) -> tuple[list[PromptResult], Compute]:
    """Decode several prompts as one cohort; ``prompts`` are ``PromptRef``s (or (dataset index, text) pairs).

    Returns each prompt's ``PromptResult`` and the batch's total ``Compute`` (a prompt's share of time and reward
    cost in proportion to its tokens and requests). ``on_round(view, keep)`` is called at each decision point and
    ``on_done(result)`` as soon as a prompt has no active row left. The rows are the generator's session
    (``Generator.open_session``: live, vLLM, or a recorded pool's); they are candidates ``first``, ``first + 1``, ...
    of each prompt. ``partial`` scores active rows at decision points (the ``partial_reward`` role); by default
    ``scorer`` does. ``cancelled(session)`` names batch keys whose rows leave now (a server's disconnected clients;
    it may read the session's rows and step); it is asked at every decision point and every ``s.check_tokens``
    tokens, and a cancelled prompt gets no result (the others' are returned, in order). ``hooks`` (a ``Plugins``)
    are fired at each decision point (``round_end``, before ``on_round``) and each prompt's end (``prompt_done``,
    after ``on_done``)."""
    refs = [p if isinstance(p, PromptRef) else PromptRef(*p) for p in prompts]
    b = _Batch(gen, scorer, partial or scorer, _Limits(), per_call=False, pool=s.budget.kv_tokens, hooks=hooks)

    def asked() -> Collection[int]:
        return () if cancelled is None or b.sess is None else cancelled(b.sess)

    req = Request(refs, s, policy, on_done or (lambda r: None), on_round, cancelled=asked, first=first)
    with closing(b):  # a run stopped or failed mid-batch leaves nothing decoding (vLLM's requests are aborted)
        _run(b, _One(req), s.check_tokens if cancelled is not None else None)
    if b.failed:
        raise b.failed[0]
    assert b.sess is not None  # the cohort was admitted, or the error above was raised
    return [b.results[p] for p in sorted(b.results)], b.acct.batch(b.sess.stats)


def decode_open(
    gen: Generator,
    scorer: Scorer,
    source: Source,
    kv_tokens: int | None,
    partial: Scorer | None = None,
    check_tokens: int = 16,
    observe: Callable[[int, int, int], None] | None = None,
    max_rows: int | None = None,
    max_prompts: int | None = None,
    hooks: LoopHooks | None = None,
    top_logprobs: int = 0,
    on_steps: StepsFeed | None = None,
    scoring: Inline | Worker | None = None,
) -> OpenStats:
    """Decode every request ``source`` gives until it closes and nothing is running (see the module doc).
    ``kv_tokens``: the memory all running cohorts' budgets may add up to (None: no limit); a request whose own budget
    exceeds it is refused with a ``ConfigError``. ``check_tokens``: the most tokens decoded between admissions.
    ``observe(waiting, prompts, rows)`` is told, before each stretch of decoding, the requests waiting for room and
    the prompts and rows in the batch. ``max_rows`` and ``max_prompts`` bound the rows the running cohorts start
    with and their prompts (a request asking more rows than ``max_rows`` is refused); the engine's own bound
    (``EngineInfo.max_rows``) applies too. ``hooks`` are fired at each cohort's decision points and each prompt's
    end, as ``decode_batch`` fires them. ``top_logprobs``: the session records at least this many of each step's most
    likely tokens' log-probs (a request whose policy reads more than it records is refused). ``on_steps(rows,
    context, seconds)`` is told, after each stretch of decoding, its steps' rows, cached tokens a row and seconds
    (a server's step-time model). ``scoring``: where the rewards run (``rodeco.core.scoring``; by default on this
    thread, ``Inline``); on a ``Worker``, a cohort waiting for its scores has its rows set aside while the others
    decode, where the session can (``Session.parks``)."""
    if gen.info.max_rows is not None:
        max_rows = gen.info.max_rows if max_rows is None else min(max_rows, gen.info.max_rows)
    limits = _Limits(kv_tokens, max_rows, max_prompts)
    b = _Batch(
        gen,
        scorer,
        partial or scorer,
        limits,
        per_call=True,
        pool=kv_tokens,
        hooks=hooks,
        top_k=top_logprobs,
        on_steps=on_steps,
        scoring=scoring,
    )
    with closing(b):
        _run(b, source, check_tokens, observe)
    if b.failed:
        raise b.failed[0]
    return b.stats


def _run(b: _Batch, source: Source, check: int | None, observe: Callable[[int, int, int], None] | None = None) -> None:
    """The loop of the module doc over ``b``, until ``source`` closes and nothing runs."""
    closed = False
    while not b.failed:
        if observe is not None and not b.running:  # idle: nothing in the batch
            observe(len(b.waiting), 0, 0)
        got = source.take(wait=not b.running and not b.waiting)
        if got is None:
            closed = True
        else:
            b.waiting.extend(got)
        if closed and not b.waiting and not b.running:
            return
        b.cancel()
        b.admit()
        sess = b.sess
        if observe is not None:
            observe(len(b.waiting), sum(c.live for c in b.running), sess.rows if sess is not None else 0)
        if sess is None or not b.running:
            continue
        b.decode(check)
        b.cancel()
        b.submit(*b.round_ends())
        b.collect(block=all(c.scoring is not None for c in b.running))  # nothing decodes: wait for scores


class _NoHooks:
    """The hooks of a decode given none: nothing fires."""

    def round_end(self, view: RoundView, counts: list[Counts]) -> None:
        pass

    def prompt_done(self, result: PromptResult) -> None:
        pass


class _One:
    """A source of one request, then closed (``decode_batch``)."""

    def __init__(self, req: Request) -> None:
        self.req: Request | None = req

    def take(self, wait: bool) -> list[Request] | None:
        req, self.req = self.req, None
        return [req] if req is not None else None


class _Batch:
    """The loop's state: the cohorts waiting and running, the session, the trace and the accounting, and the steps
    of ``_run`` (cancel, admit, decode, the rounds' ends, finish, decide). ``per_call``: each prompt is charged what
    was done for it as it happened (``Accounting``), as an open batch's prompts come and go. ``pool``: the KV tokens
    the session's pool holds (a closed batch's budget, an open batch's limit; None: no limit, the pool grows).
    ``hooks``: fired at every decision point and every prompt's end (None: none). ``top_k``: the least top-k
    log-probs the session records at each step (more where the first cohorts' rewards, policies or winner rules
    read more). ``on_steps``: told each stretch's steps (``decode_open``'s)."""

    def __init__(
        self,
        gen: Generator,
        scorer: Scorer,
        decider: Scorer,
        limits: _Limits,
        per_call: bool,
        pool: int | None,
        hooks: LoopHooks | None = None,
        top_k: int = 0,
        on_steps: StepsFeed | None = None,
        scoring: Inline | Worker | None = None,
    ) -> None:
        self.gen, self.scorer, self.decider, self.limits, self.pool = gen, scorer, decider, limits, pool
        self.scoring = scoring if scoring is not None else Inline()  # where the rewards run
        self.hooks: LoopHooks = hooks if hooks is not None else _NoHooks()
        self.waiting: deque[Request] = deque()
        self.running: list[_Cohort] = []
        self.stats = OpenStats()
        self.sess: Session | None = None
        self.trace = Trace()
        self.acct = Accounting(gen, 0, per_call=per_call)
        self.failed: list[Exception] = []  # an error without a request's on_error to take it: ends the decode
        self.results: dict[int, PromptResult] = {}  # by batch key, kept unless per_call (a closed batch returns them)
        self.top_k = top_k  # the top-k log-probs the session records at each step (at least; set when it opens)
        self.on_steps = on_steps  # told each stretch's steps (decode_open's on_steps)
        self.steps_fed = 0  # the session's steps told so far

    def close(self) -> None:
        if self.sess is not None:
            self.sess.close()

    def _refuse(self, req: Request, e: Exception) -> None:
        """A request that gets no (more) result: its ``on_error`` is told why; without one, a cancellation is
        dropped and any other error ends the decode."""
        if req.on_error is not None:
            req.on_error(e)
        elif not isinstance(e, Cancelled):
            self.failed.append(e)

    def start(self, req: Request) -> _Cohort:
        """A request's budget, rows and decision interval, checked against the limits (``ConfigError`` naming
        the key)."""
        s, lim = req.settings, self.limits
        ids = [self.gen.encode(r.source) for r in req.prompts]
        lens = list(map(len, ids))
        s.budget.check_feasible(lens, s.max_new_tokens, self.gen.kv)
        budget, base = s.budget.for_batch(lens, self.gen.kv)  # the rows' share, their start length
        n = rows_per_prompt(s, budget, base, len(ids), req.policy)
        reserved = int(s.budget.kv_tokens) if s.budget.kv_tokens is not None else 0
        if lim.kv_tokens is not None and reserved > lim.kv_tokens:
            raise ConfigError("budget.kv_tokens", reserved, f"exceeds the open batch's {lim.kv_tokens}", "ask for less")
        if lim.max_rows is not None and n * len(ids) > lim.max_rows:
            raise ConfigError(
                "n", n, f"more rows than the open batch's {lim.max_rows}", f"ask for at most {lim.max_rows}"
            )
        info = policy_info(req.policy, s.policy_name)
        winner, top_k = winner_of(s, info), top_logprobs_read(s, info)
        if self.sess is not None and top_k > self.top_k:
            raise ConfigError(
                "policy",
                s.policy_name,
                f"reads the {top_k} most likely tokens' log-probs, which the running session does not record "
                f"(it records {self.top_k})",
                "start the server or the decode with that policy (or a reward that reads as many)",
            )
        return _Cohort(req, ids, budget, base, n, info.decision_tokens, reserved, winner, top_k)

    def cancel(self) -> None:
        """Prompts whose ``cancelled()`` says so: refused while waiting, their rows rejected while running."""
        for req in [r for r in self.waiting if r.cancelled is not None and r.cancelled() is True]:
            self.waiting.remove(req)
            self._refuse(req, Cancelled("cancelled before it was admitted", range(len(req.prompts))))
        sess = self.sess
        if sess is None:
            return
        for c in [c for c in self.running if c.req.cancelled is not None]:
            said = c.req.cancelled()  # type: ignore[misc]  # not None: filtered above
            keys = set(c.keys) if said is True else {c.keys[i] for i in (said or ())}
            keys = keys - c.gone
            if not keys:
                continue
            if c.aside is not None:  # set aside while it waits for scores: back to leave, the rest aside again
                self._back(c)
            rows = [i for i, q in enumerate(sess.prompt_of.tolist()) if q in keys]
            self.stats.cancelled_rows += len(rows)
            self.trace.cancel(sess.reject(rows) if rows else [])
            c.left = [r for r in c.left if r.prompt not in keys]
            for p in keys:
                self.trace.forget(p)
            c.gone |= keys
            if c.gone == set(c.keys):
                self.running.remove(c)
            elif c.scoring is not None and c.rows(sess).size:
                c.aside, c.aside_at = sess.park(c.keys), time.perf_counter()
            where = [i for i, k in enumerate(c.keys) if k in keys]
            self._refuse(c.req, Cancelled("cancelled while decoding", where, len(rows)))

    def admit(self) -> None:
        """Waiting cohorts join, in arrival order: the first that does not fit waits, and so do all behind it."""
        lim = self.limits
        joining: list[_Cohort] = []
        while self.waiting:
            try:
                c = self.start(self.waiting[0])
            except (ConfigError, ValueError) as e:
                self._refuse(self.waiting.popleft(), e)
                if self.failed:
                    return
                continue
            held = sum(r.reserved for r in [*self.running, *joining])
            started = sum(r.rows_at_start for r in [*self.running, *joining])
            prompts = sum(len(r.ids) for r in [*self.running, *joining])
            if (self.running or joining) and (
                (lim.kv_tokens is not None and held + c.reserved > lim.kv_tokens)
                or (lim.max_rows is not None and started + c.rows_at_start > lim.max_rows)
                or (lim.max_prompts is not None and prompts + len(c.ids) > lim.max_prompts)
            ):
                break
            self.waiting.popleft()
            joining.append(c)
        if not joining:
            return
        self._join(joining)
        self.stats.admitted += len(joining)
        self.stats.peak_reserved = max(self.stats.peak_reserved, sum(r.reserved for r in self.running))
        for c in joining:
            if c.req.on_admit is not None:
                c.req.on_admit()

    def _join(self, joining: list[_Cohort]) -> None:
        """Cohorts join the batch (the first opens the session, its pool sized by the run's budget): forwarded,
        fanned out, entered in the trace and accounting."""
        gen, trace = self.gen, self.trace
        P0 = len(trace.prompts)
        for c in joining:
            s = c.req.settings
            text = c.text(gen)
            own = (s.policy_name, s.reward_name, c.winner, s.all_candidates, text)
            c.keys = [trace.admit(r, c.n, *own) for r in c.req.prompts]
        self.acct.admit(len(trace.prompts) - P0)
        weights = np.zeros(len(trace.prompts))
        weights[P0:] = [len(i) for c in joining for i in c.ids]
        with self.acct.timed("prefill", weights):
            if self.sess is None:
                first = joining[0]
                recorded = recorded_for(self.scorer, self.decider, max(self.top_k, *(c.top_k for c in joining)))
                spec = session_spec(first.req.settings, self.pool, **recorded)
                self.sess = gen.open_session(spec)
                self.top_k = spec.top_logprobs
            sess = self.sess
            prompts = [open_prompt(c.req.settings, r, c.n, c.req.first) for c in joining for r in c.req.prompts]
            keys = sess.admit([i for c in joining for i in c.ids], prompts)
            assert keys == [k for c in joining for k in c.keys]  # one key per prompt, in order
            self.running.extend(joining)
        new = sess.prompt_of >= P0
        trace.start(sess.prompt_of[new], sess.cand[new])

    def decode(self, check: int | None) -> None:
        """Each cohort's decision point fixed as its round starts; then decode to the earliest, pausing after
        ``check`` tokens (None: no pause), or after each step while a cohort waits for its scores."""
        sess = self.sess
        assert sess is not None  # a cohort is running
        going = [c for c in self.running if c.scoring is None]  # not waiting for scores
        for c in going:  # a round starts: its decision point is fixed for the round
            if c.until < 0:
                c.until = c.next_point(sess)
        ahead = min((c.next_stop(sess) - c.clock(sess) for c in going), default=0)
        if ahead <= 0:
            return
        self.stats.step_rows.append(sess.rows)
        self.stats.step_prompts.append(sum(c.live for c in going))
        owner = {k: c for c in going for k in c.keys}
        pause = None if not check else (sess.t // check + 1) * check
        if len(going) < len(self.running):  # a cohort waits for scores: back in the batch a step after they are in
            pause = sess.t + 1
        weights = np.bincount(sess.prompt_of, minlength=self.acct.n_prompts).astype(float)
        with self.acct.timed("decode", weights):
            for row in sess.decode(until=sess.t + ahead, pause=pause):
                owner[row.prompt].left.append(row)
        if self.on_steps is not None:
            st, k = sess.stats, self.steps_fed
            self.steps_fed = len(st.step_seconds)
            self.on_steps(st.step_rows[k:], st.step_context[k:], st.step_seconds[k:])

    def round_ends(self) -> tuple[list[_Cohort], list[_Cohort]]:
        """The cohorts whose round ends here (at their decision point or vote check, or with no unfinished row),
        their finished rows retired into ``left``, and those of them at their decision point with rows to score
        whose vote does not stop (the others' rows are scored once their votes are counted)."""
        sess = self.sess
        assert sess is not None
        fin = sess.finished_rows()
        ending = [
            c
            for c in self.running
            if c.scoring is None and (c.clock(sess) >= c.until or c.at_vote_check(sess) or fin[c.rows(sess)].all())
        ]
        keys = [k for c in ending for k in c.keys]
        retired = sess.retire_finished(keys) if ending else []
        owner = {k: c for c in ending for k in c.keys}
        for row in retired:
            owner[row.prompt].left.append(row)
        deciding = [c for c in ending if c.winner.stop is None and c.at_point(sess)]
        return ending, deciding

    def submit(self, ending: list[_Cohort], deciding: list[_Cohort]) -> None:
        """One round of scoring for ``ending``'s finished rows (``reward``) and ``deciding``'s active rows
        (``partial_reward``): one call per role and set of stop strings, each cutting its own text. Until its scores
        are back the cohorts wait, their rows set aside where the scoring runs elsewhere (``Session.park``); where
        the session cannot set rows aside, the loop waits for them."""
        sess = self.sess
        assert sess is not None
        if not ending and not deciding:
            return
        calls: dict[tuple[str, tuple[str, ...]], Call] = {}
        where: dict[int, tuple[tuple[str, tuple[str, ...]], int, int]] = {}
        for c in ending:
            key = ("reward", tuple(c.req.settings.stop))
            calls.setdefault(key, Call(self.scorer, "reward", c.text(self.gen), [])).rows.extend(c.left)
            c.left = []
        active = sess.active() if deciding else []
        for c in deciding:
            key = ("partial_reward", tuple(c.req.settings.stop))
            call = calls.setdefault(key, Call(self.decider, "partial_reward", c.text(self.gen), []))
            mine = [active[i] for i in c.rows(sess)]
            where[id(c)] = (key, len(call.rows), len(mine))
            call.rows.extend(mine)
        order = list(calls)
        cohorts = list({id(c): c for c in [*ending, *deciding]}.values())
        partial = {i: (order.index(k), a, n) for i, (k, a, n) in where.items()}
        ordered = [calls[k] for k in order]
        rnd = _Round(cohorts, ordered, partial, self.scoring.submit(ordered, self.trace.prompts))
        for c in cohorts:
            c.scoring = rnd
        if rnd.future.done():
            return
        if not sess.parks:
            wait([rnd.future])
            return
        for c in cohorts:
            if c.rows(sess).size:
                c.aside, c.aside_at = sess.park(c.keys), time.perf_counter()

    def _back(self, c: _Cohort) -> None:
        """Cohort ``c``'s rows, set aside while it waited for scores, back in the batch; its prompts are charged the
        seconds they were held (``held``)."""
        assert self.sess is not None and c.aside is not None
        self.sess.unpark(c.aside)
        c.aside = None
        w = np.isin(np.arange(self.acct.n_prompts), c.keys).astype(float)
        self.acct.add_time("held", time.perf_counter() - c.aside_at, w)

    def collect(self, block: bool) -> None:
        """Every round of scoring that is back, applied (``_apply``); with ``block`` and none back, wait a little
        for one first (the loop then looks for arrivals again)."""
        while True:
            rounds = list({id(c.scoring): c.scoring for c in self.running if c.scoring is not None}.values())
            done = [r for r in rounds if r.future.done()]
            if not done and block and rounds:
                t0 = time.perf_counter()
                wait([r.future for r in rounds], timeout=WAIT_S, return_when=FIRST_COMPLETED)
                self.acct.add_time("wait_scores", time.perf_counter() - t0)  # nothing decoded meanwhile
                done = [r for r in rounds if r.future.done()]
            if not done:
                return
            for r in done:
                self._apply(r)
            block = False

    def _apply(self, rnd: _Round) -> None:
        """A round's scores: charged, the finished rows' entered; its cohorts' rows back in the batch; votes counted
        (``settle``), results given (``finish``); each cohort at its decision point decides, or, its vote counted,
        has its active rows scored in a round of their own."""
        sess = self.sess
        assert sess is not None
        got: list[Scored] = rnd.future.result()  # the scoring's error is raised here, on the loop's thread
        gone = {k for c in rnd.cohorts for k in c.gone}
        for call, sc in zip(rnd.calls, got):
            self.acct.charge(call.role, [r.prompt for r in call.rows], sc.cost, sc.seconds)
            if call.role == "reward":
                keep = [i for i, r in enumerate(call.rows) if r.prompt not in gone]
                self.trace.finished([call.rows[i] for i in keep], sc.scores[keep])
        live = [c for c in rnd.cohorts if c in self.running]
        for c in live:
            c.scoring = None
            if c.aside is not None:
                self._back(c)
        self.settle(live)
        self.finish()
        later = []
        for c in live:
            if c not in self.running or not c.at_point(sess):
                continue
            if id(c) not in rnd.partial:
                later.append(c)
                continue
            i, a, n = rnd.partial[id(c)]
            self.decide(c, rnd.calls[i].rows[a : a + n], got[i].scores[a : a + n])
            c.until = -1
        self.finish()
        self.submit([], later)

    def settle(self, cohorts: list[_Cohort]) -> None:
        """Of ``cohorts`` (their finished rows just scored), each prompt whose vote is settled (``winner.stop``): its
        active rows stop, and it gets its result."""
        sess = self.sess
        assert sess is not None
        for c in cohorts:
            if c.winner.stop is None:
                continue
            for p in c.keys:
                rows = np.flatnonzero(sess.prompt_of == p)
                if p in c.gone or not rows.size:
                    continue
                if c.winner.settled(self.trace.answers(p), len(rows)):
                    self.trace.stopped(p, sess.reject(rows.tolist()), c.clock(sess))

    def finish(self) -> None:
        """A prompt with no row left gets its result; a cohort whose prompts all have one leaves."""
        sess = self.sess
        assert sess is not None
        live = set(sess.prompt_of.tolist())
        for c in [c for c in self.running if c.scoring is None]:  # a waiting cohort's results wait for its scores
            for p in c.keys:
                if p not in live and p not in c.gone:
                    c.gone.add(p)
                    result = self.trace.result(p, self.acct.prompt(p, sess.stats))
                    self.trace.forget(p)
                    if not self.acct.per_call:
                        self.results[p] = result
                    c.req.on_done(result)
                    self.hooks.prompt_done(result)
            if c.gone == set(c.keys):
                self.running.remove(c)

    def decide(self, c: _Cohort, mine: list[Row], scores: np.ndarray) -> None:
        """Cohort ``c`` at its decision point, its active rows ``mine`` scored ``scores``: its policy asked, its
        counts applied."""
        sess, trace, acct = self.sess, self.trace, self.acct
        assert sess is not None
        s, clock, rows = c.req.settings, c.clock(sess), c.rows(sess)
        assert [r.candidate_id for r in mine] == sess.cand[rows].tolist()  # the rows scored are the rows there
        trace.scored(sess.prompt_of[rows], sess.cand[rows], scores)
        with acct.timed("prune", np.isin(np.arange(acct.n_prompts), c.keys).astype(float)):
            fit = c.budget.max_rows(c.base + clock, c.base + s.max_new_tokens)
            tops = [_top(r, c.top_k) for r in mine] if c.top_k else None
            view, rows_of, keys = round_view(c.rounds, sess, rows, np.asarray(scores), trace, s, clock, fit, c.n, tops)
            counts = select_checked(c.req.policy, s.policy_name, view)
            self.hooks.round_end(view, counts)
            if c.req.on_round is not None:
                c.req.on_round(view, counts)
            apply_counts(sess, trace, c.rounds, rows_of, keys, view, counts, at=clock)
        c.rounds += 1


def _top(row: Row, k: int) -> np.ndarray:
    """[tokens, k] a row's most likely tokens' log-probs at each position (its policy's ``top_logprobs``)."""
    top = row.top_logprobs or []
    return np.asarray(top, dtype=np.float64).reshape(len(top), -1)[:, :k]
