"""Search: decisions that copy rows (``rodeco.Counts``), copies as new candidates, lineage, decision points by
tokens, the built-in search policies and the winner rules."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers import open_batch, run_tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from test_policies import round_views  # imported here: applying @given inside a running test fails hypothesis' check

import rodeco_policies
from rodeco import BuildContext, Counts, PluginError, PolicyInfo
from rodeco.common.sampling import COPY_BIT, SamplingParams, copy_stream, row_keys
from rodeco.common.state import Candidate, PromptView, RoundView
from rodeco.common.validation import ConfigError
from rodeco.common.winner import WinnerRule, boxed, normalize
from rodeco.core.contracts import select_checked

PROMPTS = ["write a haiku about autumn leaves", "give three tips", "explain why the sky is blue"]
SAMPLING = SamplingParams(1.0, 50, 1.0)


def _fresh_last_logits(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1]


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_a_copy_continues_as_a_fresh_forward_of_its_parents_tokens_with_its_own_stream(tiny_gen, tiny_model, engine):
    gen = tiny_gen(engine)
    ids = [gen.encode(p) for p in PROMPTS[:2]]
    sess = open_batch(gen, ids, 3, SAMPLING, 20, needs_logprobs=True, ignore_eos=True)
    sess.decode(until=6)
    parents = [1, 1, 4]  # two copies of row 1 (prompt 0), one of row 4 (prompt 1)
    streams = [
        copy_stream(int(sess.stream[1]), 6, 0),
        copy_stream(int(sess.stream[1]), 6, 1),
        copy_stream(int(sess.stream[4]), 6, 0),
    ]
    sess.fork(parents, [3, 4, 3], streams)
    assert sess.prompt_of.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]  # copies next to their parents
    assert sess.cand.tolist() == [0, 1, 3, 4, 2, 0, 1, 3, 2]
    sess.decode(until=12)
    for row in range(sess.rows):  # the copied cache is the parent's: every row's logits are a fresh forward's
        seq = ids[sess.prompt_of[row]] + sess.out[row, : sess.t - 1].tolist()
        torch.testing.assert_close(sess.logits[row], _fresh_last_logits(tiny_model, seq), atol=1e-4, rtol=1e-4)
    for row in (2, 3, 7):  # the same tokens as a solo session forced through the parent's tokens, with its stream
        p = int(sess.prompt_of[row])
        solo = open_batch(gen, [ids[p]], 1, SAMPLING, 20, stream_keys=(p,), needs_logprobs=True, ignore_eos=True)
        solo.stream[:] = sess.stream[row]
        solo.force(sess.out[row : row + 1, :6].cpu())
        solo.decode(until=12)
        assert solo.out[0, :12].tolist() == sess.out[row, :12].tolist()
        torch.testing.assert_close(solo.lp[0, :12], sess.lp[row, :12], atol=1e-4, rtol=1e-4)
    # siblings share the prefix and diverge after it (their streams differ)
    assert sess.out[1, :6].tolist() == sess.out[2, :6].tolist() == sess.out[3, :6].tolist()
    assert len({tuple(sess.out[r, 6:12].tolist()) for r in (1, 2, 3)}) == 3


def test_copy_streams_differ_between_siblings_and_from_every_starting_row():
    s = [copy_stream(5, 16, j) for j in range(64)] + [copy_stream(6, 16, 0), copy_stream(5, 32, 0)]
    assert len(set(s)) == len(s) and all(x & COPY_BIT for x in s) and all(0 < x < 1 << 63 for x in s)
    assert copy_stream(5, 16, 3) == copy_stream(5, 16, 3)  # a pure function of the lineage
    keys = row_keys(np.array([7, 7, 8, 8], dtype=np.uint64), np.array([3, s[0], 3, s[0]], dtype=np.int64))
    assert keys[0] == (7 << 24) | 3  # a starting row's key is what it was before copies existed
    assert len(set(keys.tolist())) == 4  # the same copy stream under two prompts: two keys


class Copier:
    """Doubles the best row of each prompt, rejects the worst (a fixed population), every 4 tokens."""

    info = PolicyInfo(decision_tokens=4)

    def select(self, view):
        out = []
        for pv in view.prompts:
            c = np.ones(pv.k, dtype=int)
            if pv.k > 1:
                c[int(np.argmax(pv.scores))] += 1
                c[int(np.argmin(pv.scores))] -= 1
            out.append(Counts(c))
        return out


def _run_with(gen, policy, n=4, overrides=(), prompts=PROMPTS[:2], seed=0):
    from rodeco import hookimpl
    from rodeco.plugins import get_plugin_manager

    class Plugin:
        @hookimpl
        def rodeco_register_policies(self, register):
            register("mine", lambda params, ctx: policy)

    return run_tiny(
        gen,
        prompts,
        n=n,
        policy="fixed",
        plugins=get_plugin_manager(extra=[Plugin()]),
        seed=seed,
        overrides=["policy.name=mine", "sampling.max_new_tokens=24", *overrides],
    )


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_copies_are_new_candidates_with_their_lineage_in_the_results(tiny_gen, engine):
    out = _run_with(tiny_gen(engine), Copier(), overrides=["budget=unlimited", "sampling.ignore_eos=true"])
    for r in out.results:
        ids = [c.candidate_id for c in r.candidates]
        assert len(ids) == len(set(ids))  # every copy is a candidate of its own
        assert [x.tokens_generated for x in r.rounds] == [4, 8, 12, 16, 20]  # decision points by tokens
        copies = [c for c in r.candidates if c.parent is not None]
        assert copies and all(c.candidate_id >= 4 for c in copies)
        by_id = {c.candidate_id: c for c in r.candidates}
        for c in copies:  # a copy holds its parent's tokens up to the fork
            t = r.rounds[c.forked_round].tokens_generated
            assert c.candidate_id in r.rounds[c.forked_round].copies[c.parent]
            assert c.token_ids[:t] == by_id[c.parent].token_ids[:t]
        assert all(x.rows_kept == 4 for x in r.rounds)
        d = r.to_dict()
        assert any("parent" in c for c in d["candidates"]) and any("copies" in x for x in d["rounds"])
    # charged in full: every row's every token is decoded and counted
    tokens = sum(len(c.token_ids) for r in out.results for c in r.candidates)
    starts = sum(4 for _ in out.results)  # the first token of each starting row is sampled from the prefill
    copied = sum(
        r.rounds[c.forked_round].tokens_generated for r in out.results for c in r.candidates if c.parent is not None
    )
    assert out.compute.gen_decode_tokens == tokens - copied - starts


def test_counts_of_0_and_1_are_todays_keep_lists(tiny_gen):
    """Today's policies, answered as counts of 0 and 1, give today's results to the last token."""

    class AsCounts:
        def __init__(self, inner):
            self.inner = inner

        def select(self, view):
            return [Counts.keep(k, pv.k) for k, pv in zip(self.inner.select(view), view.prompts)]

    from rodeco_policies.basic import FixedPolicy

    ov = ["budget.kv_tokens=900", "sampling.max_new_tokens=40"]
    a = run_tiny(tiny_gen("fast"), PROMPTS, n=8, overrides=[*ov, "policy.alpha=0.5"], seed=3)
    b = _run_with(
        tiny_gen("fast"),
        AsCounts(FixedPolicy(0.5)),
        n=8,
        overrides=[*ov, "sampling.max_new_tokens=40"],
        prompts=PROMPTS,
        seed=3,
    )
    assert any(r.rounds for r in a.results)
    assert [r.to_dict()["candidates"] for r in a.results] == [r.to_dict()["candidates"] for r in b.results]
    assert [r.to_dict()["rounds"] for r in a.results] == [r.to_dict()["rounds"] for r in b.results]


def test_copies_stay_within_the_budget(tiny_gen):
    """A policy that fills the budget's room with copies: the peak cache never passes budget.kv_tokens."""

    class Filler:
        info = PolicyInfo(decision_tokens=4)

        def select(self, view):
            out = []
            for pv in view.prompts:
                c = np.zeros(pv.k, dtype=int)
                c[int(np.argmax(pv.scores))] = min(pv.max_rows, 3 * pv.k)
                out.append(Counts(c))
            return out

    out = _run_with(
        tiny_gen("fast"),
        Filler(),
        n=2,
        overrides=["budget.kv_tokens=700", "sampling.max_new_tokens=40", "sampling.ignore_eos=true"],
    )
    assert max(x.rows_kept for r in out.results for x in r.rounds) > 2  # the batch grew
    assert 0 < out.compute.peak_kv_tokens <= 700


def _view(k=4, max_rows=8, finished=()):
    pv = PromptView(
        prompt_index=0,
        candidate_ids=list(range(k)),
        scores=np.arange(k, dtype=float),
        history=np.zeros((k, 0)),
        finished_scores=list(finished),
        tokens_generated=4,
        min_reject=0,
        parents=[None] * k,
        origins=list(range(k)),
        finished_ids=list(range(10, 10 + len(finished))),
        max_rows=max_rows,
        rng=np.random.default_rng(0),
    )
    return RoundView(round=0, prompts=[pv], max_rows_next=max_rows, max_new_tokens=16, n_start=k)


class Fixed:
    def __init__(self, answer):
        self.answer = answer

    def select(self, view):
        return self.answer


@pytest.mark.parametrize(
    "answer, match",
    [
        ([Counts([1, -1, 1, 1])], "negative counts"),
        ([Counts([1, 1])], "2 counts for prompt 0, which has 4 rows"),
        ([Counts([3, 3, 3, 0])], "kept 9 rows .copies included. but the budget allows 8"),
        ([Counts([0, 0, 0, 0])], "kept no row of prompt 0, which has no finished candidate"),
        ([[0, 0, 1]], "duplicate or out-of-range rows"),
        ([[0], [1]], "2 answers for 1 prompts"),
    ],
)
def test_each_bad_answer_is_a_plugin_error_naming_the_policy(answer, match):
    with pytest.raises(PluginError, match=match) as e:
        select_checked(Fixed(answer), "mine", _view())
    assert "'mine'" in str(e.value)


def test_a_prompt_with_a_finished_candidate_may_end_at_a_decision():
    assert select_checked(Fixed([Counts([0, 0, 0, 0])]), "mine", _view(finished=[1.0])) == [Counts([0, 0, 0, 0])]
    assert select_checked(Fixed([[0, 1]]), "mine", _view()) == [Counts([1, 1, 0, 0])]  # a keep list, not counts


@pytest.mark.parametrize("how", ["multinomial", "systematic"])
def test_resampling_follows_the_softmax_weights(how):
    """Counts summed over many seeded draws against softmax(score / T): a chi-square test that passes on the
    policy and fails on a planted bias (the weights of a wrong temperature)."""
    from rodeco_policies.search import resample, softmax_weights

    scores = np.array([0.0, 0.5, 1.0, 2.0, -1.0])
    w = softmax_weights(scores, 0.7)
    rng = np.random.default_rng(11)
    draws = sum(resample(w, 16, rng, how) for _ in range(400))
    assert draws.sum() == 16 * 400
    assert stats.chisquare(draws, w * draws.sum()).pvalue > 0.01
    biased = softmax_weights(scores, 1.0)
    assert stats.chisquare(draws, biased * draws.sum()).pvalue < 1e-6


def test_particle_filter_spends_draws_on_finished_particles_and_keeps_its_population(builtins_pm):
    pf = builtins_pm.build_policy("particle_filter", {"temperature": 1.0})
    view = _view(k=4, max_rows=8)
    (c,) = pf.select(view)
    assert c.total == 4  # the population: n rows
    view = _view(k=4, max_rows=8, finished=[50.0])  # a finished particle that outweighs every active one
    (c,) = pf.select(view)
    assert c.total == 0  # every draw lands on it: the prompt ends
    assert select_checked(pf, "particle_filter", view) == [Counts([0, 0, 0, 0])]


def test_beam_and_dvts_expand_the_best_rows(builtins_pm):
    beam = builtins_pm.build_policy("beam", {"beam_width": 2})
    view = _view(k=8, max_rows=16)
    assert list(beam.select(view)[0]) == [0, 0, 0, 0, 0, 0, 4, 4]  # the best two, each into 8 / 2 rows
    assert list(beam.select(_view(k=8, max_rows=5))[0]) == [0, 0, 0, 0, 0, 0, 2, 3]  # the budget's share binds
    dvts = builtins_pm.build_policy("dvts", {"beam_width": 4})
    view = _view(k=8, max_rows=16)
    view.prompts[0].scores = np.array([3.0, 1, 0, 0, 0, 0, 9, 0])
    assert list(dvts.select(view)[0]) == [4, 0, 0, 0, 0, 0, 4, 0]  # subtrees {0..3} and {4..7}: each its best


@pytest.fixture()
def builtins_pm():
    from rodeco.plugins import get_plugin_manager

    pm = get_plugin_manager()

    class B:
        def build_policy(self, name, params):
            return pm.build_policy({"name": name, **params}, BuildContext())

    return B()


def _cand(i, text, score):
    return Candidate(candidate_id=i, token_ids=[], text=text, score=score, finished=True)


def test_winner_rules_choose_by_reward_majority_or_weighted_vote():
    cands = [
        _cand(0, "so \\boxed{12}", 0.1),
        _cand(1, "\\boxed{12.0}", 0.2),
        _cand(2, "it is \\boxed{7}", 3.0),
        _cand(3, "no answer", 9.0),
    ]
    assert WinnerRule().choose(cands).best.candidate_id == 3
    maj = WinnerRule(rule="majority").choose(cands)
    assert (maj.best.candidate_id, maj.rule, maj.answer) == (1, "majority", "12")
    assert WinnerRule(rule="weighted", temperature=1.0).choose(cands).answer == "7"  # e^3 > e^.1 + e^.2
    assert WinnerRule(rule="weighted", temperature=100.0).choose(cands).answer == "12"  # near the plain majority
    rx = WinnerRule(rule="majority", extractor="regex", pattern=r"answer")
    assert rx.choose(cands).rule == "majority"
    assert WinnerRule(rule="majority").choose([_cand(0, "none", 1.0)]).rule == "reward"  # nothing to vote on
    assert boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}" and normalize(" 1,000.0 ") == "1000"
    with pytest.raises(ConfigError, match="winner.extractor"):
        WinnerRule(rule="majority", extractor="nope")
    with pytest.raises(ConfigError, match="winner.rule"):
        WinnerRule(rule="best")


def test_the_result_records_the_rule_that_chose_its_winner(tiny_gen):
    ov = ["budget=unlimited", "winner.rule=weighted", "winner.extractor=regex", "winner.pattern='[a-z]+'"]
    out = run_tiny(tiny_gen("fast"), PROMPTS[:1], n=4, policy="none", overrides=ov)
    (r,) = out.results
    d = r.to_dict()
    assert d["winner"] == "weighted" and d["answer"] == r.answer and r.answer
    assert r.best in [c for c in r.candidates if c.finished]
    plain = run_tiny(tiny_gen("fast"), PROMPTS[:1], n=4, policy="none", overrides=["budget=unlimited"])
    assert "winner" not in plain.results[0].to_dict()  # the default is left out of the record


SEARCH = ("particle_filter", "beam", "dvts")


@pytest.mark.parametrize("name", SEARCH)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_search_policies_keep_the_contract(name, data):
    """On random views (rows, scores, finished candidates, the budget's room): a valid answer within each prompt's
    share, reproducible from the view's seeded generators, the view left as it was."""
    from rodeco.plugins import get_plugin_manager

    pm = get_plugin_manager(load_entrypoints=False, extra=[rodeco_policies])
    view = data.draw(round_views())
    view.n_start = data.draw(st.integers(1, 16))
    extra = data.draw(st.integers(0, 24))
    view.max_rows_next = max(len(view.prompts), sum(p.k for p in view.prompts) - view.min_reject_total + extra)
    share = view.max_rows_next // len(view.prompts)
    for j, pv in enumerate(view.prompts):
        pv.max_rows = share + (j < view.max_rows_next % len(view.prompts))
        pv.origins = [data.draw(st.integers(0, view.n_start - 1)) for _ in range(pv.k)]
        pv.parents = [None] * pv.k
    params = {"beam_width": data.draw(st.integers(1, 8))} if name != "particle_filter" else {}
    policy = pm.build_policy({"name": name, **params}, BuildContext(plugins=pm))

    def seeded():
        v = copy.deepcopy(view)
        for j, pv in enumerate(v.prompts):
            pv.rng = np.random.default_rng(j)
        return v

    v = seeded()
    counts = select_checked(policy, name, v)
    assert all(c.total <= pv.max_rows for c, pv in zip(counts, v.prompts))
    assert select_checked(policy, name, seeded()) == counts  # reproducible
    for a, b in zip(v.prompts, view.prompts):
        np.testing.assert_array_equal(a.scores, b.scores)
        assert a.candidate_ids == b.candidate_ids and a.origins == b.origins
