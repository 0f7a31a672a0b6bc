"""Votes that stop when decided (``winner.stop``), the confidence-weighted vote (``winner.weight=confidence``) and
the ``deepconf`` policy: the stopping tests' arithmetic, their config errors, and on a tiny random Llama that a
``certain`` stop gives the full vote's answers for fewer tokens, and that deepconf decides every
``decision_tokens`` tokens without a budget, stops only rows below its threshold and votes by confidence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import run_tiny

from rodeco import Candidate, ConfigError, PromptView, RoundView, WinnerRule, lowest_group_confidence
from rodeco.common.winner import beta_lead

PROMPTS = ["write a haiku about autumn leaves", "give three tips", "explain why the sky is blue", "name a color"]
# a vote over the last "a" or "u" of each response, a response ending at its first "e": rows end at many lengths
VOTE = [
    "winner.rule=majority",
    "winner.extractor=regex",
    "winner.pattern='([au])'",
    "budget=unlimited",
    "sampling.max_new_tokens=40",
    "sampling.stop=['e']",
]


def test_the_beta_test_is_adaptive_consistencys():
    assert beta_lead(0, 0) == 0.5
    assert beta_lead(3, 0) == pytest.approx(1 - 0.5**4)  # Beta(4, 1): P(p > 1/2) = 1 - 1/2^4
    assert beta_lead(2, 1) == pytest.approx(11 / 16)  # Beta(3, 2): 1 - I_1/2(3, 2) = 11/16
    assert beta_lead(5, 2) > beta_lead(4, 2) > beta_lead(4, 3)
    rule = WinnerRule(rule="majority", extractor="first_line", stop="beta", stop_threshold=0.95)
    assert rule.settled(["7", "7", "7", "7"], remaining=100)  # 1 - 1/32 >= 0.95
    assert not rule.settled(["7", "7", "7"], remaining=0)  # 1 - 1/16 < 0.95
    assert not rule.settled([None, None], remaining=3)  # no answer, no vote


def test_a_certain_stop_waits_until_no_row_can_change_the_answer():
    rule = WinnerRule(rule="majority", extractor="first_line", stop="certain")
    assert rule.settled(["a", "a", "b"], remaining=0)
    assert not rule.settled(["a", "a", "b"], remaining=1)  # one more "b" ties it
    assert rule.settled(["a", "a", "a", "b", None], remaining=1)
    assert not WinnerRule(rule="majority", extractor="first_line").settled(["a"] * 9, remaining=0)  # stop is off


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"stop": "beta"}, "winner.stop"),  # rule=reward does not vote
        ({"rule": "weighted", "extractor": "first_line", "stop": "certain"}, "winner.stop"),
        ({"rule": "majority", "extractor": "first_line", "stop": "soon"}, "winner.stop"),
        ({"rule": "majority", "extractor": "first_line", "stop": "beta", "stop_threshold": 1.5}, "stop_threshold"),
        ({"rule": "majority", "extractor": "first_line", "stop": "beta", "stop_tokens": 0}, "winner.stop_tokens"),
        ({"rule": "weighted", "extractor": "first_line", "weight": "length"}, "winner.weight"),
    ],
)
def test_bad_vote_settings_name_their_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        WinnerRule(**kw)


def test_the_confidence_weighted_vote_sums_confidences():
    def cand(i: int, text: str, conf: float) -> Candidate:
        return Candidate(i, [], text, score=0.0, finished=True, confidence=conf)

    rule = WinnerRule(rule="weighted", extractor="first_line", weight="confidence")
    three_low = [cand(0, "a", 1.0), cand(1, "a", 1.0), cand(2, "a", 1.0), cand(3, "b", 3.5)]
    assert rule.choose(three_low).answer == "b"  # 3.5 > 3.0, where the plain majority says "a"
    assert WinnerRule(rule="majority", extractor="first_line").choose(three_low).answer == "a"
    top = [[-0.1, -3.0], [-2.0, -2.0], [-0.5, -1.5]]
    assert rule.top_logprobs == 5 and rule.confidence(top) == lowest_group_confidence(top, 5, 16)
    assert WinnerRule(rule="majority", extractor="first_line").top_logprobs == 0


def test_a_certain_stop_gives_the_full_votes_answers_for_fewer_tokens(tiny_gen):
    gen = tiny_gen("fast")
    full = run_tiny(gen, PROMPTS, n=12, policy="none", overrides=VOTE, seed=3)
    stop = [*VOTE, "winner.stop=certain", "winner.stop_tokens=2"]
    early = run_tiny(gen, PROMPTS, n=12, policy="none", overrides=stop, seed=3)
    stopped = [(a, b) for a, b in zip(full.results, early.results) if b.stopped_at is not None]
    assert stopped, "no prompt's vote settled: the test decodes nothing it could save"
    for a, b in zip(full.results, early.results):
        assert a.answer == b.answer  # no row left could have changed the majority
        done = {c.candidate_id: c.token_ids for c in b.candidates if c.finished}
        assert all(done[c.candidate_id] == c.token_ids for c in a.candidates if c.candidate_id in done)
    for a, b in stopped:
        assert b.stopped_at % 2 == 0 and "stopped_at" in b.to_dict()
        whole = {c.candidate_id: c for c in a.candidates}
        settled = [c for c in b.candidates if c.stop_reason == "settled"]
        assert settled and all(not c.finished and len(c.token_ids) <= b.stopped_at for c in settled)
        assert all(len(whole[c.candidate_id].token_ids) > len(c.token_ids) for c in settled)  # cut short
        assert b.compute.gen_decode_tokens < a.compute.gen_decode_tokens
    assert all("stopped_at" not in r.to_dict() for r in full.results)


def test_a_beta_stop_settles_on_the_leading_answer(tiny_gen):
    stop = [*VOTE, "winner.stop=beta", "winner.stop_threshold=0.6", "winner.stop_tokens=4"]
    out = run_tiny(tiny_gen("fast"), PROMPTS, n=12, policy="none", overrides=stop, seed=3)
    stopped = [r for r in out.results if r.stopped_at is not None]
    assert stopped
    for r in stopped:
        assert r.stopped_at % 4 == 0
        votes = [c for c in r.candidates if c.finished]
        assert r.answer is not None and any(r.answer in c.text for c in votes)


def view(confs_so_far: list[list[float]], rnd: int, min_reject: int = 0, finished: int = 0) -> RoundView:
    """A round view of one prompt whose rows' top-1 log-probs are ``-confs_so_far[row]`` (their token confidences
    with top_k=1)."""
    tops = [np.array(c, dtype=float)[:, None] * -1 for c in confs_so_far]
    pv = PromptView(
        prompt_index=0,
        candidate_ids=list(range(len(tops))),
        scores=np.zeros(len(tops)),
        history=np.zeros((len(tops), 0)),
        finished_scores=[0.0] * finished,
        tokens_generated=len(confs_so_far[0]),
        min_reject=min_reject,
        top_logprobs=tops,
    )
    return RoundView(round=rnd, prompts=[pv], max_rows_next=len(tops) - min_reject, max_new_tokens=64)


def test_deepconf_sets_its_threshold_at_the_first_decision_and_stops_rows_below_it_after():
    from rodeco_policies.deepconf import DeepConfPolicy

    policy = DeepConfPolicy(decision_tokens=4, percentile=50, top_k=1, window=2)
    first = [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]  # lowest group confidences 1, 2, 3, 4
    assert policy.select(view(first, 0)) == [[0, 1, 2, 3]]  # the warm-up keeps every row
    assert policy.select(view(first, 0)) == [[0, 1, 2, 3]] and policy.threshold[0] == (2.5, 0)  # asked again: same
    later = [[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 9.0, 9.0], [3.0, 3.0, 3.0, 3.0], [4.0, 4.0, 0.5, 0.5]]
    assert policy.select(view(later, 1)) == [[2]]  # lowest groups: 1, 2, 3, 0.5 against 2.5
    assert policy.select(view(later, 1)) == [[2]]
    assert policy.select(view(later, 1, min_reject=3)) == [[2]]
    all_low = [[0.1] * 4] * 3
    assert policy.select(view(all_low, 1)) == [[0]]  # no finished trace yet: the likeliest goes on
    assert policy.select(view(all_low, 1, finished=2)) == [[]]  # with some, every low row stops
    assert policy.select(view(first, 0, min_reject=1)) == [[1, 2, 3]]  # the budget takes the least sure


def test_deepconf_decides_without_a_budget_and_votes_by_confidence(tiny_gen):
    out = run_tiny(
        tiny_gen("fast"),
        PROMPTS[:2],
        n=8,
        policy="deepconf",
        overrides=[
            "budget=unlimited",
            "sampling.max_new_tokens=40",
            "policy.decision_tokens=8",
            "policy.percentile=50",
            "winner.extractor=regex",
            "winner.pattern='([aeiou])'",
        ],
        seed=2,
    )
    stopped = 0
    for r in out.results:
        assert r.rounds and all(rd.tokens_generated % 8 == 0 for rd in r.rounds)
        assert r.winner in ("weighted", "reward")  # the vote (reward where no candidate has an answer)
        fin = [c for c in r.candidates if c.finished]
        assert fin and all(c.confidence is not None and math.isfinite(c.confidence) for c in fin)
        assert r.rounds[0].rows_kept == r.rounds[0].rows_before  # the warm-up stops no row
        stopped += sum(len(rd.rejected_ids) for rd in r.rounds[1:])
    assert stopped > 0
