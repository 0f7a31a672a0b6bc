"""The Python API: the same config and code path as the CLI, composed with Hydra's compose API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict


def load_config(overrides: list[str] | None = None) -> DictConfig:
    """The resolved run config for these command-line style overrides (e.g. ``["policy=none", "n=8"]``)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from rodeco.cli import with_searchpath
    from rodeco.config import register_configs
    from rodeco.plugins import default_plugins

    register_configs()
    dirs = default_plugins().config_dirs()  # config options that plugins ship, as for the CLI
    overrides = with_searchpath(list(overrides or []), [f"file://{d}" for d in dirs]) if dirs else overrides
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="rodeco.conf", version_base=None):
        return compose(config_name="config", overrides=list(overrides or []))


def decode(prompts: list[str] | str, *, n: int | str | None = None, reward: str | None = None,
           policy: str | None = None, generator: Any = None, overrides: list[str] | None = None,
           out_dir: str | Path | None = None, plugins=None, **kw: Any):
    """Decode ``prompts`` and return a ``RunOutput`` (``.results``: one ``PromptResult`` per prompt).

    ``reward``/``policy`` pick config group options (``"logprob"``, ``"fixed"``, ...); ``generator`` is either a
    config option name or an already loaded ``rodeco.generator.Generator``; ``overrides`` are Hydra overrides;
    keyword arguments set top-level keys (``seed=1``). With ``out_dir``, results are also written there.
    """
    from rodeco.plugins import default_plugins
    from rodeco.run import run_decode, validate

    ov = list(overrides or [])
    ov += [f"reward={reward}"] if reward else []
    ov += [f"policy={policy}"] if policy else []
    ov += [f"generator={generator}"] if isinstance(generator, str) else []
    ov += [f"n={n}"] if n is not None else []
    cfg = load_config(ov)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts = None, [prompts] if isinstance(prompts, str) else list(prompts)
        cfg.output.progress = False
        for k, v in kw.items():
            cfg[k] = v
    validate(cfg)
    gen = generator if generator is not None and not isinstance(generator, str) else None
    return run_decode(cfg, plugins or default_plugins(), out_dir, gen=gen)
