"""``example_sweep``: decode the configured prompts once per rejection rate in ``experiment_args.alphas`` (policy
``fixed``) and print, for each, the mean reward of the chosen responses and the decode tokens spent.

An experiment is a function ``run(cfg, plugins, out_dir) -> RunOutput``; this one builds a decode config per alpha
and hands it to ``rodeco.run``, the same entry the CLI uses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, open_dict

from rodeco import Compute, ConfigError, Plugins, PromptResult, RunOutput, check_number, required, run


@dataclass
class SweepArgs:
    """The schema of ``experiment_args`` (values in ``conf/experiment/example_sweep.yaml``)."""

    alphas: list[float] = required("rejection rates to try with policy=fixed")


def best_score(r: PromptResult) -> float:
    assert r.best.score is not None  # the winner is a finished candidate: the reward scored it
    return r.best.score


def sweep(cfg: DictConfig, plugins: Plugins, out_dir: Path | None) -> RunOutput:
    alphas = list(cfg.experiment_args.alphas)
    if not alphas:
        raise ConfigError("experiment_args.alphas", alphas, "no rejection rate to try", "e.g. [0.0, 0.5]")
    for a in alphas:
        check_number("experiment_args.alphas", a, 0.0, 1.0, hi_open=True, fix="rates in [0, 1), e.g. [0.0, 0.5]")
    rows, total = [], Compute()
    for alpha in alphas:
        c = copy.deepcopy(cfg)
        with open_dict(c):
            c.task, c.policy = "decode", {"name": "fixed", "alpha": float(alpha)}
            c.output.progress = False
        out = run(c, plugins)  # no out_dir: nothing written per alpha
        total.add(out.compute)
        mean = sum(best_score(r) for r in out.results) / len(out.results)
        rows.append({"alpha": float(alpha), "mean_best_reward": mean, "decode_tokens": out.compute.gen_decode_tokens})
        print(f"alpha {alpha:g}: mean best reward {mean:.4f}, decode tokens {out.compute.gen_decode_tokens}")
    return RunOutput([], total, out_dir, extra={"rows": rows})
