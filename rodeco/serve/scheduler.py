"""The batcher: one thread that owns the decoder and runs the one loop (``rodeco.core.loop.decode_open``) over
the queue.

Jobs queue (bounded: a full queue is a 429). Every job is a cohort of one prompt and joins the running batch within
``serve.check_tokens`` tokens of its arrival, whatever its settings, when its budget fits beside the running jobs'
(the server's budget; in arrival order: a job waits only for jobs that arrived before it), and decodes on its own
clock with its own budget (its block quota), so a seeded request gets the answer it gets alone. The loop pauses every
``serve.check_tokens`` tokens so that cancelled jobs (a client gone, a timeout) leave, their rows and memory freed,
whatever the policy, Best-of-N included.

The server is one run to the plugins: ``rodeco_run_start`` fires when the batcher starts, ``rodeco_run_end`` when it
has stopped; the loop fires ``rodeco_round_end`` and ``rodeco_prompt_done`` for every request in between.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from rodeco.api import Decoder
from rodeco.common.protocols import Policy, StartChooser
from rodeco.common.state import Compute, Counts, PromptResult, PromptView, RoundView, StartView
from rodeco.common.validation import node_dict
from rodeco.core.config import ServeConfig
from rodeco.core.contracts import policy_info
from rodeco.core.loop import Cancelled, Request
from rodeco.core.scoring import Inline, Worker
from rodeco.serve.errors import APIError
from rodeco.serve.jobs import Job
from rodeco.serve.metrics import Metrics
from rodeco.serve.slack import Limits, StepTimes, Work, choose_rows, measure_steps

log = logging.getLogger(__name__)


class KeepAtLeast:
    """A policy wrapper: each prompt keeps at least ``need[prompt index]`` candidates to the end (finished ones
    count), taking back its best-scoring rejected rows where the policy kept fewer (a request's ``n``), as far as
    the budget's rows allow (a request's budget holds ``n`` rows at full length, but a search policy's copies may
    have taken the room; the request then gets fewer choices)."""

    def __init__(self, inner: Policy, need: dict[int, int], name: str = "") -> None:
        self.inner, self.need = inner, need
        self.info = policy_info(inner, name)  # the inner policy's, unchanged

    def choose_start(self, view: StartView) -> int:
        assert isinstance(self.inner, StartChooser)  # asked only when the inner policy's info declares chooses_start
        return self.inner.choose_start(view)

    def select(self, view: RoundView) -> list[list[int] | Counts]:
        answers = [
            list(a) if isinstance(a, Counts) else list(Counts.keep(a, pv.k))
            for pv, a in zip(view.prompts, self.inner.select(view))
        ]
        room = view.max_rows_next - sum(map(sum, answers))  # rows taken back stay within the budget's rows
        for pv, counts in zip(view.prompts, answers):
            short = min(self.need.get(pv.prompt_index, 1) - len(pv.finished_scores) - sum(counts), room)
            for i in np.argsort(-np.asarray(pv.scores), kind="stable"):
                if short <= 0:
                    break
                if counts[i] == 0:
                    counts[i], short, room = 1, short - 1, room - 1
        return [Counts(c) for c in answers]


@dataclass
class Answer:
    """What a job gets back: its result (every candidate) and its share of the batch's compute."""

    result: PromptResult
    bon_flops_modelled: float
    queue_s: float
    decode_s: float
    batch_requests: int


class Scheduler:
    def __init__(self, decoder: Decoder, serve: ServeConfig, metrics: Metrics) -> None:
        self.dec, self.serve, self.metrics = decoder, serve, metrics
        self.budget = decoder.budget()
        self.cond = threading.Condition()
        self.queue: list[Job] = []
        self.running: list[Job] = []
        self.closing = False  # SIGTERM: no new jobs
        self.stopped = False
        self.peak_kv = 0
        self.served = Compute()  # what the answered requests were charged, summed: the run's compute at its end
        self.thread = threading.Thread(target=self._loop, name="rodeco-batcher", daemon=True)
        metrics.budget.set(-1 if self.budget.kv_tokens is None else self.budget.kv_tokens)
        self.steps = 0  # decode steps so far
        self.step_times: StepTimes | None = None  # the step-time model (serve.latency_target): fitted at start
        # where the rewards run: a thread of their own (serve.reward_thread), or the decode thread
        self.scoring = Worker(serve.reward_threads) if serve.reward_thread else Inline()
        self.ready = threading.Event()  # the batcher thread has set its threads (and measured its steps)

    def _fed(self, rows: list[int], context: list[int], seconds: list[float]) -> None:
        """A stretch of decoding: its steps counted, and the step-time model refitted with them."""
        with self.cond:
            self.steps += len(seconds)
            if self.step_times is not None:
                self.step_times.add(rows, context, seconds)

    def start(self) -> None:
        """The server's run starts: ``rodeco_run_start`` (the server's config; its prompts are not known in advance,
        so ``n_prompts`` is 0), then the batcher thread."""
        self.dec.plugins.run_start(config=node_dict(self.dec.cfg), n_prompts=0)
        self.thread.start()
        self.ready.wait()

    def _setup(self) -> None:
        """On the batcher thread, before it serves: its torch threads (``serve.decode_threads``; torch's intra-op
        threads are set per thread, so the reward thread keeps its own), then the step-time model measured with
        them (``serve.latency_target``)."""
        import torch

        if self.serve.decode_threads is not None:
            torch.set_num_threads(self.serve.decode_threads)
        where = "a thread of their own" if self.serve.reward_thread else "the decode thread"
        log.info("decoding with %d torch thread(s); the rewards score on %s", torch.get_num_threads(), where)
        if self.serve.latency_target is not None:
            model = measure_steps(self.dec.gen)
            log.info("step-time model: %.4f s + %.2e s a row + %.2e s a row's cached token", model.a, model.b, model.c)
            self.step_times = StepTimes(model)

    def submit(self, job: Job) -> None:
        with self.cond:
            if self.closing:
                raise APIError(
                    503,
                    "the server is shutting down. Fix: retry on another instance",
                    type="server_error",
                    code="shutting_down",
                )
            if len(self.queue) >= self.serve.max_queue:
                raise APIError(
                    429,
                    f"the queue is full ({self.serve.max_queue} requests, serve.max_queue). Fix: "
                    f"retry after {self.serve.retry_after_s} s",
                    type="rate_limit_error",
                    code="queue_full",
                    headers={"Retry-After": str(self.serve.retry_after_s)},
                )
            if self.step_times is not None:
                self._admit_by_slack(job)
            self.queue.append(job)
            self.metrics.queue_depth.set(len(self.queue))
            self.cond.notify_all()

    def _admit_by_slack(self, job: Job) -> None:
        """``serve.latency_target``: a job starts the most rows (of its ``rows``, down to ``best_of``) the step-time
        plan has finish within the target without pushing a running or queued job past its own; where even
        ``best_of`` rows do not, 429 at once, with the seconds until it could start as ``Retry-After`` (held
        ``self.cond``)."""
        assert self.step_times is not None and self.serve.latency_target is not None
        target, now = self.serve.latency_target, time.monotonic()
        works = []
        for j in [*self.running, *self.queue]:  # the running ones first, then in arrival order
            done = self.steps - j.step0 if j.started is not None else 0
            left = max(j.key.max_tokens - done, 0)
            deadline = j.submitted + target - now
            works.append(Work(j.rows, j.prompt_tokens + done, left, j.kv_tokens, deadline, j.started is not None))
        new = Work(job.rows, job.prompt_tokens, job.key.max_tokens, job.kv_tokens, target, running=False)
        lim = Limits(
            self.budget.kv_tokens, self.serve.batch_requests, self.serve.max_batch_rows, self.serve.check_tokens
        )
        least = min(job.rows, job.key.best_of)  # never fewer than Best-of-N's rows
        rows, d = choose_rows(works, new, least, self.step_times.model, lim)
        if d.accept:
            if rows < job.rows:
                log.info("request %d starts %d rows of %d: the most that meet its target", job.id, rows, job.rows)
                job.rows = rows
            return
        self.metrics.refused_slack.inc()
        wait = math.ceil(d.retry_after) if math.isfinite(d.retry_after) else self.serve.retry_after_s
        raise APIError(
            429,
            f"the server cannot answer within serve.latency_target ({target:g} s): the plan has this request finish "
            f"in {d.finish:.1f} s, or push another past its target. Fix: retry after {wait} s, or ask for fewer "
            "tokens (max_tokens) or candidates (best_of)",
            type="rate_limit_error",
            code="latency_target",
            headers={"Retry-After": str(wait)},
        )

    def cancel(self, job: Job, why: str) -> None:
        """A job's client went away or its time ran out: it leaves the queue, or its batch within
        ``serve.check_tokens`` tokens."""
        if job.cancelled or job.future.done():
            return
        job.cancel()
        self.metrics.cancelled.inc()
        log.info("request %d cancelled: %s", job.id, why)
        with self.cond:
            if job in self.queue:
                self.queue.remove(job)
                self.metrics.queue_depth.set(len(self.queue))
                job.future.set_exception(APIError(499, f"the request was cancelled: {why}", code="cancelled"))

    def in_flight(self) -> int:
        with self.cond:
            return len(self.queue) + len(self.running)

    def close(self) -> None:
        """Take no new jobs (SIGTERM); the queued and running ones still finish."""
        with self.cond:
            self.closing = True

    def stop(self, reason: str = "the server stopped") -> None:
        """Cancel everything left and end the thread, waiting for it (at most ``serve.drain_timeout_s``) so that
        the run's end has fired when this returns."""
        with self.cond:
            self.stopped = True
            for j in self.queue + self.running:
                j.cancel()
                if not j.future.done():
                    j.future.set_exception(
                        APIError(503, f"{reason}. Fix: retry", type="server_error", code="shutting_down")
                    )
            self.queue.clear()
            self.cond.notify_all()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(self.serve.drain_timeout_s)
            if self.thread.is_alive():
                log.warning("the batcher did not stop within %.0f s", self.serve.drain_timeout_s)

    # -- the batcher thread ------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        """The batcher thread: ``_serve`` until the server stops, then ``rodeco_run_end`` (no results: each went to
        its client and to ``rodeco_prompt_done``; the compute the answered requests were charged)."""
        try:
            try:
                self._setup()
            finally:
                self.ready.set()
            self._serve()
        finally:
            self.scoring.close()
            self.dec.plugins.run_end(results=[], compute=self.served)

    def _serve(self) -> None:
        """Jobs join the batch as they arrive (see the module doc): one decode for as long as the server runs
        (restarted, its jobs failed, if it fails)."""
        m = self.metrics

        def observe(waiting: int, prompts: int, rows: int) -> None:
            m.queue_depth.set(waiting)
            m.batch_requests.set(prompts)
            m.batch_rows.set(rows)
            m.step_requests.observe(prompts)
            m.step_rows.observe(rows)
            with self.cond:
                for j in self.running:
                    if j.started is not None:
                        j.shared = max(j.shared, prompts)

        while not self.stopped:
            try:
                self.dec.serve_open(
                    _Jobs(self),
                    kv_tokens=self.budget.kv_tokens,
                    check_tokens=self.serve.check_tokens,
                    observe=observe,
                    max_rows=self.serve.max_batch_rows,
                    max_prompts=self.serve.batch_requests,
                    on_steps=self._fed,
                    scoring=self.scoring,
                )
            except Exception as e:  # a failed decode fails its jobs, never the server
                log.exception("the open batch failed")
                with self.cond:
                    failed, self.running = self.running, []
                for j in failed:
                    if not j.future.done():
                        j.future.set_exception(e)

    def _request(self, jobs: list[Job]) -> Request:
        """Jobs as one cohort of the loop (one job): their settings and budget, their policy kept to each job's
        ``n``, and what their answers, progress events, cancellation and metrics need."""
        m, k = self.metrics, jobs[0].key
        by_id = {j.id: j for j in jobs}
        kv = sum(j.kv_tokens for j in jobs)

        def leave(j: Job) -> None:
            with self.cond:
                if j in self.running:
                    self.running.remove(j)

        def on_admit() -> None:
            now = time.monotonic()
            for j in jobs:
                j.started, j.step0 = now, self.steps
                m.queue_wait.observe(now - j.submitted)
            m.admissions.inc(len(jobs))

        def on_done(r: PromptResult) -> None:
            j = by_id[r.prompt_index]
            leave(j)
            c = r.compute
            self.served.add(c)
            m.decode_tokens.inc(c.gen_decode_tokens)
            m.prefill_tokens.inc(c.gen_prefill_tokens)
            m.flops.inc(c.total_flops)
            self.peak_kv = max(self.peak_kv, c.peak_kv_tokens)
            m.peak_kv.set(self.peak_kv)
            if not j.future.done():
                j.future.set_result(self._answer(j, r, j.started or time.monotonic(), max(1, j.shared)))

        def on_error(e: Exception) -> None:
            gone = [jobs[i] for i in e.prompts] if isinstance(e, Cancelled) else jobs
            if isinstance(e, Cancelled):
                m.cancelled_rows.inc(e.rows)
                e = APIError(499, "the request was cancelled", code="cancelled")
            for j in gone:
                leave(j)
                if not j.future.done():
                    j.future.set_exception(e)

        def on_round(view: RoundView, counts: list[Counts]) -> None:
            for pv, c in zip(view.prompts, counts):
                j = by_id.get(pv.prompt_index)
                if j is not None and j.stream:
                    j.events.put(_progress(view.round, pv, c))

        def cancelled() -> list[int]:
            return [i for i, j in enumerate(jobs) if j.cancelled or self.stopped]

        return self.dec.request(
            [j.ref for j in jobs],
            n=jobs[0].rows,
            on_done=on_done,
            policy=jobs[0].policy,
            sampling=k.sampling,
            max_new_tokens=k.max_tokens,
            kv_tokens=kv,
            stop=k.stop,
            wrap_policy=lambda p: KeepAtLeast(p, {j.id: j.n for j in jobs}, str(jobs[0].policy.get("name", ""))),
            on_round=on_round,
            on_admit=on_admit,
            on_error=on_error,
            cancelled=cancelled,
        )

    def _answer(self, j: Job, r: PromptResult, t0: float, batch: int) -> Answer:
        """A finished job's answer, its tallies added to the metrics."""
        m, gen = self.metrics, self.dec.gen
        cands = r.candidates or []
        rejected = [c for c in cands if c.stop_reason == "rejected"]
        done = [c for c in cands if c.finished]
        mean_len = sum(len(c.token_ids) + (c.stop_reason == "eos") for c in done) / max(1, len(done))
        comp = r.compute
        per_final = (comp.reward_flops - comp.partial_reward_flops) / max(1, len(done))
        L = int(round(mean_len))
        decode = sum(gen.flops_per_token(j.prompt_tokens + t) for t in range(L))
        prefill = j.prompt_tokens * gen.flops_per_token(j.prompt_tokens // 2)
        bon = prefill + j.key.best_of * (decode + per_final)  # modelled: every candidate as long as the finished
        m.started.inc(r.n_start)
        m.rejected.inc(len(rejected))
        m.rejected_tokens.inc(sum(len(c.token_ids) for c in rejected))
        m.bon_flops.inc(bon)
        m.saved.inc(max(0.0, bon - comp.total_flops))
        return Answer(r, bon, (j.started or t0) - j.submitted, time.monotonic() - t0, batch)


def _progress(rnd: int, pv: PromptView, c: Counts) -> dict[str, Any]:
    """A streaming request's progress event at one of its decision points (its own step, on its own clock)."""
    return {
        "round": rnd,
        "tokens": pv.tokens_generated,
        "rows": pv.k,
        "kept": c.total,
        "best_partial": float(np.max(pv.scores)),
    }


class _Jobs:
    """The queue as an open source (``rodeco.core.loop.Source``): the jobs queued since the last call, moved to
    ``running``; None once the server stopped."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def take(self, wait: bool) -> list[Request] | None:
        s = self.sched
        with s.cond:
            while wait and not s.queue and not s.stopped:
                s.cond.wait(0.5)
            if s.stopped:
                return None
            s.queue = [j for j in s.queue if not j.cancelled]
            if not s.queue:
                return []
            cohorts = [[j] for j in s.queue]
            s.queue.clear()
            s.running += [j for c in cohorts for j in c]
            s.metrics.queue_depth.set(len(s.queue))
        return [s._request(c) for c in cohorts]
