"""Integration tests on the embedded SmolLM2-135M-Instruct (loaded once per session, cached after the first run)."""

from __future__ import annotations

import pytest
from helpers import hf_greedy, run_tiny

PROMPTS = ["Write a haiku about autumn.", "Name three primary colors."]


@pytest.mark.integration
def test_greedy_matches_generate_on_smollm2(smollm2):
    out = run_tiny(
        smollm2,
        PROMPTS,
        n=2,
        policy="none",
        overrides=["sampling.temperature=0", "budget=unlimited", "sampling.max_new_tokens=32"],
    )
    assert type(smollm2.new_engine()).__name__ == "LlamaEngine"  # the default engine for this model
    for prompt, r in zip(PROMPTS, out.results):
        ref = hf_greedy(smollm2.model, smollm2, prompt, 32)
        assert len(ref) > 10
        assert r.best.token_ids == ref


@pytest.mark.integration
def test_speculative_rejection_on_smollm2_saves_decode_tokens(smollm2):
    ov = ["budget.kv_tokens=800", "sampling.max_new_tokens=48", "policy.alpha=0.5"]
    sr = run_tiny(smollm2, PROMPTS, n=8, overrides=ov, seed=3)
    bon = run_tiny(
        smollm2, PROMPTS, n=8, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=48"], seed=3
    )
    assert all(r.rounds for r in sr.results)
    assert sr.compute.peak_kv_tokens <= 800 < bon.compute.peak_kv_tokens
    assert sr.compute.gen_decode_tokens < bon.compute.gen_decode_tokens


@pytest.mark.integration
def test_replay_equals_live_on_smollm2_with_the_default_reward(smollm2, tmp_path):
    """One AlpacaFarm-style prompt, the embedded generator and the embedded reward: a pool of 12 candidates, then
    fixed alpha 0.5 replayed and run live under the same budget pick the same winner at the same cost."""
    from omegaconf import open_dict

    import rodeco
    from rodeco.core.contracts import Scorer
    from rodeco.core.data import Prompt
    from rodeco.experiments.record import pool_reward, record
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.replays.replay import open_pool, replay_prompt
    from rodeco.runner import loop_settings, run_decode

    prompt = Prompt(0, "Give three tips for staying healthy.")
    ov = [
        "sampling.max_new_tokens=40",
        "budget.kv_tokens=300",
        "n=12",
        "policy.alpha=0.5",
        "output.all_candidates=true",
    ]
    cfg = rodeco.load_config(ov)
    plugins = default_plugins()
    record(cfg, plugins, tmp_path / "pool", [prompt], 12, gen=smollm2)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts, cfg.output.progress = None, [prompt.text], False
    (live,) = run_decode(cfg, plugins, None, gen=smollm2).results
    pool, rgen = open_pool(tmp_path / "pool")
    reward = pool_reward(cfg, plugins, pool, rgen)
    policy = plugins.build_policy(cfg.policy, BuildContext(plugins=plugins))
    res, comp, _ = replay_prompt(
        pool, rgen, Scorer(reward, "minilm_rm"), policy, 0, loop_settings(cfg, rgen, "fixed", "minilm_rm")
    )
    assert live.rounds and res.best.candidate_id == live.best.candidate_id and res.best.text == live.best.text
    assert res.best.score == pytest.approx(live.best.score, abs=1e-4)
    assert [r.kept_ids for r in res.rounds] == [r.kept_ids for r in live.rounds]
    assert (comp.gen_decode_tokens, comp.decode_steps, comp.peak_kv_tokens) == (
        live.compute.gen_decode_tokens,
        live.compute.decode_steps,
        live.compute.peak_kv_tokens,
    )
    assert comp.gen_flops == pytest.approx(live.compute.gen_flops, rel=1e-12)
    assert comp.reward_flops == pytest.approx(live.compute.reward_flops, rel=0.05)  # charged per request
