"""The ``rodeco`` command: a thin Hydra shell over ``rodeco.run.run``."""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rodeco.config import register_configs
from rodeco.errors import ConfigError, PluginError
from rodeco.report import summarize

log = logging.getLogger("rodeco")


def _main(cfg: DictConfig) -> None:
    from rodeco.run import run

    out_dir = cfg.output.dir if cfg.output.dir is not None else HydraConfig.get().runtime.output_dir
    try:
        out = run(cfg, out_dir=out_dir)
    except (ConfigError, PluginError) as e:
        print(f"rodeco: error: {e}", file=sys.stderr)
        sys.exit(2)
    if cfg.task == "decode":
        print(summarize(out, cfg))


def main() -> None:
    register_configs()
    _add_plugin_config_dirs()
    hydra.main(version_base=None, config_path="conf", config_name="config")(_main)()


def _add_plugin_config_dirs() -> None:
    """Config dirs that plugins add (``rodeco_config_dirs``) go on Hydra's search path."""
    from rodeco.plugins import default_plugins

    dirs = default_plugins().config_dirs()
    if dirs:
        sys.argv.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]")
