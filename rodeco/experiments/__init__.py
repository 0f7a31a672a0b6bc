"""Experiments run as ``rodeco experiment=NAME``; each sets ``task`` to its name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from rodeco.errors import ConfigError

if TYPE_CHECKING:
    from rodeco.plugins import Plugins
    from rodeco.run import RunOutput

EXPERIMENTS = {
    "engine_bench": "rodeco.experiments.engine_bench",
    "rm_train": "rodeco.experiments.rm_train",
    "rm_eval": "rodeco.experiments.rm_eval",
    "rm_bench": "rodeco.experiments.rm_bench",
    "correlation": "rodeco.experiments.correlation",
}


def run_experiment(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    import importlib

    if cfg.task not in EXPERIMENTS:
        raise ConfigError("task", cfg.task, "unknown experiment", f"use one of {sorted(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[cfg.task]).run(cfg, plugins, out_dir)
