"""An open source of prompts (``rodeco.core.loop.decode_open``): prompts join the running batch as they arrive, each
on its own clock with its own budget, settings and policy, and a seeded prompt gets the answer it gets alone
(``decode_batch`` of that prompt), under Best-of-N, Speculative Rejection and a search policy."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rodeco.common.budget import Budget, full_length_tokens
from rodeco.common.state import PromptRef, PromptResult, SamplingParams
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer
from rodeco.core.loop import Cancelled, LoopSettings, Request, decode_batch, decode_open
from rodeco.core.scoring import Worker
from rodeco.plugins import BuildContext, default_plugins

TEXTS = ["write a haiku about autumn leaves", "give three tips", "the quick brown fox jumps", "why is the sky blue"]


class Arrivals:
    """A source whose requests arrive at given calls of ``take`` (each call is an admission point of the loop)."""

    def __init__(self, at: dict[int, list[Request]]) -> None:
        self.at, self.calls = at, 0

    def take(self, wait: bool) -> list[Request] | None:
        for _ in range(1000):  # bounded: a waiting call skips ahead to the next arrival
            got = self.at.pop(self.calls, [])
            self.calls += 1
            if got or not wait or not self.at:
                return got if got or self.at else None
        raise AssertionError("no arrival")


def reward(gen):
    return Scorer(
        default_plugins().build_reward({"name": "logprob", "form": "mean"}, BuildContext(generator=gen)), "logprob"
    )


def policy(name: str, **kw):
    return default_plugins().build_policy({"name": name, **kw}, BuildContext())


def settings(gen, text: str, name: str, n: int, max_new: int, sampling: SamplingParams) -> LoopSettings:
    """Its own budget: so small that 16 rows meet decision points (the prompt and 4 rows of 10 tokens where the
    prompt is stored once, 16 rows of the prompt and 3 tokens where each row holds it)."""
    P = len(gen.encode(text))
    kv = 16 * (P + 3)
    if gen.kv.shares_prefix:  # and in blocks (paged), at least one block a row for the first round
        kv = max(full_length_tokens(4, [P], 10, gen.kv), full_length_tokens(16, [P], 2, gen.kv))
    return LoopSettings(
        n=n, sampling=sampling, max_new_tokens=max_new, budget=Budget(kv, 2), seed=0, all_candidates=True,
        policy_name=name,
    )  # fmt: skip


CASES = [  # (text, policy, its parameters, n, max_new_tokens, sampling)
    (TEXTS[0], "fixed", {"alpha": 0.5}, 16, 24, SamplingParams()),
    (TEXTS[1], "none", {}, 3, 12, SamplingParams(temperature=0.7, top_k=20)),
    (TEXTS[2], "beam", {"decision_tokens": 6}, 8, 20, SamplingParams(top_k=0, top_p=0.9)),
    (TEXTS[3], "fixed", {"alpha": 0.3}, 12, 16, SamplingParams()),
]


def summary(r: PromptResult):
    cands = sorted((c.candidate_id, c.token_ids, c.stop_reason) for c in r.candidates or [])
    return r.best.token_ids, cands, [(x.tokens_generated, x.kept_ids) for x in r.rounds]


def solo(gen, i: int) -> PromptResult:
    text, name, kw, n, max_new, sp = CASES[i]
    s = settings(gen, text, name, n, max_new, sp)
    (res,), _ = decode_batch(gen, reward(gen), policy(name, **kw), [PromptRef(i, text, seed=100 + i)], s)
    return res


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_each_prompt_gets_its_solo_answer_whenever_it_arrives(tiny_gen, engine):
    gen = tiny_gen(engine)
    done: dict[int, PromptResult] = {}

    def request(i: int) -> Request:
        text, name, kw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        return Request(
            [PromptRef(i, text, seed=100 + i)], s, policy(name, **kw), lambda r: done.__setitem__(r.prompt_index, r)
        )

    source = Arrivals({0: [request(0)], 2: [request(1), request(2)], 5: [request(3)]})
    stats = decode_open(gen, reward(gen), source, kv_tokens=None, check_tokens=3)
    assert sorted(done) == [0, 1, 2, 3] and stats.admitted == 4
    assert max(stats.step_prompts) >= 3  # prompts did share steps
    for i in range(4):
        assert summary(done[i]) == summary(solo(gen, i)), CASES[i][1]
    assert any(done[0].rounds) and any(done[2].rounds)  # decision points were met
    for r in done.values():
        assert r.compute.gen_decode_tokens > 0 and r.compute.gen_flops > 0


def test_admission_waits_in_arrival_order_for_room(tiny_gen):
    """With room for one prompt's budget at a time, the second waits for the first to finish, and a third that
    would fit behind it does not pass it."""
    gen = tiny_gen("fast")
    order: list[int] = []

    def request(i: int) -> Request:
        text, name, kw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        ref = PromptRef(i, text, seed=100 + i)
        return Request([ref], s, policy(name, **kw), lambda r: order.append(r.prompt_index))

    reqs = [request(0), request(1), request(3)]
    room = max(int(r.settings.budget.kv_tokens) for r in reqs)
    stats = decode_open(gen, reward(gen), Arrivals({0: reqs}), kv_tokens=room, check_tokens=4)
    assert order == [0, 1, 3] and max(stats.step_prompts) == 1 and stats.peak_reserved <= room


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_each_prompt_holds_no_more_than_its_reservation(tiny_gen, monkeypatch, engine):
    """At every step of an open batch, each prompt's rows hold at most its own budget (its prompt, stored once on
    ``fast`` and in every row on ``hf``, and its rows' tokens on its own clock), and the running prompts together at
    most the open batch's ``kv_tokens``. These are the tokens the budget counts; what the engine allocates besides
    (each prompt's cache padded to the longest prompt, every row the longest row's columns) is not in them."""
    gen = tiny_gen(engine)
    held: list[dict[int, int]] = []  # per step: each request's tokens held
    admitted: list[int] = []  # the requests in the order they joined: batch key k is request admitted[k]
    budgets = {i: int(settings(gen, c[0], c[1], c[3], c[4], c[5]).budget.kv_tokens) for i, c in enumerate(CASES)}
    opened = gen.open_session

    def opening(spec):
        sess = opened(spec)
        step = sess._step

        def counted(pending):
            step(pending)
            rows, lengths = np.bincount(sess.prompt_of), sess.stats.prefill_tokens
            keys = np.unique(sess.prompt_of).tolist()
            held.append({admitted[k]: _held(sess, k, int(lengths[k]), int(rows[k])) for k in keys})

        sess._step = counted
        return sess

    monkeypatch.setattr(gen, "open_session", opening)
    done: dict[int, PromptResult] = {}

    def request(i: int) -> Request:
        text, name, kw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        return Request(
            [PromptRef(i, text, seed=100 + i)],
            s,
            policy(name, **kw),
            lambda r: done.__setitem__(i, r),
            on_admit=lambda: admitted.append(i),
        )

    room = budgets[0] + budgets[2]  # two of the four at a time
    source = Arrivals({0: [request(0)], 3: [request(2), request(1), request(3)]})
    decode_open(gen, reward(gen), source, room, check_tokens=3)
    assert sorted(done) == [0, 1, 2, 3] and held
    assert max(len(h) for h in held) == 2  # two prompts did share steps
    for h in held:
        assert all(tokens <= budgets[i] for i, tokens in h.items()), (h, budgets)
        assert sum(h.values()) <= room
    assert any(h[i] > budgets[i] * 0.75 for h in held for i in h)  # and came near their budgets


def _held(sess, key: int, prompt: int, rows: int) -> int:
    """The tokens prompt ``key``'s rows hold after a step: the blocks they name on ``fast`` (a shared one once), their
    padded rows on ``hf`` (each row its prompt and its own tokens)."""
    blocks = getattr(sess.engine, "blocks", None)
    if blocks is None:
        return rows * (prompt + sess.clock(key))
    return blocks.named(np.flatnonzero(sess.prompt_of == key)) * blocks.size


def test_a_request_larger_than_the_whole_budget_is_refused_by_name(tiny_gen):
    gen = tiny_gen("fast")
    errors: list[Exception] = []
    text, name, kw, n, max_new, sp = CASES[1]
    s = settings(gen, text, name, n, max_new, sp)
    req = Request([PromptRef(1, text)], s, policy(name, **kw), lambda r: None, on_error=errors.append)
    decode_open(gen, reward(gen), Arrivals({0: [req]}), kv_tokens=10)
    assert len(errors) == 1 and isinstance(errors[0], ConfigError) and "budget.kv_tokens" in str(errors[0])


class Counting:
    """A reward that scores by length and keeps a tally, as the model rewards do: a token and 10 FLOPs a token."""

    def __init__(self) -> None:
        from rodeco.common.protocols import RewardCost

        self.cost = RewardCost()

    def score(self, requests):
        n = sum(len(r.response_ids) for r in requests)
        self.cost.tokens += n
        self.cost.flops += 10.0 * n
        self.cost.calls += 1
        return [float(len(r.response_ids) % 7) for r in requests]


def test_a_prompt_is_charged_its_own_compute_not_a_share_of_what_ran_before(tiny_gen):
    """Two prompts one after the other through one open decode: the second is charged what it costs alone (its
    decode, its reward's tokens, FLOPs and calls), not a share of the decode's totals."""
    gen = tiny_gen("fast")
    done: dict[int, PromptResult] = {}

    def request(i: int) -> Request:
        text, name, kw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        return Request([PromptRef(i, text, seed=100 + i)], s, policy(name, **kw), lambda r: done.__setitem__(i, r))

    scorer = Scorer(Counting(), "counting")
    decode_open(gen, scorer, Arrivals({0: [request(0)], 900: [request(3)]}), kv_tokens=None)
    text, name, kw, n, max_new, sp = CASES[3]
    (alone,), _ = decode_batch(
        gen, Scorer(Counting(), "counting"), policy(name, **kw), [PromptRef(3, text, seed=103)],
        settings(gen, text, name, n, max_new, sp),
    )  # fmt: skip
    a, b = done[3].compute, alone.compute
    assert done[3].best.token_ids == alone.best.token_ids
    assert (a.gen_decode_tokens, a.gen_flops, a.reward_tokens, a.reward_flops, a.reward_calls) == (
        b.gen_decode_tokens, b.gen_flops, b.reward_tokens, b.reward_flops, b.reward_calls,
    )  # fmt: skip
    assert a.partial_reward_flops == b.partial_reward_flops > 0


@pytest.mark.parametrize("name,kw", [("fixed", {"alpha": 0.5}), ("allocate", {})])
def test_a_cohort_joining_a_running_batch_gets_its_closed_batch_answer(tiny_gen, name, kw):
    """A closed batch is a cohort of the open loop: two prompts admitted together, while another request decodes,
    share one clock, one budget and each policy call (``allocate`` weighs one against the other), and get what
    ``decode_batch`` of those two alone gives them, rounds and compute counts included."""
    gen = tiny_gen("fast")
    text, _, _, n, max_new, sp = CASES[0]
    s = settings(gen, text, name, n, max_new, sp)
    s = LoopSettings(**{**s.__dict__, "budget": Budget(2 * int(s.budget.kv_tokens), 2)})
    refs = [PromptRef(10, TEXTS[0], seed=7), PromptRef(11, TEXTS[3], seed=8)]
    alone, _ = decode_batch(gen, reward(gen), policy(name, **kw), refs, s)
    views: list[int] = []
    done: dict[int, PromptResult] = {}
    cohort = Request(refs, s, policy(name, **kw), lambda r: done.__setitem__(r.prompt_index, r))
    cohort.on_round = lambda view, counts: views.append(len(view.prompts))
    other = Request([PromptRef(3, TEXTS[2], seed=103)], *_other(gen), lambda r: done.__setitem__(3, r))
    stats = decode_open(gen, reward(gen), Arrivals({0: [other], 2: [cohort]}), kv_tokens=None, check_tokens=3)
    assert stats.admitted == 2 and max(stats.step_prompts) == 3  # the cohort decoded beside the other request
    assert views and max(views) == 2  # its policy saw both prompts at once
    for r in alone:
        assert summary(done[r.prompt_index]) == summary(r)
        assert done[r.prompt_index].compute.gen_decode_tokens == r.compute.gen_decode_tokens


def _other(gen):
    text, name, kw, n, max_new, sp = CASES[2]
    return settings(gen, text, name, n, max_new, sp), policy(name, **kw)


class Slow:
    """``logprob`` (mean), slow and uneven: each call sleeps a while, so the rounds' scores come back while other
    prompts decode, at times that vary from run to run. It records when it scored which prompts."""

    needs_logprobs = True

    def __init__(self, gen, seconds: float) -> None:
        self.inner = reward(gen).reward
        self.seconds, self.rng = seconds, np.random.default_rng()
        self.calls: list[tuple[float, float, set[int]]] = []
        self.started: set[int] = set()  # the prompts whose scoring has started

    def score(self, requests):
        t0 = time.perf_counter()
        self.started |= {r.prompt_index for r in requests}
        time.sleep(self.seconds * self.rng.uniform(0.5, 1.5))
        out = self.inner.score(requests)
        self.calls.append((t0, time.perf_counter(), {r.prompt_index for r in requests}))
        return out


@pytest.mark.parametrize(("engine", "seconds"), [("fast", 0.0), ("fast", 0.03), ("hf", 0.03)])
def test_with_the_rewards_on_a_worker_each_prompt_still_gets_its_solo_answer(tiny_gen, engine, seconds):
    """The rewards on a thread of their own: a prompt waiting for its scores holds its rows (set aside, its clock
    stopped) while the others decode, and gets the answer it gets alone, on the decode thread, whenever its scores
    come back. On ``hf``, whose rows cannot be set aside, the decode waits for the scores."""
    gen = tiny_gen(engine)
    done: dict[int, PromptResult] = {}
    steps: list[float] = []

    def request(i: int) -> Request:
        text, name, kw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        return Request([PromptRef(i, text, seed=100 + i)], s, policy(name, **kw), lambda r: done.__setitem__(i, r))

    slow, worker = Slow(gen, seconds), Worker(threads=1)
    try:
        source = Arrivals({0: [request(0)], 2: [request(1), request(2)], 5: [request(3)]})
        decode_open(gen, Scorer(slow, "slow"), source, kv_tokens=None, check_tokens=3, scoring=worker,
                    on_steps=lambda rows, ctx, secs: steps.append(time.perf_counter()))  # fmt: skip
    finally:
        worker.close()
    assert sorted(done) == [0, 1, 2, 3]
    for i in range(4):
        assert summary(done[i]) == summary(solo(gen, i)), CASES[i][1]
    assert sum(c.compute.partial_reward_calls for c in done.values()) > 0
    if seconds:  # on fast the others decoded while a round was scored; on hf nothing did
        assert any(t0 < t < t1 for t0, t1, _ in slow.calls for t in steps) == (engine == "fast")


def test_a_prompt_cancelled_while_its_rows_wait_for_scores_leaves(tiny_gen):
    gen = tiny_gen("fast")
    done: dict[int, PromptResult] = {}
    errors: list[Exception] = []
    slow, worker = Slow(gen, 0.05), Worker(threads=1)

    def request(i: int, **kw) -> Request:
        text, name, pkw, n, max_new, sp = CASES[i]
        s = settings(gen, text, name, n, max_new, sp)
        ref = PromptRef(i, text, seed=100 + i)
        return Request([ref], s, policy(name, **pkw), lambda r: done.__setitem__(i, r), **kw)

    def gone() -> bool:  # once its scoring has started: its rows are set aside then
        return 0 in slow.started

    first = request(0, on_error=errors.append, cancelled=gone)
    try:
        decode_open(gen, Scorer(slow, "slow"), Arrivals({0: [first, request(3)]}), kv_tokens=None, check_tokens=2,
                    scoring=worker)  # fmt: skip
    finally:
        worker.close()
    assert sorted(done) == [3] and len(errors) == 1 and isinstance(errors[0], Cancelled)
    assert summary(done[3]) == summary(solo(gen, 3))
