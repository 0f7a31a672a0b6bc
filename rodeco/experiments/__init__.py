"""Experiments run as ``rodeco experiment=NAME``; each sets ``task`` to its name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    "efficiency": "rodeco.experiments.efficiency",
    "perplexity": "rodeco.experiments.perplexity",
}


def run_experiment(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    import importlib

    if cfg.task not in EXPERIMENTS:
        raise ConfigError("task", cfg.task, "unknown experiment", f"use one of {sorted(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[cfg.task]).run(cfg, plugins, out_dir)


def option_params(group: str, name: str, plugins: Plugins) -> dict[str, Any]:
    """The parameters of ``<group>=<name>``'s config option (rodeco's or a plugin's), read directly so that
    Hydra's global state (the CLI's run) is left alone; ``{}`` for an option without a config file."""
    from omegaconf import OmegaConf

    from rodeco.run import split_node

    for d in [Path(__file__).resolve().parents[1] / "conf", *map(Path, plugins.config_dirs())]:
        f = d / group / f"{name}.yaml"
        if f.is_file():
            params = split_node(OmegaConf.load(f), group)[1]
            params.pop("defaults", None)
            return params
    return {}
