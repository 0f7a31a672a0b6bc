"""Decoding an open source of prompts (a server's queue): prompts join the running batch as they arrive, and each
keeps its own clock, settings, budget and policy.

while prompts are running or may still arrive:
    admit the waiting prompts, in arrival order, while their budgets fit beside the running ones'
    decode to the earliest decision point of a running prompt, or ``check_tokens`` tokens
    score the finished rows; a prompt with no row left gets its result
    each prompt at its own decision point: score its rows, ask its policy, apply its counts

A prompt's decision points come from its own budget (``LoopSettings.budget``: the KV memory its rows may hold, as a
batch of one prompt holds it) and its policy's ``decision_tokens``, counted on its own clock, so a seeded prompt
under a policy that reads only its own prompt gets the answer it gets decoding alone, whatever else is running. The
batch API (``rodeco.loop.decode_batch``) keeps its shared budget and clock. Policies that decide across prompts
(``allocate``) see one prompt at a time here.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np

from rodeco.accounting import Accounting
from rodeco.budget import Budget
from rodeco.contracts import Scorer, policy_info, select_checked
from rodeco.loop import (
    LoopSettings,
    apply_counts,
    prompt_view,
    recorded_for,
    rows_per_prompt,
    score_rows,
    session_spec,
)
from rodeco.protocols import Generator, OpenSession, Policy
from rodeco.state import Counts, OpenPrompt, PromptRef, PromptResult, RoundView, Row
from rodeco.stops import StopStrings
from rodeco.trace import Trace
from rodeco.validation import ConfigError


@dataclass
class Request:
    """One prompt of an open source with its own settings (rows, sampling, length, stop strings, seed and its
    budget: ``settings.budget.kv_tokens`` is the memory its rows may hold, its prompt included) and its own policy.
    ``on_done`` receives its result; ``on_round`` each of its decision points; ``on_admit`` is called when it joins
    the batch; ``on_error`` the error that refused it (its settings cannot run; without it, the error ends the
    decode) or ``Cancelled`` once ``cancelled()`` said so (its rows leave within ``check_tokens`` tokens, and it gets
    no result)."""

    ref: PromptRef
    settings: LoopSettings
    policy: Policy
    on_done: Callable[[PromptResult], None]
    on_round: Callable[[RoundView, list[Counts]], None] | None = None
    on_error: Callable[[Exception], None] | None = None
    on_admit: Callable[[], None] | None = None
    cancelled: Callable[[], bool] | None = None
    arrived: float = field(default_factory=time.monotonic)


class Cancelled(Exception):
    """A request's ``cancelled()`` said so: its ``rows`` left the batch, and it gets no result."""

    def __init__(self, why: str, rows: int = 0) -> None:
        super().__init__(why)
        self.rows = rows


class Source(Protocol):
    def take(self, wait: bool) -> list[Request] | None:
        """The requests that arrived since the last call, in arrival order; with ``wait``, block until one arrives.
        None once the source is closed and has nothing left."""
        ...


@dataclass
class _Running:
    """An admitted prompt: its request, budget (``Budget.for_batch`` of the prompt alone), start length, rows at the
    start, decision interval, and the decision points it has passed."""

    req: Request
    budget: Budget
    base: int
    n: int
    every: int | None
    reserved: int
    rounds: int = 0
    until: int = -1  # this round's decision point on its clock (-1: not set yet), fixed when the round starts
    left: list[Row] = field(default_factory=list)  # rows that finished this round, scored when it ends

    def next_point(self, rows: int, clock: int) -> int:
        """Its next decision point on its own clock: where its rows would outgrow its budget, or its policy's next
        ``decision_tokens``, at most its ``max_new_tokens``."""
        s = self.req.settings
        until = min(self.budget.capacity(rows, self.base + s.max_new_tokens) - self.base, s.max_new_tokens)
        if self.every:
            until = min(until, (clock // self.every + 1) * self.every)
        return until


@dataclass
class OpenStats:
    """What an open decode did: prompts admitted, and per decode call the rows and prompts in the batch."""

    admitted: int = 0
    step_rows: list[int] = field(default_factory=list)
    step_prompts: list[int] = field(default_factory=list)
    peak_reserved: int = 0
    cancelled_rows: int = 0


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
) -> OpenStats:
    """Decode every request ``source`` gives until it closes and nothing is running (see the module doc).
    ``kv_tokens``: the memory all running prompts' budgets may add up to (None: no limit); a request whose own budget
    exceeds it is refused with a ``ConfigError``. ``check_tokens``: the most tokens decoded between admissions.
    ``observe(waiting, prompts, rows)`` is told, before each stretch of decoding, the requests waiting for room and
    the prompts and rows in the batch. ``max_rows`` and ``max_prompts`` bound the rows the running prompts start
    with and their number (a request asking more rows than ``max_rows`` is refused); the engine's own bound
    (``EngineInfo.max_rows``) applies too."""
    if not gen.info.admits:
        raise ConfigError(
            "generator",
            f"{gen.info.name}{' (compiled)' if gen.info.compiled else ''}",
            "does not admit prompts into a running batch",
            "use generator.engine=fast, hf or vllm (on CUDA with generator.compile=false: the compiled step runs as "
            "CUDA graphs there), or decode closed batches (decode_batch)",
        )
    if gen.info.max_rows is not None:
        max_rows = gen.info.max_rows if max_rows is None else min(max_rows, gen.info.max_rows)
    b = _OpenBatch(gen, scorer, partial or scorer, _Limits(kv_tokens, max_rows, max_prompts))
    closed = False
    while True:
        if observe is not None and not b.running:  # idle: nothing in the batch
            observe(len(b.waiting), 0, 0)
        got = source.take(wait=not b.running and not b.waiting)
        if got is None:
            closed = True
        else:
            b.waiting.extend(got)
        if closed and not b.waiting and not b.running:
            return b.stats
        b.cancel()
        b.admit()
        if observe is not None:
            observe(len(b.waiting), len(b.running), b.sess.rows if b.sess is not None else 0)
        if b.sess is None or not b.running:
            continue
        b.decode(check_tokens)
        _round_ends(b.sess, b.trace, b.acct, scorer, b.running)
        b.finish()
        for p, run in b.running.items():  # each prompt at its own decision point
            if b.sess.clock(p) >= run.until:
                _decide(b.sess, b.trace, b.acct, b.decider, p, run)
                run.until = -1


@dataclass(frozen=True)
class _Limits:
    """What the running prompts may hold together: their budgets (``kv_tokens``), their rows at the start
    (``max_rows``) and their number (``max_prompts``); None: no bound."""

    kv_tokens: int | None
    max_rows: int | None
    max_prompts: int | None


class _OpenBatch:
    """The open decode's state: the requests waiting and running, the session, the trace and the accounting, and
    the steps of ``decode_open``'s loop (cancel, admit, decode, finish)."""

    def __init__(self, gen: Generator, scorer: Scorer, decider: Scorer, limits: _Limits) -> None:
        self.gen, self.scorer, self.decider, self.limits = gen, scorer, decider, limits
        self.waiting: deque[Request] = deque()
        self.running: dict[int, _Running] = {}
        self.stats = OpenStats()
        self.sess: OpenSession | None = None
        self.trace = Trace([], 0, gen.decode_text)
        self.acct = Accounting(gen, 0, per_call=True)

    def start(self, req: Request) -> tuple[_Running, list[int]]:
        """A request's budget, rows and decision interval, checked against the limits (``ConfigError`` naming
        the key)."""
        s, lim = req.settings, self.limits
        ids = self.gen.encode(req.ref.source)
        budget, base = s.budget.for_batch([len(ids)], self.gen.kv)
        s.budget.check_feasible(1, len(ids), len(ids) + s.max_new_tokens, self.gen.kv)
        n = rows_per_prompt(s, budget, base, 1, req.policy)
        reserved = int(s.budget.kv_tokens) if s.budget.kv_tokens is not None else 0
        if lim.kv_tokens is not None and reserved > lim.kv_tokens:
            raise ConfigError("budget.kv_tokens", reserved, f"exceeds the open batch's {lim.kv_tokens}", "ask for less")
        if lim.max_rows is not None and n > lim.max_rows:
            raise ConfigError(
                "n", n, f"more rows than the open batch's {lim.max_rows}", f"ask for at most {lim.max_rows}"
            )
        every = policy_info(req.policy, s.policy_name).decision_tokens
        return _Running(req, budget, base, n, every, reserved), ids

    def cancel(self) -> None:
        """Requests whose ``cancelled()`` says so: refused while waiting, their rows rejected while running."""
        for req in [r for r in self.waiting if r.cancelled is not None and r.cancelled()]:
            self.waiting.remove(req)
            _refuse(req, Cancelled("cancelled before it was admitted"))
        if self.sess is None:
            return
        for p in [p for p, r in self.running.items() if r.req.cancelled is not None and r.req.cancelled()]:
            rows = [i for i, q in enumerate(self.sess.prompt_of.tolist()) if q == p]
            self.stats.cancelled_rows += len(rows)
            self.trace.cancel({p}, self.sess.reject(rows) if rows else [])
            self.trace.forget(p)
            _refuse(self.running.pop(p).req, Cancelled("cancelled while decoding", len(rows)))

    def admit(self) -> None:
        """Waiting requests join, in arrival order: the first that does not fit waits, and so do all behind it."""
        lim = self.limits
        joining: list[tuple[_Running, list[int]]] = []
        while self.waiting:
            try:
                run, ids = self.start(self.waiting[0])
            except (ConfigError, ValueError) as e:
                _refuse(self.waiting.popleft(), e)
                continue
            held = sum(r.reserved for r in self.running.values()) + sum(r.reserved for r, _ in joining)
            started = sum(r.n for r in self.running.values()) + sum(r.n for r, _ in joining)
            if (
                (lim.kv_tokens is not None and held + run.reserved > lim.kv_tokens)
                or (lim.max_rows is not None and started + run.n > lim.max_rows)
                or (lim.max_prompts is not None and len(self.running) + len(joining) >= lim.max_prompts)
            ):
                break
            self.waiting.popleft()
            joining.append((run, ids))
        if not joining:
            return
        self.sess = _admit(self.gen, self.sess, self.trace, self.acct, self.running, joining, self.scorer, self.decider)
        self.stats.admitted += len(joining)
        self.stats.peak_reserved = max(self.stats.peak_reserved, sum(r.reserved for r in self.running.values()))
        for run, _ in joining:
            if run.req.on_admit is not None:
                run.req.on_admit()

    def decode(self, check_tokens: int) -> None:
        """Each prompt's decision point fixed as its round starts; then decode to the earliest, at most
        ``check_tokens`` tokens."""
        sess, running = self.sess, self.running
        assert sess is not None  # a prompt is running
        for p, r in running.items():  # a round starts: its decision point is fixed for the round, as a batch's is
            if r.until < 0:
                r.until = r.next_point(int((sess.prompt_of == p).sum()), sess.clock(p))
        ahead = min(r.until - sess.clock(p) for p, r in running.items())
        if ahead <= 0:
            return
        self.stats.step_rows.append(sess.rows)
        self.stats.step_prompts.append(len(running))
        with self.acct.timed("decode", np.bincount(sess.prompt_of, minlength=self.acct.n_prompts).astype(float)):
            for row in sess.decode(until=sess.t + min(ahead, check_tokens)):
                running[row.prompt].left.append(row)

    def finish(self) -> None:
        """A prompt with no row left gets its result."""
        assert self.sess is not None
        live = set(self.sess.prompt_of.tolist())
        for p in [p for p in self.running if p not in live]:
            run = self.running.pop(p)
            result = self.trace.result(p, self.acct.prompt(p, self.sess.stats))
            self.trace.forget(p)
            run.req.on_done(result)


def _round_ends(
    sess: OpenSession, trace: Trace, acct: Accounting, scorer: Scorer, running: dict[int, _Running]
) -> None:
    """The prompts whose round ends here (at their decision point, or with no unfinished row): their finished rows
    leave and are scored with the round's others, as a closed batch scores them, one call for all such prompts
    (one per distinct set of stop strings, each cutting its own text)."""
    fin = sess.finished_rows()
    ending = [p for p, r in running.items() if sess.clock(p) >= r.until or fin[sess.prompt_of == p].all()]
    for row in sess.retire_finished(ending):
        running[row.prompt].left.append(row)
    groups: dict[tuple[str, ...], list[Row]] = {}
    for p in ending:
        groups.setdefault(tuple(running[p].req.settings.stop), []).extend(running[p].left)
        running[p].left = []
    for rows in groups.values():
        if rows:
            text = _text(running[rows[0].prompt], acct.gen)
            trace.finished(rows, score_rows(scorer, "reward", text, trace.prompts, rows, acct))


def _admit(
    gen: Generator,
    sess: OpenSession | None,
    trace: Trace,
    acct: Accounting,
    running: dict[int, _Running],
    joining: Sequence[tuple[_Running, list[int]]],
    scorer: Scorer,
    decider: Scorer,
) -> OpenSession:
    """Prompts join the batch (the first opens it): forwarded, fanned out, entered in the trace and accounting."""
    keys_new = joining
    for run, _ in joining:
        s = run.req.settings
        p = trace.admit(run.req.ref, run.n, s.policy_name, s.winner, s.all_candidates, _text(run, gen))
        running[p] = run
    acct.admit(len(joining))
    first = joining[0][0].req.settings
    weights = np.zeros(len(trace.prompts))
    weights[len(trace.prompts) - len(joining) :] = [len(ids) for _, ids in joining]
    with acct.timed("prefill", weights):
        if sess is None:
            spec = session_spec(first, joining[0][0].n, [joining[0][0].req.ref], **recorded_for(scorer, decider))
            sess = cast(OpenSession, gen.open_session(spec))  # its info admits: its sessions are open ones
            sess.prefill([joining[0][1]])
            joining = joining[1:]
        if joining:
            keys = sess.admit(
                [ids for _, ids in joining],
                [
                    OpenPrompt(
                        n=r.n,
                        max_new_tokens=r.req.settings.max_new_tokens,
                        sampling=r.req.settings.sampling,
                        seed=r.req.ref.seed_or(r.req.settings.seed),
                        stream_key=r.req.ref.stream_key,
                        index=r.req.ref.index,
                        stop=tuple(r.req.settings.stop),
                    )
                    for r, _ in joining
                ],
            )
            assert keys == list(range(len(trace.prompts) - len(joining), len(trace.prompts)))  # one key per prompt
    new = sess.prompt_of >= len(trace.prompts) - len(keys_new)
    trace.start(sess.prompt_of[new], sess.cand[new])
    return sess


def _refuse(req: Request, e: Exception) -> None:
    """A request that gets no result: its ``on_error`` is told why (without one, the error ends the decode)."""
    if req.on_error is None:
        raise e
    req.on_error(e)


def _text(run: _Running, gen: Generator) -> Callable[[list[int]], str]:
    return StopStrings(tuple(run.req.settings.stop)).text(gen.decode_text)


def _decide(sess: OpenSession, trace: Trace, acct: Accounting, decider: Scorer, p: int, run: _Running) -> None:
    """Prompt ``p`` at its decision point: its rows scored, its policy asked, its counts applied."""
    s, clock = run.req.settings, sess.clock(p)
    rows = np.nonzero(sess.prompt_of == p)[0]
    active = [r for r, keep in zip(sess.active(), sess.prompt_of == p) if keep]
    scores = score_rows(decider, "partial_reward", _text(run, acct.gen), trace.prompts, active, acct)
    trace.scored(sess.prompt_of[rows], sess.cand[rows], scores)
    with acct.timed("prune", (np.arange(acct.n_prompts) == p).astype(float)):
        fit = run.budget.max_rows(run.base + clock, run.base + s.max_new_tokens)
        pv = prompt_view(run.rounds, p, sess.cand[rows].tolist(), scores, trace, clock, fit, s.seed)
        pv.min_reject = max(0, len(rows) - fit)
        view = RoundView(
            round=run.rounds, prompts=[pv], max_rows_next=fit, max_new_tokens=s.max_new_tokens, n_start=run.n
        )
        counts = select_checked(run.req.policy, s.policy_name, view)
        if run.req.on_round is not None:
            run.req.on_round(view, counts)
        apply_counts(sess, trace, run.rounds, [rows], [p], view, counts, at=clock)
    run.rounds += 1
