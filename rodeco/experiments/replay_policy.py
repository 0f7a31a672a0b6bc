"""``rodeco experiment=replay pool=DIR policy=... budget...``: the run's policy replayed over a recorded pool by
the real loop, in seconds. Writes ``results.jsonl`` like a decode run (winners, round traces, compute charged as
if decoded live) and prints the totals."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from omegaconf import DictConfig

from rodeco.budget import Budget, full_length_tokens
from rodeco.experiments.record import pool_roles
from rodeco.plugins import Plugins
from rodeco.replay import PoolReward, open_pool, replay_prompt
from rodeco.results import ResultsWriter
from rodeco.roles import choose_roles
from rodeco.runner import loop_settings
from rodeco.state import Compute, RunOutput
from rodeco.validation import ConfigError


def run(cfg: DictConfig, plugins: Plugins, out_dir: Path | None) -> RunOutput:
    if cfg.pool is None:
        raise ConfigError("pool", None, "replay needs a recorded pool", "give pool=DIR (rodeco experiment=pool)")
    t0 = time.perf_counter()
    pool, gen = open_pool(cfg.pool)
    roles = pool_roles(cfg, plugins, pool, gen).roles(choose_roles(cfg, plugins, live=False))
    reward, partial, policy = roles.reward.reward, roles.partial.reward if roles.partial else None, roles.policy
    s = dataclasses.replace(loop_settings(cfg, gen, roles.choices.policy.name, roles.choices.reward.name),
                            partial_name=roles.partial_name)
    best_of = cfg.experiment_args.best_of
    writer = ResultsWriter(out_dir, resume=False) if out_dir is not None else None
    results, total = [], Compute()
    for index in pool.indices():
        if best_of is not None:  # per prompt: the memory Best-of-n fills at full length
            p = pool.prompt(index)
            kv = full_length_tokens(best_of, len(p.prompt_ids), s.max_new_tokens, gen.shares_prefix)
            s = dataclasses.replace(s, budget=Budget(kv, s.budget.min_tokens_per_round))
        res, comp, _ = replay_prompt(pool, gen, reward, policy, index, s, on_round=plugins.round_end,
                                     partial=partial)
        results.append(res)
        total.add(comp)
        if writer is not None:
            writer.write(res.to_dict())
    reward.save()
    if isinstance(partial, PoolReward):
        partial.save()
    seconds = time.perf_counter() - t0
    mean = sum(r.best.score for r in results) / max(1, len(results))
    print(f"replayed {roles.choices.policy.name} over {len(results)} prompts of {cfg.pool}: mean best reward "
          f"{mean:.4f}, decode tokens {total.gen_decode_tokens}, {total.total_flops / 1e12:.3f} TFLOPs charged, "
          f"{reward.computed} reward requests computed (the rest from the cache)")
    print(f"replay_seconds: {seconds:.2f}")
    return RunOutput(results, total, out_dir, extra={"replay_seconds": seconds, "computed": reward.computed})
