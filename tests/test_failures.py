"""Failures mid-run lose nothing: out-of-memory errors are backed off from (injected with an engine
wrapper), and a reward or policy that raises names itself, its prompts and the batch."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_tiny

import rodeco
from rodeco import hookimpl
from rodeco.common.validation import ConfigError, PluginError


class FaultyEngine:
    """Fault injection: an engine that raises CUDA's out-of-memory error when a forward pass has more than
    ``max_rows`` rows, as a GPU would for a batch that does not fit."""

    def __init__(self, inner, max_rows: int, log: list[int]) -> None:
        self.inner, self.max_rows, self.log = inner, max_rows, log

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in ("inner", "max_rows", "log"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def _check(self, rows: int) -> None:
        self.log.append(rows)
        if rows > self.max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {rows} rows > {self.max_rows})")

    def admit(self, ids, mask):
        self._check(ids.shape[0])
        return self.inner.admit(ids, mask)

    def step(self, tokens):
        self._check(tokens.shape[0])
        return self.inner.step(tokens)


def faulty(gen, max_rows: int) -> list[int]:
    seen: list[int] = []
    new_engine = gen.new_engine
    gen.new_engine = lambda pool_tokens=None: FaultyEngine(new_engine(pool_tokens), max_rows, seen)
    return seen


PROMPTS6 = [f"w{i} w{i + 1}" for i in range(6)]


def test_oom_back_off_halves_the_batch_and_gets_the_same_results(tiny_gen, tmp_path, caplog):
    ov = ["budget.kv_tokens=400", "sampling.max_new_tokens=16", "data.batch_prompts=4"]
    ref = run_tiny(tiny_gen(), PROMPTS6, n=4, overrides=[*ov, "data.batch_prompts=2"])  # what the back-off runs
    gen = tiny_gen()
    seen = faulty(gen, max_rows=8)  # 4 prompts x 4 rows do not fit, 2 x 4 do
    with caplog.at_level("WARNING"):
        out = run_tiny(gen, PROMPTS6, n=4, overrides=ov, out_dir=tmp_path)
    assert max(seen) > 8 and "retrying it with data.batch_prompts -> 2" in caplog.text
    assert [r.best.token_ids for r in out.results] == [r.best.token_ids for r in ref.results]
    assert [r.best.score for r in out.results] == [r.best.score for r in ref.results]
    assert sorted(json.loads(x)["prompt_index"] for x in (tmp_path / "results.jsonl").read_text().splitlines()) == list(
        range(6)
    )
    # Best-of-N does not depend on the batches at all: same winners as an unfaulted run at the full batch
    bon = ["budget=unlimited", "sampling.max_new_tokens=16", "data.batch_prompts=4"]
    gen = tiny_gen()
    faulty(gen, max_rows=4)
    a = run_tiny(gen, PROMPTS6, n=4, policy="none", overrides=bon)
    b = run_tiny(tiny_gen(), PROMPTS6, n=4, policy="none", overrides=bon)
    assert [r.best.token_ids for r in a.results] == [r.best.token_ids for r in b.results]


def test_oom_at_the_minimum_names_the_keys_to_change(tiny_gen, caplog):
    gen = tiny_gen()
    faulty(gen, max_rows=0)  # nothing fits
    with caplog.at_level("WARNING"), pytest.raises(ConfigError) as e:
        run_tiny(
            gen,
            PROMPTS6[:2],
            n=4,
            overrides=["budget.kv_tokens=4096", "sampling.max_new_tokens=8", "data.batch_prompts=2"],
        )
    msg = str(e.value)
    assert "data.batch_prompts" in msg and "budget.kv_tokens" in msg and "Fix:" in msg
    assert "budget.kv_tokens x 0.125" in caplog.text  # the budget was halved three times first
    caplog.clear()
    with caplog.at_level("WARNING"), pytest.raises(ConfigError) as e:  # no budget to halve: say how to give one
        run_tiny(
            gen, PROMPTS6[:2], n=4, overrides=["budget=unlimited", "sampling.max_new_tokens=8", "data.batch_prompts=2"]
        )
    assert "budget=unlimited" in e.value.problem and "budget=cuda" in e.value.fix
    assert "data.batch_prompts -> 1" in caplog.text and " x 0.5" not in caplog.text


def test_a_failing_reward_loses_nothing_and_names_the_plugin_prompt_and_batch(tiny_gen, tmp_path):
    from rodeco.plugins import get_plugin_manager
    from rodeco_rewards import value_function

    def boom(reqs):
        if any(r.prompt_index == 3 for r in reqs):
            raise ValueError("the reward server went away")
        return [float(len(r.response)) for r in reqs]

    class Flaky:
        @hookimpl
        def rodeco_register_rewards(self, register):
            register("boom", value_function(boom, batched=True))

    with pytest.raises(PluginError) as e:
        rodeco.decode(
            PROMPTS6,
            generator=tiny_gen(),
            n=2,
            policy="none",
            plugins=get_plugin_manager(extra=[Flaky()]),
            overrides=[
                "reward=custom",
                "reward.function=boom",
                "budget=unlimited",
                "sampling.max_new_tokens=6",
                "data.batch_prompts=2",
            ],
            out_dir=tmp_path,
        )
    msg = str(e.value)
    assert "reward 'custom'" in msg and "ValueError: the reward server went away" in msg
    assert "prompt(s) [2, 3]" in msg and "batch 2 of 3" in msg and "2 prompt(s) finished before are kept" in msg
    kept = [json.loads(x)["prompt_index"] for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert kept == [0, 1]


def test_a_failing_policy_names_itself_and_the_prompts(tiny_gen):
    from rodeco.plugins import get_plugin_manager

    class Broken:
        def select(self, view):
            raise KeyError("no such row")

    class Plugin:
        @hookimpl
        def rodeco_register_policies(self, register):
            register("broken", lambda params, ctx: Broken())

    with pytest.raises(PluginError, match=r"policy 'broken' raised KeyError.*prompt\(s\) \[0\].*batch 1 of 1"):
        run_tiny(
            tiny_gen(),
            PROMPTS6[:1],
            n=4,
            policy="fixed",
            plugins=get_plugin_manager(extra=[Plugin()]),
            overrides=["policy.name=broken", "budget.kv_tokens=40", "sampling.max_new_tokens=16"],
        )
