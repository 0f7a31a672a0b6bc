"""Where the loop's rewards run: on the decode thread (``Inline``, what a closed batch does) or on a worker thread
of their own (``Worker``, a server's), while the rows that wait for nothing keep decoding.

The loop hands over every call of a round at once (``Call``: a scorer, its role, how to read a response and the
rows): all the prompts at a decision point or vote check are scored together, one call per role and stop strings.
What a call cost (its scorer's tally and its seconds) is measured where it runs and charged by the loop, on its own
thread, when it reads the scores (``rodeco.core.accounting.Accounting.charge``), so nothing the loop keeps is written
from two threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from rodeco.common.state import PromptRef, Row, ScoreRequest
from rodeco.core.contracts import Scorer

log = logging.getLogger(__name__)


@dataclass
class Call:
    """One scorer call: ``rows`` in ``role`` (finished responses, or responses so far at a decision point), each
    response read by ``text`` (cut at its stop strings)."""

    scorer: Scorer
    role: str
    text: Callable[[list[int]], str]
    rows: list[Row]


@dataclass
class Scored:
    """A call's scores and what it cost: its scorer's tally grew by ``cost`` (tokens, FLOPs, calls) in ``seconds``."""

    scores: np.ndarray
    cost: np.ndarray
    seconds: float


def requests(call: Call, prompts: Sequence[PromptRef]) -> list[ScoreRequest]:
    """The reward's requests for ``call``'s rows (``prompts``: the batch's, by batch key)."""
    partial = call.role == "partial_reward"
    return [
        ScoreRequest(
            prompt=prompts[r.prompt].text,
            response=call.text(r.token_ids),
            response_ids=tuple(r.token_ids),
            partial=partial,
            prompt_index=prompts[r.prompt].index,
            candidate_id=r.candidate_id,
            logprobs=tuple(r.logprobs) if r.logprobs is not None else None,
            hidden_state=r.hidden,
            stream=r.stream,
            top_logprobs=tuple(map(tuple, r.top_logprobs)) if r.top_logprobs is not None else None,
            meta=prompts[r.prompt].meta,
        )
        for r in call.rows
    ]


def run_calls(calls: Sequence[Call], prompts: Sequence[PromptRef]) -> list[Scored]:
    """Each call, in order: its scores and what it cost (an empty call costs nothing and calls nothing)."""
    out = []
    for call in calls:
        c0 = call.scorer.cost()  # a reward's own tally is one object that grows: its values are read before and after
        tok0, flops0, n0 = c0.tokens, c0.flops, call.scorer.calls
        t0 = time.perf_counter()
        scores = call.scorer(requests(call, prompts)) if call.rows else np.zeros(0)
        dt = time.perf_counter() - t0
        c1 = call.scorer.cost()
        cost = np.array([c1.tokens - tok0, c1.flops - flops0, call.scorer.calls - n0], dtype=float)
        out.append(Scored(np.asarray(scores, dtype=float), cost, dt))
    return out


class Inline:
    """Rewards on the decode thread: a round's calls run when handed over (a closed batch's)."""

    def submit(self, calls: Sequence[Call], prompts: Sequence[PromptRef]) -> Future[list[Scored]]:
        fut: Future[list[Scored]] = Future()
        try:
            fut.set_result(run_calls(calls, prompts))
        except Exception as e:  # raised where the loop reads the scores, as a worker's is
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        pass


class Worker:
    """Rewards on a thread of their own, with ``threads`` torch threads there (torch's intra-op threads are set per
    thread: the decode thread keeps its own). A round's calls queue behind the ones handed over before them."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rodeco-rewards", initializer=self._init)

    def _init(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        log.info("the rewards score on a thread of their own, with %d torch thread(s)", self.threads)

    def submit(self, calls: Sequence[Call], prompts: Sequence[PromptRef]) -> Future[list[Scored]]:
        if not any(c.rows for c in calls):  # nothing to score: no round trip
            return Inline().submit(calls, prompts)
        return self.pool.submit(run_calls, list(calls), list(prompts))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
