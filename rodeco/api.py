"""The Python API: the same config and code path as the CLI, composed with Hydra's compose API.

``run(cfg)`` is what ``rodeco ...`` does apart from Hydra itself: a decode, or the experiment ``cfg.task`` names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, open_dict

from rodeco.compose import check_plugin_params, load_config
from rodeco.config import validate
from rodeco.plugins import Plugins, default_plugins
from rodeco.state import RunOutput

if TYPE_CHECKING:
    from rodeco.protocols import Generator

__all__ = ["decode", "load_config", "run"]


def run(cfg: DictConfig, plugins: Plugins | None = None, out_dir: str | Path | None = None) -> RunOutput:
    """Run what ``cfg.task`` names: ``decode``, ``merge`` (the shards of a multirun), or a registered experiment."""
    from rodeco.runner import run_decode

    plugins = plugins or default_plugins()
    validate(cfg)
    check_plugin_params(cfg, plugins)
    if cfg.task == "decode":
        return run_decode(cfg, plugins, out_dir)
    if cfg.task == "merge":
        from rodeco.merge import merge

        return merge(cfg, cfg.output.dir)
    entry = plugins.experiments.get(cfg.task)
    return entry.factory(cfg, plugins, Path(out_dir) if out_dir is not None else None)


def decode(prompts: list[str] | str, *, n: int | str | None = None, reward: str | None = None,
           policy: str | None = None, generator: str | Generator | None = None, overrides: list[str] | None = None,
           out_dir: str | Path | None = None, plugins: Plugins | None = None, **kw: Any) -> RunOutput:
    """Decode ``prompts`` and return a ``RunOutput`` (``.results``: one ``PromptResult`` per prompt).

    ``reward``/``policy`` pick config group options (``"logprob"``, ``"fixed"``, ...); ``generator`` is either a
    config option name or an already loaded generator (``rodeco.protocols.Generator``: a
    ``rodeco.generator.TorchGenerator``, vLLM's); ``overrides`` are Hydra overrides;
    keyword arguments set top-level keys (``seed=1``). With ``out_dir``, results are also written there.
    """
    from rodeco.runner import run_decode

    ov = list(overrides or [])
    ov += [f"reward={reward}"] if reward else []
    ov += [f"policy={policy}"] if policy else []
    ov += [f"generator={generator}"] if isinstance(generator, str) else []
    ov += [f"n={n}"] if n is not None else []
    plugins = plugins or default_plugins()
    cfg = load_config(ov, plugins)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts = None, [prompts] if isinstance(prompts, str) else list(prompts)
        cfg.output.progress = False
        for k, v in kw.items():
            cfg[k] = v
    validate(cfg)
    gen = generator if generator is not None and not isinstance(generator, str) else None
    return run_decode(cfg, plugins, out_dir, gen=gen)
