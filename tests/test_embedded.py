"""Integration tests on the embedded SmolLM2-135M-Instruct (loaded once per session, cached after the first run)."""

from __future__ import annotations

import pytest
from helpers import hf_greedy, run_tiny

PROMPTS = ["Write a haiku about autumn.", "Name three primary colors."]


@pytest.mark.integration
def test_greedy_matches_generate_on_smollm2(smollm2):
    out = run_tiny(smollm2, PROMPTS, n=2, policy="none", overrides=["sampling.temperature=0", "budget=unlimited",
                                                                    "sampling.max_new_tokens=32"])
    assert type(smollm2.new_engine()).__name__ == "FastLlamaEngine"  # the default engine for this model
    for prompt, r in zip(PROMPTS, out.results):
        ref = hf_greedy(smollm2.model, smollm2, prompt, 32)
        assert len(ref) > 10
        assert r.best.token_ids == ref


@pytest.mark.integration
def test_speculative_rejection_on_smollm2_saves_decode_tokens(smollm2):
    ov = ["budget.kv_tokens=800", "sampling.max_new_tokens=48", "policy.alpha=0.5"]
    sr = run_tiny(smollm2, PROMPTS, n=8, overrides=ov, seed=3)
    bon = run_tiny(smollm2, PROMPTS, n=8, policy="none", overrides=["budget=unlimited", "sampling.max_new_tokens=48"],
                   seed=3)
    assert all(r.rounds for r in sr.results)
    assert sr.compute.peak_kv_tokens <= 800 < bon.compute.peak_kv_tokens
    assert sr.compute.gen_decode_tokens < bon.compute.gen_decode_tokens
