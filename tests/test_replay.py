"""Pools and replay: a policy replayed over a recorded pool by the real loop gives exactly what a live run gives
(winners, every candidate, round traces, decode tokens, steps, FLOPs, peak KV), policy by policy, under two budgets,
on both engines; the model-free engine layouts allocate as the real engines do."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import open_dict

import rodeco
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer
from rodeco.core.data import Prompt
from rodeco.engines.layout import LAYOUTS
from rodeco.experiments.bench import replay_trace
from rodeco.experiments.record import pool_reward, record
from rodeco.plugins import BuildContext, default_plugins
from rodeco.replays.pool import Pool
from rodeco.replays.replay import check_replayable, open_pool, replay_batch, replay_prompt
from rodeco.replays.replay_open import Arrival, replay_arrivals
from rodeco.runner import loop_settings, run_decode

PROMPTS = [
    Prompt(0, "write a haiku about autumn leaves"),
    Prompt(1, "give three tips"),
    Prompt(2, "explain why the sky is blue in two sentences"),
]
NEW = 40  # longer than a block (8 or 16 tokens), so that a budget can force decision points past the first block
BASE = ["reward=logprob", f"sampling.max_new_tokens={NEW}", "budget.min_tokens_per_round=2"]
# budgets under which 8 rows of a prompt of PROMPTS meet decision points, on blocks of 8 as of 16: a tight one (70)
# and a looser one (110), per engine (hf stores the prompt in every row)
KV = {"fast": {70: 160, 110: 200}, "hf": {70: 240, 110: 290}}


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_layouts_allocate_as_the_real_engines(tiny_gen, engine):
    real = tiny_gen(engine).new_engine()
    layout = LAYOUTS[real.name](real.block)
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    ops = [
        ("admit", (ids, mask)),
        ("select", (torch.arange(2).repeat_interleave(3),)),
        *[("step", None)] * 5,
        ("select", (torch.tensor([4, 0, 2, 5]),)),
        *[("step", None)] * 4,
        ("select", (torch.tensor([1, 3]),)),
        *[("step", None)] * 3,  # overflows
        ("select", (torch.tensor([1]),)),
        ("step", None),
    ]
    same_allocation(real, layout, ops)


def same_allocation(real, layout, ops) -> None:
    """Each op on both, then the same rows, length and memory (a step feeds one token a row), and the same steps
    within a quota for every row and for the first half of them (a decision point's question)."""
    for i, (op, args) in enumerate(ops):
        for e in (real, layout):
            getattr(e, op)(*(args if args is not None else (torch.full((e.rows,), 12, dtype=torch.long),)))
        assert (layout.rows, layout.length, layout.allocated_tokens) == (
            real.rows,
            real.length,
            real.allocated_tokens,
        ), f"after op {i} ({op})"
        for rows in (np.arange(real.rows), np.arange(real.rows // 2)):
            for quota in (64, 200):
                assert layout.steps_within(rows, quota, 3, 40) == real.steps_within(rows, quota, 3, 40), (i, quota)


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_layouts_admit_as_the_real_engines(tiny_gen, engine):
    """Prompts joining a running batch (longer and shorter than the rows there), rows leaving while the rows are of
    different lengths, and the batch's first rows all leaving: the layout's rows, length and memory stay the
    engine's."""
    real = tiny_gen(engine).new_engine()
    layout = LAYOUTS[real.name](real.block)
    ops = [
        ("admit", (torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))),
        ("select", (torch.arange(2).repeat_interleave(2),)),
        *[("step", None)] * 3,
        ("admit", (torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 1, 1, 1, 1]]))),  # longer than the rows there
        ("select", (torch.tensor([0, 1, 2, 3, 4, 4, 4]),)),
        *[("step", None)] * 2,
        ("select", (torch.tensor([0, 3, 4, 6]),)),  # rows of different lengths leave
        *[("step", None)] * 4,  # overflows
        ("admit", (torch.tensor([[0, 0, 6, 7], [2, 3, 4, 5]]), torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))),
        ("select", (torch.tensor([0, 1, 2, 3, 4, 4, 5]),)),
        *[("step", None)] * 2,
        ("select", (torch.tensor([2, 3, 4, 5, 6]),)),  # the first prompts' rows all leave
        *[("step", None)] * 3,
        ("select", (torch.tensor([2, 3, 4]),)),  # only the last admission's rows: one length again
        ("step", None),
    ]
    same_allocation(real, layout, ops)


@pytest.fixture(scope="module")
def pools(tmp_path_factory, tiny_model, tiny_tokenizer):
    """A pool of 12 candidates per prompt recorded with each engine."""
    from rodeco.core.generator import TorchGenerator

    out = {}
    for engine in ("fast", "hf"):
        gen = TorchGenerator(tiny_model, tiny_tokenizer, engine=engine, name="tiny")
        path = tmp_path_factory.mktemp(f"pool-{engine}") / "pool"
        record(rodeco.load_config(BASE), default_plugins(), path, PROMPTS, 12, gen=gen)
        out[engine] = (gen, path)
    return out


CASES = [
    ("none", {}, None),
    ("fixed", {"alpha": 0.3}, 70),
    ("fixed", {"alpha": 0.5}, 70),
    ("fixed", {"alpha": 0.8}, 110),
    ("fixed", {"alpha": 0.5}, 110),
    ("adaptive", {}, 70),
    ("adaptive", {"delta": 0.2}, 110),
    ("correlation", {}, 70),
    ("correlation", {}, 110),
]


def live_and_replay(
    gen,
    path: Path,
    policy: str,
    params: dict,
    kv: int | None,
    n: int | str = 8,
    extra: tuple[str, ...] = (),
    with_gen: bool = False,
):
    ov = [
        *BASE,
        *extra,
        f"policy={policy}",
        *[f"policy.{k}={v}" for k, v in params.items()],
        "budget=unlimited" if kv is None else f"budget.kv_tokens={kv}",
        f"n={n}",
        "output.all_candidates=true",
        "data.batch_prompts=1",
    ]
    cfg = rodeco.load_config(ov)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts, cfg.output.progress = None, [p.text for p in PROMPTS], False
    plugins = default_plugins()
    live = run_decode(cfg, plugins, None, gen=gen).results
    pool, rgen = open_pool(path, live=lambda: gen)  # the live generator decodes copies' continuations
    reward = pool_reward(cfg, plugins, pool, rgen)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, policy, "logprob")
    replayed = [replay_prompt(pool, rgen, Scorer(reward, "logprob"), pol, p.index, s) for p in PROMPTS]
    return (live, replayed, rgen) if with_gen else (live, replayed)


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("policy, params, kv", CASES)
def test_replay_equals_live(pools, engine, policy, params, kv):
    if engine == "hf" and policy not in ("fixed", "none"):
        pytest.skip("the hf engine is checked with none and fixed; the policies are engine-independent")
    gen, path = pools[engine]
    if kv is not None:
        kv = KV[engine][kv]
    live, replayed = live_and_replay(gen, path, policy, params, kv)
    decided = 0
    for lv, (rp, comp, _) in zip(live, replayed):
        assert rp.best.candidate_id == lv.best.candidate_id and rp.best.text == lv.best.text
        assert rp.best.score == pytest.approx(lv.best.score, abs=1e-5)
        assert [
            (r.round, r.tokens_generated, r.rows_before, r.rows_kept, r.kept_ids, r.rejected_ids, r.min_reject)
            for r in rp.rounds
        ] == [
            (r.round, r.tokens_generated, r.rows_before, r.rows_kept, r.kept_ids, r.rejected_ids, r.min_reject)
            for r in lv.rounds
        ]
        for a, b in zip(rp.rounds, lv.rounds):
            assert a.scores == pytest.approx(b.scores, abs=1e-5)
        assert [(c.candidate_id, c.token_ids, c.stop_reason, c.rejected_at_round) for c in rp.candidates] == [
            (c.candidate_id, c.token_ids, c.stop_reason, c.rejected_at_round) for c in lv.candidates
        ]
        lc = lv.compute
        assert (comp.gen_prefill_tokens, comp.gen_decode_tokens, comp.decode_steps, comp.peak_kv_tokens) == (
            lc.gen_prefill_tokens,
            lc.gen_decode_tokens,
            lc.decode_steps,
            lc.peak_kv_tokens,
        )
        assert comp.gen_flops == pytest.approx(lc.gen_flops, rel=1e-12)
        decided += len(lv.rounds)
    assert decided > 0 or policy == "none"


SEARCH = [
    ("particle_filter", {"decision_tokens": 4}, None),
    ("particle_filter", {"resampling": "systematic", "decision_tokens": 4}, 110),
    ("beam", {"beam_width": 2, "decision_tokens": 4}, 70),
    ("beam", {"beam_width": 4, "decision_tokens": 5}, None),
    ("dvts", {"beam_width": 2, "decision_tokens": 3}, 110),
]


@pytest.mark.parametrize("policy, params, kv", SEARCH)
def test_replay_of_a_forking_policy_equals_live(pools, tmp_path, policy, params, kv):
    """Copies replayed from the pool's continuations (decoded on first use from the parent's tokens, then served
    from the pool) give the live run's winners, candidates, lineage, rounds and compute."""
    gen, shared = pools["fast"]
    path = tmp_path / "pool"
    shutil.copytree(shared, path)
    kv = kv if kv is None else KV["fast"][kv]
    for attempt in ("decoded", "served"):
        live, replayed, rgen = live_and_replay(gen, path, policy, params, kv, with_gen=True)
        copies = 0
        for lv, (rp, comp, _) in zip(live, replayed):
            assert (rp.best.candidate_id, rp.best.text) == (lv.best.candidate_id, lv.best.text)
            assert [(r.tokens_generated, r.rows_before, r.rows_kept, r.kept_ids, r.copies) for r in rp.rounds] == [
                (r.tokens_generated, r.rows_before, r.rows_kept, r.kept_ids, r.copies) for r in lv.rounds
            ]
            assert [(c.candidate_id, c.token_ids, c.stop_reason, c.parent, c.forked_round) for c in rp.candidates] == [
                (c.candidate_id, c.token_ids, c.stop_reason, c.parent, c.forked_round) for c in lv.candidates
            ]
            lc = lv.compute
            assert (comp.gen_decode_tokens, comp.decode_steps, comp.peak_kv_tokens) == (
                lc.gen_decode_tokens,
                lc.decode_steps,
                lc.peak_kv_tokens,
            )
            copies += sum(c.parent is not None for c in lv.candidates)
        assert copies > 0
        assert (rgen.continued > 0) == (attempt == "decoded")  # the second replay decodes nothing


def test_a_vote_that_stops_replays_as_live(pools):
    """winner.stop over a pool: the same prompts stop at the same length, with the same candidates cut and the same
    compute (a Beta threshold of 0.6 settles a vote on its first answer, so every prompt with a row that ends early
    stops)."""
    gen, path = pools["fast"]
    vote = ("winner.rule=majority", "winner.extractor=regex", "winner.pattern='(.)'", "winner.stop=beta")
    extra = (*vote, "winner.stop_threshold=0.6", "winner.stop_tokens=4")
    live, replayed = live_and_replay(gen, path, "none", {}, None, n=12, extra=extra)
    assert any(lv.stopped_at is not None for lv in live)
    for lv, (rp, comp, _) in zip(live, replayed):
        assert (rp.stopped_at, rp.answer, rp.best.candidate_id) == (lv.stopped_at, lv.answer, lv.best.candidate_id)
        assert [(c.candidate_id, c.token_ids, c.stop_reason) for c in rp.candidates] == [
            (c.candidate_id, c.token_ids, c.stop_reason) for c in lv.candidates
        ]
        assert (comp.gen_decode_tokens, comp.decode_steps) == (lv.compute.gen_decode_tokens, lv.compute.decode_steps)


def test_replay_starts_from_auto_as_live(pools):
    gen, path = pools["fast"]
    live, replayed = live_and_replay(
        gen, path, "fixed", {"alpha": 0.5}, 104, n="auto", extra=("budget.min_tokens_per_round=8",)
    )  # auto: fewer rows than the pool (10 on blocks of 8, 4 on blocks of 16)
    for lv, (rp, comp, _) in zip(live, replayed):
        assert 1 < rp.n_start == lv.n_start <= 12 and rp.best.candidate_id == lv.best.candidate_id
        assert comp.gen_decode_tokens == lv.compute.gen_decode_tokens


def test_a_pool_resumes_and_refuses_other_settings(pools, tmp_path):
    gen, shared = pools["fast"]
    path = tmp_path / "pool"
    shutil.copytree(shared, path)
    pool = Pool(path)
    first = path / "prompts" / "0.json"
    mtime = first.stat().st_mtime_ns
    record(rodeco.load_config(BASE), default_plugins(), path, PROMPTS, 12, gen=gen)  # nothing missing
    assert first.stat().st_mtime_ns == mtime and pool.indices() == [0, 1, 2]
    more = [*PROMPTS, Prompt(3, "one more prompt")]
    record(rodeco.load_config(BASE), default_plugins(), path, more, 12, gen=gen)  # only prompt 3 is recorded
    assert first.stat().st_mtime_ns == mtime and Pool(path).indices() == [0, 1, 2, 3]
    with pytest.raises(ConfigError) as e:
        record(rodeco.load_config([*BASE, "seed=1"]), default_plugins(), path, [Prompt(4, "x")], 12, gen=gen)
    assert e.value.key == "pool" and "seed" in e.value.problem


def test_a_pool_recorded_before_step_costs_were_renamed_still_loads(pools, tmp_path):
    """Pools record their decode step times as step_costs.json; older ones hold the same as calibration.json."""
    gen, shared = pools["fast"]
    path = tmp_path / "pool"
    shutil.copytree(shared, path)
    costs = Pool(path).step_costs
    assert costs is not None and set(costs) >= {"rows", "context", "seconds"} and len(costs["rows"]) > 0
    (path / "step_costs.json").rename(path / "calibration.json")
    assert Pool(path).step_costs == costs
    mtime = (path / "calibration.json").stat().st_mtime_ns
    record(rodeco.load_config(BASE), default_plugins(), path, PROMPTS, 12, gen=gen)  # complete: nothing measured
    assert not (path / "step_costs.json").exists() and (path / "calibration.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("engine, recorded", [("fast", "FastLlamaEngine"), ("hf", "HFEngine")])
def test_a_pool_that_recorded_its_engines_class_name_still_replays_and_extends(pools, tmp_path, engine, recorded):
    """Pools record the engine's stable id (``EngineInfo.name``); those that recorded its class name open as that id,
    replay on its layout, and take new prompts without a settings mismatch."""
    gen, shared = pools[engine]
    path = tmp_path / "pool"
    shutil.copytree(shared, path)
    f = path / "pool.json"
    settings = json.loads(f.read_text())
    assert settings["engine"] == engine
    f.write_text(json.dumps({**settings, "engine": recorded}))
    _, rgen = open_pool(path, live=lambda: gen)
    assert rgen.info.name == engine and rgen.layout is LAYOUTS[engine]
    record(rodeco.load_config(BASE), default_plugins(), path, [*PROMPTS, Prompt(3, "one more")], 12, gen=gen)
    assert Pool(path).indices() == [0, 1, 2, 3] and json.loads(f.read_text())["engine"] == recorded


def test_replay_refuses_settings_the_pool_was_not_recorded_with(pools):
    _, path = pools["fast"]
    pool, rgen = open_pool(path)
    for ov, key in [
        ("seed=3", "seed"),
        ("sampling.temperature=0.7", "sampling.temperature"),
        (f"sampling.max_new_tokens={NEW + 1}", "sampling.max_new_tokens"),
        ("n=13", "n"),
    ]:
        s = loop_settings(rodeco.load_config([*BASE, ov]), rgen)
        with pytest.raises(ConfigError) as e:
            check_replayable(pool, s, s.n)
        assert e.value.key == key


def test_rewards_are_computed_once_then_served_from_the_pool(pools):
    gen, path = pools["fast"]
    cfg = rodeco.load_config([*BASE, "policy.alpha=0.5", f"budget.kv_tokens={KV['fast'][70]}", "n=8"])
    plugins = default_plugins()
    pool, rgen = open_pool(path)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, "fixed", "logprob")
    first = pool_reward(cfg, plugins, pool, rgen)
    replay_prompt(pool, rgen, Scorer(first, "logprob"), pol, 0, s)
    first.save()
    again = pool_reward(cfg, plugins, Pool(path), rgen)  # a new process would start like this
    res, comp, _ = replay_prompt(Pool(path), rgen, Scorer(again, "logprob"), pol, 0, s)
    assert again.computed == 0 and again.cost.calls > 0


def test_the_replay_experiment_writes_results(pools, tmp_path, capsys):
    _, path = pools["fast"]
    cfg = rodeco.load_config(["experiment=replay", *BASE, f"pool={path}", "n=8", "experiment_args.best_of=2"])
    out = rodeco.run(cfg, out_dir=tmp_path)
    assert [r.prompt_index for r in out.results] == [0, 1, 2]
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 3
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("replay_seconds: ")
    with pytest.raises(ConfigError, match="pool"):
        rodeco.run(rodeco.load_config(["experiment=replay", *BASE]), out_dir=tmp_path)


@pytest.mark.parametrize("kv", [70, 110])
def test_the_oracle_with_alpha_half_keeps_the_true_best(pools, kv):
    """partial_reward=oracle decides by each candidate's final reward: fixed alpha 0.5 then keeps the best of the
    started candidates to the end (the budget forces no more than half out here), at the cost `same` pays."""
    from rodeco.replays.pool_rewards import OracleReward

    gen, path = pools["fast"]
    cfg = rodeco.load_config([*BASE, "policy=fixed", "policy.alpha=0.5", f"budget.kv_tokens={KV['fast'][kv]}", "n=8"])
    plugins = default_plugins()
    pool, rgen = open_pool(path)
    reward = pool_reward(cfg, plugins, pool, rgen)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, "fixed", "logprob")
    decided = 0
    for p in PROMPTS:
        final = reward.score(pool.prompt(p.index).final_requests())[:8]
        res, comp, _ = replay_prompt(
            pool,
            rgen,
            Scorer(reward, "logprob"),
            pol,
            p.index,
            s,
            partial=Scorer(OracleReward(reward), "oracle", "partial_reward"),
        )
        same, comp_same, _ = replay_prompt(pool, rgen, Scorer(reward, "logprob"), pol, p.index, s)
        if all(r.min_reject <= r.rows_before // 2 for r in res.rounds):
            assert res.best.score == pytest.approx(max(final)) and res.best.score >= same.best.score - 1e-9
        decided += len(res.rounds)
        assert comp.gen_decode_tokens > 0 and comp.partial_reward_calls == len(res.rounds)
    assert decided > 0


class Probe:
    """A reward that reads hidden states: keeps each request's, by (prompt, candidate, length, partial)."""

    needs_hidden_states = True

    def __init__(self):
        self.seen = {}

    def score(self, requests):
        for r in requests:
            self.seen[(r.prompt_index, r.candidate_id, len(r.response_ids), r.partial)] = np.asarray(r.hidden_state)
        return [float(r.hidden_state[0]) for r in requests]


def test_a_replay_serves_the_hidden_states_a_live_run_gives(pools):
    """A partial reward that reads hidden states decides the same in a replay as live: the pool's stored states are
    the live run's at every decision point (rows pruned in between)."""
    from rodeco.core.loop import decode_batch

    gen, path = pools["fast"]
    cfg = rodeco.load_config([*BASE, "policy=fixed", "policy.alpha=0.5", f"budget.kv_tokens={KV['fast'][70]}", "n=8"])
    plugins = default_plugins()
    pool, rgen = open_pool(path)
    reward = pool_reward(cfg, plugins, pool, rgen)
    pol = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    s = loop_settings(cfg, rgen, "fixed", "logprob")
    live, replayed = Probe(), Probe()
    for p in PROMPTS:
        (lv,), _ = decode_batch(
            gen,
            Scorer(reward, "logprob"),
            pol,
            [(p.index, p.text)],
            loop_settings(cfg, gen),
            partial=Scorer(live, "probe", "partial_reward"),
        )
        rp, _, _ = replay_prompt(
            pool, rgen, Scorer(reward, "logprob"), pol, p.index, s, partial=Scorer(replayed, "probe", "partial_reward")
        )
        assert [r.kept_ids for r in rp.rounds] == [r.kept_ids for r in lv.rounds]
    assert live.seen and live.seen.keys() == replayed.seen.keys()
    for k, h in live.seen.items():  # float16 in the pool
        np.testing.assert_allclose(replayed.seen[k], h, rtol=2e-3, atol=2e-3)


def test_a_replay_serves_the_final_hidden_states_a_live_run_gives(pools):
    """A reward that reads hidden states picking the winner gets, in a replay, the live run's state of each finished
    response's last step (the pool's float16 copy of it)."""
    from rodeco.core.loop import decode_batch

    gen, path = pools["fast"]
    cfg = rodeco.load_config([*BASE, "policy=none", "budget=unlimited", "n=8"])
    pool, rgen = open_pool(path)
    pol = default_plugins().build_policy(cfg.policy, BuildContext())
    live, replayed = Probe(), Probe()
    for p in PROMPTS:
        decode_batch(gen, Scorer(live, "probe"), pol, [(p.index, p.text)], loop_settings(cfg, gen))
        replay_prompt(pool, rgen, Scorer(replayed, "probe"), pol, p.index, loop_settings(cfg, rgen, "none", "probe"))
    finals = {k: h for k, h in live.seen.items() if not k[3]}
    assert len(finals) == 8 * len(PROMPTS) and finals.keys() == {k for k in replayed.seen if not k[3]}
    for k, h in finals.items():
        np.testing.assert_allclose(replayed.seen[k], h, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("policy, params, kv", [("none", {}, None), ("fixed", {"alpha": 0.5}, 70)])
def test_a_pool_replayed_with_staggered_arrivals_gives_each_prompt_its_closed_batch_result(
    pools, engine, policy, params, kv
):
    """An arrival trace replayed through the open loop over a pool: the prompts join a running batch at different
    steps (each with its own budget), and each gets what a closed batch of it alone gets from the same pool
    (``replay_prompt``): winners, candidates and rounds; Best-of-N also what the closed batch of all
    three gets. The modelled clock orders arrival, admission and completion."""
    gen, path = pools[engine]
    kv = kv if kv is None else KV[engine][kv]
    ov = [*BASE, f"policy={policy}", *[f"policy.{k}={v}" for k, v in params.items()], "n=8"]
    cfg = rodeco.load_config([*ov, "budget=unlimited" if kv is None else f"budget.kv_tokens={kv}"])
    with open_dict(cfg):
        cfg.output.all_candidates = True
    plugins = default_plugins()
    pool, rgen = open_pool(path, live=lambda: gen)
    reward = Scorer(pool_reward(cfg, plugins, pool, rgen), "logprob")
    build = lambda: plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))  # noqa: E731
    s = loop_settings(cfg, rgen, policy, "logprob")
    arrivals = [Arrival(0.0, 0), Arrival(0.05, 1), Arrival(0.12, 2)]  # a step: 10 ms
    out, stats, clock = replay_arrivals(
        pool, rgen, reward, build, arrivals, s, step=lambda rows, ctx: 0.01, check_tokens=2
    )
    assert stats.admitted == 3 and max(stats.step_prompts) >= 2  # prompts shared steps
    # each joined after it arrived, while the first was still running (its prefill and rewards on the clock too)
    assert out[0].admitted_s == 0.0 and all(a.arrival.at <= a.admitted_s < out[0].done_s for a in out[1:])
    for r in out:
        assert r.modelled_queue_s >= 0 and r.modelled_latency_s > r.modelled_queue_s and r.result is not None
        alone, _, _ = replay_prompt(pool, rgen, reward, build(), r.arrival.index, s)
        assert summary(r.result) == summary(alone)
        # its decode tokens are its rows' steps, which include finished rows' padding while they wait to leave: that
        # depends on the batch they wait in, so only the candidates are compared
        assert r.result.compute.gen_decode_tokens > 0
    if policy == "none":
        closed, _, _ = replay_batch(pool, rgen, reward, build(), [0, 1, 2], s)
        assert [summary(r.result) for r in out] == [summary(c) for c in closed]
    else:
        assert any(r.result.rounds for r in out)  # decision points were met
    with pytest.raises(ConfigError) as e:
        longer = dataclasses.replace(s, max_new_tokens=NEW + 1)
        replay_arrivals(pool, rgen, reward, build, arrivals, longer, step=lambda rows, ctx: 0.01)
    assert e.value.key == "sampling.max_new_tokens"


def summary(r):
    cands = sorted((c.candidate_id, c.token_ids, c.stop_reason, c.rejected_at_round) for c in r.candidates or [])
    rounds = [(x.tokens_generated, x.rows_before, x.kept_ids, x.rejected_ids) for x in r.rounds]
    return r.best.candidate_id, r.best.token_ids, r.best.score, cands, rounds


def test_the_trace_script_replays_a_serve_bench_snapshots_arrivals(pools, tmp_path, capsys):
    """``scripts/replay_trace.py`` over a snapshot whose first two requests arrived together and the third 0.05 s
    later, each with the budget the server gave it: every request replayed, modelled latencies printed beside the
    measured ones."""
    _, path = pools["fast"]
    records = [
        {
            "prompt_index": i,
            "arrival": 0.05 * max(0, i - 1),
            "latency": 1.0 + i,
            "ok": True,
            "server": {"kv_tokens": KV["fast"][70], "queue_seconds": 0.1},
        }
        for i in range(3)
    ]
    args = {
        "rate": 20.0,
        "best_of": 8,
        "reward": "logprob",
        "max_tokens": NEW,
        "top_k": 50,
        "temperature": 1.0,
        "alpha": 0.5,
        "kv_tokens": 2 * KV["fast"][70],
    }
    trace = tmp_path / "serve_bench.json"
    summary = {"requests_per_s": 0.5, "goodput_per_s": 0.5}
    trace.write_text(json.dumps({"args": args, "servers": {"sr": {"records": records, "summary": summary}}}))
    out = tmp_path / "replayed.json"
    (row,) = replay_trace.main(
        [
            "--pool",
            str(path),
            "--trace",
            str(trace),
            "--check-tokens",
            "2",
            "--out",
            str(out),
            "--",
            "budget.min_tokens_per_round=2",
        ]
    )
    assert [r["prompt_index"] for r in row["requests_replayed"]] == [0, 1, 2]
    assert all(r["modelled_latency_s"] > r["modelled_queue_s"] >= 0 for r in row["requests_replayed"])
    assert row["measured"]["p50_latency_s"] == 2.0 and row["mean_requests_per_step_modelled"] > 1
    assert json.loads(out.read_text()) == {"pool": path.name, "replays": [row]}
    assert (
        row["modelled"]["requests_per_s"] > 0 and row["modelled"]["goodput_per_s"] == row["modelled"]["requests_per_s"]
    )
    assert "| 20 | 3 | 16 | 0.500 / " in capsys.readouterr().out
