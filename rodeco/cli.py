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
    """Config dirs that plugins add (``rodeco_config_dirs``) go on Hydra's search path, after the user's own."""
    from rodeco.plugins import default_plugins

    dirs = default_plugins().config_dirs()
    if dirs:
        sys.argv[1:] = with_searchpath(sys.argv[1:], [f"file://{d}" for d in dirs])


def with_searchpath(args: list[str], paths: list[str]) -> list[str]:
    """``args`` with ``paths`` added to ``hydra.searchpath``.

    A ``hydra.searchpath=[...]`` the user gave keeps its entries first. Otherwise the override goes right before
    the user's first override: Hydra's argument parser takes overrides as one run of positional arguments, so an
    override after a flag (``rodeco n=3 --cfg job hydra.searchpath=...``) would be rejected.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def quote(p: str) -> str:
        return "'" + p.replace("\\", "\\\\").replace("'", "\\'") + "'"

    for i, a in enumerate(args):
        if a.startswith("hydra.searchpath="):
            given = OverridesParser.create().parse_override(a).value()
            given = list(given) if isinstance(given, list) else [str(given)]
            merged = [str(g) for g in given] + [p for p in paths if p not in given]
            return [*args[:i], "hydra.searchpath=[" + ",".join(map(quote, merged)) + "]", *args[i + 1:]]
    override = "hydra.searchpath=[" + ",".join(map(quote, paths)) + "]"
    first = next((i for i, a in enumerate(args) if not a.startswith("-") and ("=" in a or a.startswith("~"))),
                 0)
    return [*args[:first], override, *args[first:]]
