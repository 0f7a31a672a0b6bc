"""Composing the run config with Hydra, as the CLI and the Python API both do.

- The search path: rodeco's ``conf/`` (the package ``rodeco.conf``) and, through the ``SearchPathPlugin`` in
  ``rodeco.common.searchpath`` (which ``prepare`` registers and tells what to add), the config dirs plugins declare
  (``rodeco_config_dirs``).
- The ConfigStore: the run schema and every registered experiment's ``experiment_args`` schema.
- What the user typed wins over what a config group set: ``data.path`` and ``data.prompts`` are two ways to give
  prompts, so giving one replaces the other that the ``data`` option set (``data: demo`` sets ``prompts``).
- Composition errors become ``ConfigError``s that name the key, the valid keys and the likely intended one.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from rodeco.common.params import defaults_node
from rodeco.common.validation import ConfigError
from rodeco.core.config import register_configs, split_node
from rodeco.plugins import Plugins, default_plugins

CONFIG_MODULE = "rodeco.conf"
# Keys that give the same thing two ways: the one typed replaces what a config group set for the other(s).
ALTERNATIVES = {
    "data.path": ("data.prompts", "data.indices", "data.hf"),
    "data.prompts": ("data.path", "data.indices", "data.hf"),
    "data.hf": ("data.path", "data.prompts", "data.indices"),
}


def conf_dir() -> Path:
    """rodeco's own config directory (``conf/`` in a checkout, ``rodeco/conf`` in an installed wheel)."""
    from importlib.resources import files

    return Path(str(files(CONFIG_MODULE)))


def prepare(plugins: Plugins | None = None) -> Plugins:
    """Before composing: load the plugins, fill the ConfigStore, and make their config dirs the ones that go on
    Hydra's search path (``rodeco.common.searchpath``)."""
    from rodeco.common.searchpath import compose_with

    plugins = plugins or default_plugins()
    dirs = plugins.config_dirs()
    register_configs(plugins.experiment_schemas())
    register_param_defaults(plugins)
    register_partial_reward_options([conf_dir(), *map(Path, dirs)])
    register_judge_options([conf_dir(), *map(Path, dirs)])
    OmegaConf.register_new_resolver("rodeco_groups", lambda: help_groups(plugins), replace=True)  # --help
    compose_with(f"pkg://{CONFIG_MODULE}", dirs)
    return plugins


def register_partial_reward_options(dirs: list[Path]) -> None:
    """Every ``reward`` option can also decide: ``partial_reward=logprob`` selects ``reward/logprob.yaml`` into the
    ``partial_reward`` node (the group's own files, ``same`` and ``oracle``, come first)."""
    from hydra.core.config_store import ConfigStore

    own = {f.stem for d in dirs for f in (d / "partial_reward").glob("*.yaml")}
    for d in reversed(dirs):  # the first dir wins, as on the search path
        for f in sorted((d / "reward").glob("*.yaml")):
            if f.stem not in own:
                ConfigStore.instance().store(group="partial_reward", name=f.stem, node=OmegaConf.load(f))


def register_judge_options(dirs: list[Path]) -> None:
    """Every ``reward`` option can also judge, several at once: ``judge=chrf`` composes ``judge: {chrf: <the chrf
    option>}`` and ``judge=[chrf,ref_sim]`` both, each under its option name (``judge.chrf.<param>=...`` sets a
    parameter); ``judge=none`` (the default) none."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(group="judge", name="none", node={}, package="judge")
    for d in reversed(dirs):  # the first dir wins, as on the search path
        for f in sorted((d / "reward").glob("*.yaml")):
            cs.store(group="judge", name=f.stem, node=OmegaConf.load(f), package=f"judge.{f.stem}")


def register_param_defaults(plugins: Plugins) -> None:
    """``policy_params/<name>`` and ``reward_params/<name>`` in the ConfigStore: the name and parameter defaults of each
    plugin registered with a params dataclass, for its option file to extend instead of repeating them
    (``defaults: [/policy_params/fixed@_here_, _self_]``)."""
    from hydra.core.config_store import ConfigStore

    for group, registry in (("policy_params", plugins.policies), ("reward_params", plugins.rewards)):
        for name in registry.names():
            schema = registry.get(name).params
            if schema is not None:
                ConfigStore.instance().store(group=group, name=name, node=defaults_node(name, schema))


def check_plugin_params(cfg: DictConfig, plugins: Plugins) -> None:
    """The ``reward``, ``partial_reward`` and ``policy`` nodes against the params dataclasses their plugins registered,
    so that a misspelled or mistyped parameter fails now, not when the plugin is built after the model loads."""
    for key, registry in (
        ("reward", plugins.rewards),
        ("partial_reward", plugins.rewards),
        ("policy", plugins.policies),
    ):
        if key in cfg:
            registry.check_node(cfg[key], key)
    judge = cfg.get("judge")
    if isinstance(judge, DictConfig):
        for option, node in judge.items():
            plugins.rewards.check_node(node, f"judge.{option!s}")


def load_config(overrides: list[str] | None = None, plugins: Plugins | None = None) -> DictConfig:
    """The run config for these command-line style overrides (e.g. ``["policy=none", "n=8"]``)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    prepare(plugins)
    overrides = list(overrides or [])
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
    except HydraException as e:
        why = explain(e, overrides)
        if why is None:
            raise
        raise why from None
    prefer_typed(cfg, overrides)
    check_plugin_params(cfg, plugins or default_plugins())
    return cfg


def override_keys(overrides: list[str]) -> set[str]:
    """The config keys that these overrides set (``+data.path=x`` and ``data.path=x`` alike)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([o for o in overrides if "=" in o])
    return {o.key_or_group for o in parsed if not o.is_delete()}


def prefer_typed(cfg: DictConfig, overrides: list[str]) -> None:
    """Of two alternative keys, the one the user set replaces the other that a config group set."""
    keys = override_keys(overrides)
    for given, others in ALTERNATIVES.items():
        if given in keys and OmegaConf.select(cfg, given) is not None:
            for other in others:
                if other not in keys:
                    with open_dict(cfg):
                        OmegaConf.update(cfg, other, None)


def explain(e: Exception, overrides: list[str]) -> ConfigError | None:
    """A ``ConfigError`` for a composition error whose cause we can name: an unknown key (with the valid keys and
    the closest one), a value of the wrong type, or an unknown config option; None for anything else."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    cause = e.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:  # a key the node lacks
        full = str(cause.full_key)
        parent, _, leaf = full.rpartition(".")
        node = OmegaConf.select(cause.parent_node, "") if cause.parent_node is not None else None
        valid = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
        close = difflib.get_close_matches(leaf, valid, n=1)
        where = parent or "the top level"
        value = _value_of(full, overrides)
        problem = (
            f"unknown key; the keys of {where} are: {', '.join(valid)}"
            if valid
            else f"unknown key; {where} has no keys here"
        )
        fix = (
            f"did you mean {close[0]}? Use {_join(parent, close[0])}={_text(value)}"
            if close
            else f"use one of the keys of {where}, or +{full}=... to add a new key"
            if valid
            else f"remove it, or +{full}=... to add a new key"
        )
        return ConfigError(full, value, problem, fix)
    if isinstance(cause, (ValidationError, ConfigTypeError)) and cause.full_key:  # ConfigTypeError: a dict for a list
        assert cause.msg is not None  # omegaconf sets it with full_key
        return ConfigError(
            str(cause.full_key),
            _value_of(str(cause.full_key), overrides),
            cause.msg.split("\n")[0],
            "give a value of the type the key takes (rodeco --cfg job shows the config)",
        )
    if isinstance(e, MissingConfigException) and e.options and e.missing_cfg_file:
        group, _, missing = str(e.missing_cfg_file).rpartition("/")
        close = difflib.get_close_matches(missing, e.options, n=1)
        return ConfigError(
            group,
            missing,
            f"no such {group} option; options: {', '.join(sorted(e.options))}",
            f"did you mean {group}={close[0]}?"
            if close
            else "use one of the options, or install the plugin that provides it",
        )
    return None


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _value_of(key: str, overrides: list[str]) -> Any:
    """The value the override of ``key`` gives, as Hydra parses it (``0.3`` is a float)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in overrides:
        if "=" in o and o.lstrip("+~").partition("=")[0] == key:
            try:
                return OverridesParser.create().parse_override(o).value()
            except Exception:  # unparsable: show it as typed
                return o.partition("=")[2]
    return None


def _text(value: Any) -> str:
    return "..." if value is None else str(value)


def option_file(group: str, name: str, plugins: Plugins) -> Path | None:
    """The file of ``<group>=<name>``'s config option (rodeco's first, then the plugins'), or None."""
    for d in [conf_dir(), *map(Path, plugins.config_dirs())]:
        f = d / group / f"{name}.yaml"
        if f.is_file():
            return f
    return None


def option_node(group: str, option: str, plugins: Plugins) -> dict[str, Any]:
    """``<group>=<option>`` as a node: its file's registered ``name`` (an option may select another registered name
    with its own parameters: ``reward=minilm_prefix`` is ``minilm_rm`` with another head) and parameters; an option
    without a config file is the registered name ``option`` itself."""
    f = option_file(group, option, plugins)
    if f is None:
        return {"name": option}
    name, params = split_node(OmegaConf.load(f), group)
    params.pop("defaults", None)
    return {"name": name, **params}


HELP_GROUPS = ("generator", "reward", "partial_reward", "policy", "budget", "data", "experiment")  # judge: reward's


def help_groups(plugins: Plugins, width: int = 116) -> str:
    """The config groups and their options, one line each, for ``rodeco --help``: the registered description of
    the reward, policy or experiment an option selects under its own name, else (an option that is another
    registered name with parameters of its own, as ``reward=minilm_prefix`` is ``minilm_rm`` with another head, or
    an option of a group without a registry) the first sentence of the option file's comment."""
    dirs = [conf_dir(), *map(Path, plugins.config_dirs())]
    registries = {"reward": plugins.rewards, "policy": plugins.policies, "experiment": plugins.experiments}
    lines = []
    for group in HELP_GROUPS:
        files = {f.stem: f for d in reversed(dirs) for f in sorted((d / group).glob("*.yaml"))}  # first dir wins
        lines.append(f"  {group}:")
        for name in sorted(files):
            node = OmegaConf.load(files[name])
            assert isinstance(node, DictConfig)  # a config group's option is a mapping
            selects = node.get("task" if group == "experiment" else "name") if group in registries else None
            reg = registries.get(group)
            own = reg if reg is not None and selects == name and name in reg else None  # the registry describing it
            text = own.get(name).description if own is not None else _first_sentence(files[name])
            line = f"    {group}={name}".ljust(30) + " " + text
            lines.append(line if len(line) <= width else line[: width - 3] + "...")
    return "\n".join(lines)


def _first_sentence(path: Path) -> str:
    comment = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            comment.append(line.lstrip("# ").strip())
    text = " ".join(comment)
    return text.split(". ")[0].rstrip(".")
