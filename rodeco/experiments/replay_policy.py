"""``rodeco experiment=replay pool=DIR policy=... budget...``: the run's policy replayed over a recorded pool by
the real loop, in seconds, in batches of ``data.batch_prompts`` prompts (the experiment's default: 1) as a live run
decodes them. Writes ``results.jsonl`` like a decode run (winners, round traces, compute charged as
if decoded live) and prints the totals. It is a run to the plugins, as a decode run is: ``rodeco_run_start``, the loop's
``rodeco_round_end`` and ``rodeco_prompt_done``, then ``rodeco_run_end``."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from omegaconf import DictConfig

from rodeco.common.budget import Budget, full_length_tokens
from rodeco.common.state import Compute, PromptResult, RunOutput
from rodeco.common.validation import ConfigError, node_dict
from rodeco.core.results import ResultsWriter
from rodeco.experiments.record import pool_roles, served
from rodeco.plugins import Plugins
from rodeco.replays.replay import open_pool, pool_served, replay_batch
from rodeco.roles import choose_roles
from rodeco.runner import loop_settings


def best_score(r: PromptResult) -> float:
    """The winner's final reward (the winner is a finished candidate: the reward scored it)."""
    if r.best.score is None:
        raise ValueError(f"prompt {r.prompt_index}: the winner has no final reward")
    return r.best.score


def run(cfg: DictConfig, plugins: Plugins, out_dir: Path | None) -> RunOutput:
    if cfg.pool is None:
        raise ConfigError("pool", None, "replay needs a recorded pool", "give pool=DIR (rodeco experiment=pool)")
    t0 = time.perf_counter()
    pool, gen = open_pool(cfg.pool)
    roles = pool_roles(cfg, plugins, pool, gen).roles(choose_roles(cfg, plugins, live=False))
    s = loop_settings(cfg, gen, roles.choices.policy.name, roles.choices.reward.name)
    best_of = cfg.experiment_args.best_of
    writer = ResultsWriter(out_dir, resume=False) if out_dir is not None else None
    results, total = [], Compute()
    indices, k = list(pool.indices()), cfg.data.batch_prompts
    plugins.run_start(config=node_dict(cfg), n_prompts=len(indices))

    def write(r: PromptResult) -> None:  # as it is final, before its hook fires
        if writer is not None:
            writer.write(r.to_dict())

    for batch in (indices[j : j + k] for j in range(0, len(indices), k)):  # as a live run batches its prompts
        if best_of is not None:  # per batch: the memory Best-of-n fills at full length, as the loop counts it
            lens = [len(pool.prompt(i).prompt_ids) for i in batch]
            kv = full_length_tokens(best_of, lens, s.max_new_tokens, gen.kv)
            s = dataclasses.replace(s, budget=Budget(kv, s.budget.min_tokens_per_round))
        res, comp, _ = replay_batch(
            pool, gen, roles.reward, roles.policy, batch, s, hooks=plugins, partial=roles.partial, on_done=write
        )
        results += res
        total.add(comp)
    for served_reward in pool_served(roles.reward, roles.partial):
        served_reward.save()
    plugins.run_end(results=results, compute=total)
    seconds = time.perf_counter() - t0
    mean = sum(best_score(r) for r in results) / max(1, len(results))
    computed = served(roles.reward.reward).computed
    print(
        f"replayed {roles.choices.policy.name} over {len(results)} prompts of {cfg.pool} in batches of {k}: mean "
        f"best reward {mean:.4f}, decode tokens {total.gen_decode_tokens}, {total.total_flops / 1e12:.3f} TFLOPs "
        f"charged, {computed} reward requests computed (the rest from the cache)"
    )
    print(f"replay_seconds: {seconds:.2f}")
    return RunOutput(results, total, out_dir, extra={"replay_seconds": seconds, "computed": computed})
