"""The ``confidence`` reward (the generator's own token confidence) and the top-k log-probs it reads: its forms
against hand-computed values, its parameters, the engines' top-k (what each request carries, and that recording it
changes no sampled token), and pools that record top-k log-probs and replay to the live run's scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import open_dict

import rodeco
from rodeco import hookimpl
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError, PluginError
from rodeco.core.contracts import Scorer, reward_info
from rodeco.core.data import Prompt
from rodeco.experiments.record import pool_reward, record
from rodeco.plugins import BuildContext, default_plugins, get_plugin_manager
from rodeco.replays.pool import Pool
from rodeco.replays.replay import open_pool, replay_prompt
from rodeco.runner import loop_settings, run_decode
from rodeco_rewards.confidence import ConfidenceReward, build_confidence

# token confidences, k = 2: -mean of each position's first two log-probs (the third column is never read)
TOP = [
    [-0.1, -0.3, -5.0],  # 0.2
    [-0.5, -0.7, -5.0],  # 0.6
    [-1.0, -1.4, -5.0],  # 1.2
    [-0.2, -0.2, -5.0],  # 0.2
    [-2.0, -2.0, -9.0],  # 2.0
]


def req(top, partial: bool = False) -> ScoreRequest:
    top = None if top is None else tuple(map(tuple, top))
    n = len(top or ())
    return ScoreRequest("p", "x" * n, tuple(range(n)), partial=partial, top_logprobs=top)


def score(top, **kw) -> float:
    return ConfidenceReward(**{"top_k": 2, **kw}).score([req(top)])[0]


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"form": "mean"}, 4.2 / 5),
        ({"form": "mean", "top_k": 1}, (0.1 + 0.5 + 1.0 + 0.2 + 2.0) / 5),  # the first column only
        ({"form": "mean", "top_k": 3}, (0.4 + 1.2 + 2.4 + 0.4 + 4.0 + 5 * 5.0 + 4.0) / 15),
        ({"form": "lowest_group", "window": 2}, 0.4),  # pairs: 0.4, 0.9, 0.7, 1.1
        ({"form": "lowest_group", "window": 3}, 2.0 / 3),  # triples: 2.0/3, 2.0/3, 3.4/3
        ({"form": "lowest_group", "window": 5}, 0.84),  # one group: the response
        ({"form": "lowest_group", "window": 16}, 0.84),  # shorter than the window: the response
        ({"form": "tail", "tail": 2}, 1.1),  # (0.2 + 2.0) / 2
        ({"form": "tail", "tail": 1}, 2.0),
        ({"form": "tail", "tail": 16}, 0.84),
        ({"form": "bottom", "window": 2}, 0.4),  # ceil(10% of 4 groups) = 1: the lowest
    ],
)
def test_the_forms_against_hand_computed_values(kw, expected):
    assert score(TOP, **kw) == pytest.approx(expected, abs=1e-12)


def test_bottom_averages_the_lowest_tenth_of_the_groups():
    c = [1.0] * 10 + [0.0, 3.0]  # pairs: nine of 1.0, then 0.5 and 1.5: 11 groups, ceil(1.1) = 2 averaged
    top = [[-x, -x] for x in c]
    assert score(top, form="bottom", window=2) == pytest.approx((0.5 + 1.0) / 2)
    assert score(top, form="lowest_group", window=2) == pytest.approx(0.5)
    assert score(top, form="mean") == pytest.approx(13.0 / 12)


def test_peaked_distributions_score_higher_and_the_default_is_lowest_group():
    sure, unsure = [[-0.01, -6.0]] * 20, [[-0.7, -0.7]] * 20
    assert score(sure) > score(unsure)
    r = ConfidenceReward()
    assert (r.form, r.k, r.window, r.tail) == ("lowest_group", 5, 16, 16)
    c = np.arange(20, dtype=float)  # token confidences 0..19 in k = 5 equal columns
    got = r.score([req([[-x] * 5 for x in c])])[0]
    assert got == pytest.approx(np.mean(c[:16]))  # the lowest of the 16-token windows is the first


def test_an_empty_response_gets_the_empty_score_and_costs_nothing():
    r = ConfidenceReward(top_k=2, empty_score=-3.0)
    assert r.score([req(None), req([]), req(TOP)]) == pytest.approx([-3.0, -3.0, score(TOP)])
    assert r.cost.calls == 1 and r.cost.tokens == 5 and r.cost.flops == 5 * (2 + 2)


def test_partial_and_finished_responses_are_scored_alike():
    r = ConfidenceReward(top_k=2, form="mean")
    assert r.score([req(TOP[:3], partial=True), req(TOP[:3])]) == pytest.approx([2.0 / 3, 2.0 / 3])


def test_it_declares_the_top_k_it_reads():
    r = build_confidence({"top_k": 3}, BuildContext())
    info = reward_info(r)
    assert info.needs_top_logprobs == 3 and not info.needs_logprobs
    assert Scorer(r, "confidence").needs_top_logprobs == 3
    assert "k=3" in r.identity and r.identity != build_confidence({"top_k": 4}, BuildContext()).identity


@pytest.mark.parametrize(
    "params, key",
    [
        ({"top_k": 0}, "reward.top_k"),
        ({"top_k": -2}, "reward.top_k"),
        ({"top_k": 2.5}, "reward.top_k"),
        ({"window": 0}, "reward.window"),
        ({"tail": -1}, "reward.tail"),
        ({"form": "median"}, "reward.form"),
        ({"k": 5}, "reward.k"),
    ],
)
def test_bad_params_name_their_key(params, key):
    with pytest.raises(ConfigError) as e:
        build_confidence(params, BuildContext())
    assert e.value.key == key


@pytest.mark.parametrize("k", [-1, 1.5, True, "5"])
def test_a_reward_that_declares_a_bad_top_k_is_a_plugin_error(k):
    class Bad:
        needs_top_logprobs = k

        def score(self, requests):
            return [0.0] * len(requests)

    with pytest.raises(PluginError, match="needs_top_logprobs"):
        reward_info(Bad())


def test_the_option_composes_and_builds():
    cfg = rodeco.load_config(["reward=confidence", "reward.form=tail", "reward.top_k=3"])
    r = default_plugins().build_reward(cfg.reward, BuildContext())
    assert isinstance(r, ConfidenceReward) and (r.form, r.k, r.needs_top_logprobs) == ("tail", 3, 3)


# --- live decodes ---------------------------------------------------------------------------------------------------

PROMPTS = ["write a haiku about autumn leaves", "give three tips"]


class Probe(ConfidenceReward):
    """The confidence reward (k = 3, its mean), keeping every request it scores; ``logprobs``: it asks for the
    sampled tokens' log-probs too."""

    def __init__(self, logprobs: bool = True) -> None:
        super().__init__(form="mean", top_k=3)
        self.needs_logprobs = logprobs
        self.seen: list[ScoreRequest] = []

    def score(self, requests):
        self.seen.extend(requests)
        return super().score(requests)


def probe_plugins(probe: Probe):
    class Register:
        @hookimpl
        def rodeco_register_rewards(self, register):
            register("probe", lambda params, ctx: probe, "the confidence reward, watched")

    return get_plugin_manager(extra=[Register()])


def decode(gen, reward: str, overrides=(), plugins=None, policy="fixed"):
    """A decode of ``PROMPTS`` by the tiny model; ``reward="probe"``: the reward ``probe_plugins`` registers."""
    ov = ["sampling.max_new_tokens=16", "output.all_candidates=true", "budget.min_tokens_per_round=2", *overrides]
    if reward == "probe":  # the confidence option's node, under the probe's name
        reward, ov = "confidence", [*ov, "reward.name=probe"]
    return rodeco.decode(PROMPTS, generator=gen, n=6, reward=reward, policy=policy, overrides=ov, plugins=plugins)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_each_request_carries_each_tokens_top_k_descending(tiny_gen, engine):
    probe = Probe()
    kv = {"fast": 150, "hf": 330}[engine]  # hf holds the prompt in every row
    out = decode(tiny_gen(engine), "probe", [f"budget.kv_tokens={kv}"], plugins=probe_plugins(probe))
    assert any(r.rounds for r in out.results)  # partial responses were scored at decision points
    partial = [r for r in probe.seen if r.partial]
    assert partial and any(not r.partial for r in probe.seen)
    for r in probe.seen:
        n = len(r.response_ids)
        assert len(r.top_logprobs) == n == len(r.logprobs)
        for top, lp in zip(r.top_logprobs, r.logprobs):
            assert len(top) == 3 and list(top) == sorted(top, reverse=True) and top[0] <= 0.0
            assert top[0] >= lp - 1e-5  # the most likely token is at least as likely as the sampled one
            if lp >= top[-1] + 1e-5:  # a sampled token among the top 3 is one of them
                assert min(abs(lp - t) for t in top) < 1e-5
    # a candidate's final request extends what its partial ones carried
    final = {(r.prompt_index, r.candidate_id): r for r in probe.seen if not r.partial}
    for r in partial:
        f = final.get((r.prompt_index, r.candidate_id))
        if f is not None:
            assert np.allclose(f.top_logprobs[: len(r.top_logprobs)], r.top_logprobs, atol=1e-6)
    for res in out.results:  # the winner's score is its confidence
        best = [r for r in probe.seen if not r.partial and r.candidate_id == res.best.candidate_id]
        assert res.best.score == pytest.approx(-np.mean(np.asarray(best[-1].top_logprobs)), abs=1e-5)


def test_a_reward_that_reads_only_the_top_k_gets_no_token_logprobs(tiny_gen):
    probe = Probe(logprobs=False)
    decode(tiny_gen(), "probe", ["budget.kv_tokens=150"], plugins=probe_plugins(probe))
    assert probe.seen and all(r.logprobs is None and r.top_logprobs is not None for r in probe.seen)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_recording_the_top_k_changes_no_sampled_token(tiny_gen, engine):
    gen = tiny_gen(engine)
    plain = decode(gen, "logprob", ["budget=unlimited"], policy="none")
    probe = Probe()
    topk = decode(gen, "probe", ["budget=unlimited"], plugins=probe_plugins(probe), policy="none")
    for a, b in zip(plain.results, topk.results):
        assert [(c.candidate_id, c.token_ids, c.stop_reason) for c in a.candidates] == [
            (c.candidate_id, c.token_ids, c.stop_reason) for c in b.candidates
        ]
    assert len(probe.seen) == sum(len(r.candidates) for r in plain.results)


def test_a_live_run_with_reward_confidence(tiny_gen, tmp_path):
    out = decode(tiny_gen(), "confidence", ["budget.kv_tokens=150", "reward.window=4"])
    assert any(r.rounds for r in out.results)
    for res in out.results:
        finished = [c for c in res.candidates if c.finished]
        assert res.best.score == max(c.score for c in finished) and all(np.isfinite(c.score) for c in finished)
        assert all(s > 0 for rnd in res.rounds for s in rnd.scores.values())  # -mean log-probs of the top tokens
    assert out.compute.reward_tokens > 0


def test_a_judge_that_reads_top_k_logprobs_is_refused(tiny_gen):
    """A judge scores written results, which keep no log-probs: confidence as a judge would score every response
    as empty."""
    with pytest.raises(ConfigError) as e:
        decode(tiny_gen(), "logprob", ["judge=confidence"])
    assert e.value.key == "judge.confidence" and "log-probs" in e.value.problem


# --- pools ----------------------------------------------------------------------------------------------------------

POOL_PROMPTS = [Prompt(0, "write a haiku about autumn leaves"), Prompt(1, "give three tips")]
NEW = 16
BASE = ["reward=confidence", "reward.window=4", f"sampling.max_new_tokens={NEW}", "budget.min_tokens_per_round=2"]
K = 5


@pytest.fixture(scope="module")
def pool_path(tmp_path_factory, tiny_model, tiny_tokenizer):
    """A pool of 8 candidates per prompt recorded with the 5 most likely tokens' log-probs at each position."""
    from rodeco.core.generator import TorchGenerator

    gen = TorchGenerator(tiny_model, tiny_tokenizer, engine="fast", name="tiny")
    path = tmp_path_factory.mktemp("pool-top") / "pool"
    record(rodeco.load_config(BASE), default_plugins(), path, POOL_PROMPTS, 8, gen=gen, top_logprobs=K)
    return gen, path


def test_a_pool_records_the_top_k_rounded(pool_path):
    _, path = pool_path
    pool = Pool(path)
    assert pool.settings["top_logprobs"] == K
    for p in POOL_PROMPTS:
        for c in pool.prompt(p.index).candidates:
            assert len(c.top_logprobs) == len(c.token_ids) == len(c.logprobs)
            for row, lp in zip(c.top_logprobs, c.logprobs):
                assert len(row) == K and row == sorted(row, reverse=True) and row[0] >= lp - 1e-4
                assert all(x == round(x, 4) for x in row)
    raw = json.loads((path / "prompts" / "0.json").read_text())
    assert "top_logprobs" in raw["candidates"][0]


def test_a_pool_without_the_top_k_records_none(tmp_path, tiny_gen):
    path = tmp_path / "pool"
    cfg = rodeco.load_config(["reward=logprob", "sampling.max_new_tokens=8"])
    record(cfg, default_plugins(), path, POOL_PROMPTS[:1], 4, gen=tiny_gen("fast"))
    pool = Pool(path)
    assert "top_logprobs" not in pool.settings
    assert all(c.top_logprobs == [] for c in pool.prompt(0).candidates)
    assert pool.prompt(0).request(0).top_logprobs is None


def test_a_pool_with_the_top_k_is_extended_only_with_it(pool_path, tmp_path):
    import shutil

    gen, shared = pool_path
    path = tmp_path / "pool"
    shutil.copytree(shared, path)
    with pytest.raises(ConfigError) as e:
        record(rodeco.load_config(BASE), default_plugins(), path, [Prompt(2, "x")], 8, gen=gen)  # k = 0
    assert e.value.key == "pool" and "top_logprobs" in e.value.problem
    record(rodeco.load_config(BASE), default_plugins(), path, [Prompt(2, "why blue")], 8, gen=gen, top_logprobs=K)
    assert len(Pool(path).prompt(2).candidates[0].top_logprobs[0]) == K


def replay_and_live(gen, path, overrides=()):
    run = ["policy=fixed", "policy.alpha=0.5", "budget.kv_tokens=90", "n=8", "output.all_candidates=true"]
    cfg = rodeco.load_config([*BASE, *overrides, *run, "data.batch_prompts=1"])
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts, cfg.output.progress = None, [p.text for p in POOL_PROMPTS], False
    plugins = default_plugins()
    live = run_decode(cfg, plugins, None, gen=gen).results
    pool, rgen = open_pool(path, live=lambda: gen)
    reward = pool_reward(cfg, plugins, pool, rgen)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, "fixed", "confidence")
    return live, [replay_prompt(pool, rgen, Scorer(reward, "confidence"), pol, p.index, s)[0] for p in POOL_PROMPTS]


@pytest.mark.parametrize("overrides", [(), ("reward.top_k=3", "reward.form=mean")])
def test_a_pool_with_the_top_k_replays_to_the_live_scores(pool_path, overrides):
    gen, path = pool_path
    live, replayed = replay_and_live(gen, path, overrides)
    decided = 0
    for lv, rp in zip(live, replayed):
        assert (rp.best.candidate_id, rp.best.text) == (lv.best.candidate_id, lv.best.text)
        assert rp.best.score == pytest.approx(lv.best.score, abs=1e-3)  # the pool keeps 4 decimals
        assert [(r.tokens_generated, r.kept_ids, r.rejected_ids) for r in rp.rounds] == [
            (r.tokens_generated, r.kept_ids, r.rejected_ids) for r in lv.rounds
        ]
        for a, b in zip(rp.rounds, lv.rounds):
            assert a.scores == pytest.approx(b.scores, abs=1e-3)
        assert [(c.candidate_id, c.token_ids, c.stop_reason) for c in rp.candidates] == [
            (c.candidate_id, c.token_ids, c.stop_reason) for c in lv.candidates
        ]
        lc = {c.candidate_id: c.score for c in lv.candidates if c.finished}
        for c in rp.candidates:
            if c.finished:
                assert c.score == pytest.approx(lc[c.candidate_id], abs=1e-3)
        decided += len(lv.rounds)
    assert decided > 0


def test_a_replay_that_asks_for_more_top_k_than_the_pool_recorded_is_refused(pool_path, tmp_path, tiny_gen):
    gen, path = pool_path
    with pytest.raises(ConfigError) as e:
        replay_and_live(gen, path, (f"reward.top_k={K + 1}",))
    assert e.value.key == "reward" and f"top_logprobs={K + 1}" in e.value.fix
    bare = tmp_path / "bare"
    record(rodeco.load_config(["reward=logprob", *BASE[2:]]), default_plugins(), bare, POOL_PROMPTS, 8, gen=gen)
    with pytest.raises(ConfigError) as e:
        replay_and_live(gen, bare)
    assert e.value.key == "reward" and "records the 0 most likely" in e.value.problem


def test_pool_served_confidence_refuses_a_pool_without_enough_top_k(pool_path, tmp_path):
    """Experiments score a pool's candidates outside any session (final and partial requests built from the pool):
    a confidence reward that reads more top-k than the pool holds is refused there too, not scored on fewer."""
    gen, path = pool_path
    cfg = rodeco.load_config([*BASE, f"reward.top_k={K + 1}"])
    pool, rgen = open_pool(path, live=lambda: gen)
    with pytest.raises(ConfigError) as e:
        pool_reward(cfg, default_plugins(), pool, rgen)
    assert e.value.key == "reward"
    ok = pool_reward(rodeco.load_config([*BASE, "reward.form=mean"]), default_plugins(), pool, rgen)
    (first, *_) = ok.score(pool.prompt(0).final_requests())
    c = pool.prompt(0).candidates[0]
    assert first == pytest.approx(-np.mean(c.top_logprobs), abs=1e-9)


def test_prompts_recorded_together_are_the_candidates_recorded_one_by_one(pool_path, tmp_path):
    """``batch_prompts``: several prompts in one session draw the samples each draws alone (same tokens, log-probs
    and top-k to float rounding), carry their records, and share the batch's costs; hidden states are recorded one
    prompt at a time."""
    gen, alone = pool_path
    path = tmp_path / "pool"
    prompts = [Prompt(p.index, p.text, {"gold_answer": str(p.index)}) for p in POOL_PROMPTS]
    cfg, plugins = rodeco.load_config(BASE), default_plugins()
    record(cfg, plugins, path, prompts, 8, gen=gen, top_logprobs=K, batch_prompts=2, hidden_states=False)
    together, one = Pool(path), Pool(alone)
    for p in prompts:
        a, b = together.prompt(p.index), one.prompt(p.index)
        assert a.meta == {"gold_answer": str(p.index)} and a.batch_prompts == 2 and b.batch_prompts == 1
        for x, y in zip(a.candidates, b.candidates):
            assert x.token_ids == y.token_ids  # the same samples; their log-probs to float rounding (other shapes)
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
            assert np.allclose(x.top_logprobs, y.top_logprobs, atol=2e-4)
    with pytest.raises(ConfigError) as e:
        record(
            rodeco.load_config(BASE),
            default_plugins(),
            tmp_path / "hidden",
            prompts,
            8,
            gen=gen,
            top_logprobs=K,
            batch_prompts=2,
            hidden_states=True,
        )
    assert e.value.key == "experiment_args.batch_prompts"
