"""Budget formulas, n=auto, and results that are written per prompt and resumed."""

from __future__ import annotations

import json

import pytest
from helpers import run_tiny

from rodeco.common.budget import Budget, budget_from_device, kv_bytes_per_token
from rodeco.common.validation import ConfigError

PROMPTS = ["write a haiku about autumn leaves", "give three tips"]


def test_cuda_budget_formula_by_hand():
    kv = kv_bytes_per_token(n_layers=30, n_kv_heads=3, head_dim=64, dtype_bytes=2)  # SmolLM2 in bf16
    assert kv == 2 * 30 * 3 * 64 * 2 == 23040
    free, reserve = 100 * 2**30, 2 * 2**30
    assert budget_from_device(free, kv, 0.9, reserve) == int((98 * 2**30) * 0.9 // 23040)


def test_minimum_rejection_by_hand():
    b = Budget(kv_tokens=1000, min_tokens_per_round=8)
    assert b.max_rows(length=50, max_length=200) == 1000 // 58  # room for 8 more tokens per row
    assert b.max_rows(length=196, max_length=200) == 1000 // 200  # only 4 tokens left to decode
    assert Budget(None).max_rows(length=10, max_length=77) >= 10**9


def test_n_auto_is_the_largest_n_whose_first_round_fits(tiny_gen):
    gen = tiny_gen()
    budget, m = 900, 8
    out = run_tiny(gen, PROMPTS, n="auto", overrides=[f"budget.kv_tokens={budget}", "sampling.max_new_tokens=40"])
    b = gen.kv.block
    shared = sum(-(-len(gen.encode(p)) // b) * b for p in PROMPTS)  # each prompt once, in whole blocks
    n = out.results[0].n_start
    own, held = budget - shared, -(-m // b) * b  # the rows share the rest; a row's first round holds m in blocks
    assert n == own // (held * 2)
    assert shared + n * 2 * held <= budget < shared + (n + 1) * 2 * held
    assert out.compute.peak_kv_tokens <= budget


def test_results_written_per_prompt_and_resumed(tiny_gen, tmp_path):
    gen = tiny_gen()
    prompts = PROMPTS + ["explain why the sky is blue"]
    ov = ["budget.kv_tokens=1500", "sampling.max_new_tokens=20", "data.batch_prompts=1"]
    first = run_tiny(gen, prompts, n=4, overrides=ov, out_dir=tmp_path)
    path = tmp_path / "results.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["prompt_index"] for r in recs] == [0, 1, 2]
    assert recs[1]["best"]["text"] == first.results[1].best.text
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind
    # lose prompt 1, as if the run had died before it finished: a rerun decodes only that prompt
    path.write_text("\n".join(json.dumps(r) for r in (recs[0], recs[2])) + "\n")
    second = run_tiny(gen, prompts, n=4, overrides=ov, out_dir=tmp_path)
    seen = [r.prompt_index for r in second.results]
    assert seen == [1]
    recs2 = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["prompt_index"] for r in recs2] == [0, 1, 2]
    assert recs2[1]["best"]["token_ids"] == recs[1]["best"]["token_ids"]  # same seed, same answer
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n_prompts"] == 3 and summary["complete"]  # the directory's results, this run's and the earlier
    spent = first.compute.gen_decode_tokens + second.compute.gen_decode_tokens  # both runs are charged
    assert summary["compute"]["gen_decode_tokens"] == spent > first.compute.gen_decode_tokens


def test_result_is_written_before_later_prompts_finish(tiny_gen, tmp_path):
    """The on-disk file holds prompt 0 by the time prompt 1 starts (hooks see the file already written)."""
    import rodeco
    from rodeco.plugins import get_plugin_manager

    lines_at_done = []

    class Spy:
        @rodeco.hookimpl
        def rodeco_prompt_done(self, result):
            lines_at_done.append(len((tmp_path / "results.jsonl").read_text().splitlines()))

    plugins = get_plugin_manager(extra=[Spy()])
    run_tiny(
        tiny_gen(),
        PROMPTS,
        n=2,
        overrides=["data.batch_prompts=1", "budget=unlimited", "sampling.max_new_tokens=8"],
        out_dir=tmp_path,
        plugins=plugins,
    )
    assert lines_at_done == [1, 2]


@pytest.mark.parametrize("kv", [0, -5])
def test_nonpositive_budget(kv):
    from rodeco.common.validation import ConfigError

    with pytest.raises(ConfigError, match="budget.kv_tokens"):
        Budget(kv_tokens=kv)


def test_budget_from_free_cuda_memory_when_kv_tokens_is_null(monkeypatch):
    """The CUDA path of make_budget, with the device query faked (no GPU in CI)."""
    from types import SimpleNamespace

    import torch

    import rodeco
    from rodeco.core.config import make_budget

    cfg = rodeco.load_config(["budget=cuda", "budget.reserve_gib=1", "budget.memory_fraction=0.5"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (9 * 2**30, 80 * 2**30))
    gen = SimpleNamespace(
        device=torch.device("cuda:0"),
        kv_bytes_per_token=1024,
        layer_devices=lambda: {"cuda:0": 24},
    )
    assert make_budget(cfg, gen).kv_tokens == int(8 * 2**30 * 0.5 // 1024)
    assert make_budget(cfg, gen, scale=0.5).kv_tokens == int(8 * 2**30 * 0.25 // 1024)  # OOM back-off's halving
    # generator.device_map=auto: 8 of 24 layers on cuda:0 (9 GiB free), 16 on cuda:1 (3 GiB free). A token's
    # keys and values cost cuda:1 two thirds of 1 KiB; the tighter device sets the budget.
    free = {0: 9 * 2**30, 1: 3 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[torch.device(device).index], 0))
    split = SimpleNamespace(
        device=torch.device("cuda:0"),
        kv_bytes_per_token=1024,
        layer_devices=lambda: {"cuda:0": 8, "cuda:1": 16},
    )
    per_token_1 = -(-1024 * 16 // 24)
    assert make_budget(cfg, split).kv_tokens == int(2 * 2**30 * 0.5 // per_token_1)
    cpu = SimpleNamespace(device=torch.device("cpu"), kv_bytes_per_token=1024)
    with pytest.raises(ConfigError, match="no device memory"):  # on CPU: nothing to read, and no silent unlimited
        make_budget(cfg, cpu)


def test_alpaca_eval_export(tiny_gen, tmp_path):
    out = run_tiny(
        tiny_gen(),
        PROMPTS,
        n=2,
        overrides=["budget=unlimited", "sampling.max_new_tokens=8", "output.alpaca_eval=rodeco-tiny"],
        out_dir=tmp_path,
    )
    rows = json.loads((tmp_path / "model_outputs.json").read_text())
    assert rows == [
        {"instruction": p, "output": r.best.text, "generator": "rodeco-tiny"} for p, r in zip(PROMPTS, out.results)
    ]


def test_full_length_tokens_by_hand():
    from rodeco.common.budget import Budget, KVSpec, full_length_tokens

    assert full_length_tokens(4, 50, 128, KVSpec(True, 1)) == 50 + 4 * 128  # the prompt stored once
    assert full_length_tokens(4, 50, 128, KVSpec(False, 1)) == 4 * (50 + 128)  # copied into every row
    for shared in (True, False):  # Best-of-4's memory holds 4 rows at full length in the loop's arithmetic, not 5
        B, base = Budget(full_length_tokens(4, 50, 128, KVSpec(shared, 1))).for_batch([50], KVSpec(shared, 1))
        assert B.max_rows(base + 128, base + 128) == 4
        B1, _ = Budget(full_length_tokens(4, 50, 128, KVSpec(shared, 1)) - 1).for_batch([50], KVSpec(shared, 1))
        assert B1.max_rows(base + 128, base + 128) == 3


def test_shards_are_disjoint_strided_and_keep_prompt_indices():
    from omegaconf import OmegaConf

    from rodeco.common.validation import ConfigError
    from rodeco.core.data import prompts_of

    base = {
        "path": None,
        "prompts": [f"prompt {i}" for i in range(10)],
        "field": "prompt",
        "offset": 0,
        "limit": None,
        "indices": None,
    }
    every = prompts_of(OmegaConf.create(base))
    shards = [prompts_of(OmegaConf.create({**base, "num_shards": 3, "shard": i})) for i in range(3)]
    assert [p.index for p in shards[1]] == [1, 4, 7]
    # with batches of 2 prompts, whole batches are dealt out: each shard decodes the unsharded run's batches
    paired = [prompts_of(OmegaConf.create({**base, "num_shards": 2, "shard": i, "batch_prompts": 2})) for i in (0, 1)]
    assert [[p.index for p in s] for s in paired] == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7]]
    assert sorted((p.index, p.text) for s in shards for p in s) == [(p.index, p.text) for p in every]
    for bad in ({"num_shards": 0}, {"num_shards": 3, "shard": 3}, {"num_shards": 2, "shard": -1}):
        with pytest.raises(ConfigError, match="data.num_shards|data.shard"):
            prompts_of(OmegaConf.create({**base, **bad}))
