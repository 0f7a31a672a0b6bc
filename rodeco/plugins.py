"""Plugin manager, registries and the typed wrapper through which core code calls hooks.

Entry points of the ``rodeco`` group are loaded once per manager, when it is built (never at import time).
Environment switches for reproducible runs:

- ``RODECO_DISABLE_PLUGIN_AUTOLOAD=1``: load no entry points except the built-ins (``rewards``, ``policies``,
  ``experiments``, ``tasks``);
- ``RODECO_LOAD_PLUGINS=a,b``: load only these entry points (by entry-point name), plus the built-ins.

``BuildContext`` is what a reward or policy factory receives; ``Plugins.build_reward`` and ``build_policy`` turn a
config node into a plugin object.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, cast

import pluggy
from omegaconf import DictConfig, OmegaConf

from rodeco.common import hookspecs
from rodeco.common.params import check_params, is_schema
from rodeco.common.protocols import Policy, Reward, TaskSource
from rodeco.common.state import Compute, Counts, PromptResult, RoundView
from rodeco.common.validation import ConfigError
from rodeco.core.config import split_node

if TYPE_CHECKING:
    from rodeco.common.protocols import LanguageModel

log = logging.getLogger(__name__)

GROUP = "rodeco"
BUILTIN_ENTRY_POINTS = ("rewards", "policies", "experiments", "tasks")


@dataclass
class BuildContext:
    """Handed to plugin factories: what they may need to build themselves."""

    generator: LanguageModel | None = None  # the run's model, when one is loaded (its facts, tokenizer and cost)
    device: str = "cpu"
    plugins: Plugins | None = None  # the registries, for plugins built from other plugins (composite, custom)
    # what the run's scores come from: {"generator", "reward", "partial_reward"} (rodeco.core.calibration.identities);
    # empty when a plugin is built outside a run
    identities: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    name: str
    factory: Callable[..., Any]  # rewards and policies: factory(params, ctx); experiments: run(cfg, plugins, out_dir)
    description: str
    plugin: str
    args: type | None = None  # experiments: the dataclass schema of experiment_args
    params: type | None = None  # rewards and policies: the dataclass of their parameters (rodeco.common.params)


class Registry:
    """A name -> factory table filled by registration hooks."""

    def __init__(self, kind: str, key: str) -> None:
        self.kind, self.key = kind, key  # key: the config key that selects an entry, for error messages
        self._entries: dict[str, Entry] = {}

    def register(
        self,
        name: str,
        factory: Callable[..., Any],
        description: str = "",
        *,
        plugin: str = "",
        args: type | None = None,
        params: type | None = None,
    ) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r} (from plugin {plugin!r})")
        if name in self._entries:
            other = self._entries[name].plugin
            raise ValueError(f"{self.kind} {name!r} registered twice (by {other!r} and {plugin!r}); rename one")
        if params is not None and not is_schema(params):
            raise ValueError(
                f"{self.kind} {name!r}: params must be a dataclass, got {params!r} (from plugin {plugin!r})"
            )
        self._entries[name] = Entry(name, factory, description, plugin, args, params)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str, key: str | None = None) -> Entry:
        """The entry registered as ``name``; an unknown name is a ``ConfigError`` on ``key`` (default: the
        registry's own, e.g. ``reward.name``; ``partial_reward.name`` when the name came from there)."""
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                key or self.key,
                name,
                f"unknown {self.kind}; known: {', '.join(self.names()) or '(none)'}",
                f"use one of the known names, or install the plugin that provides {name!r}",
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def check_node(self, node: Any, key: str) -> None:
        """A config node (``{name: ..., <params>}`` at ``key``) against the params dataclass its plugin registered:
        unknown keys and values of the wrong type are ``ConfigError``s. Nothing to check for a plugin without one;
        a missing or unknown name is left for ``get`` to report when the plugin is built."""
        container = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
        if not isinstance(container, dict):
            return
        params: dict[Any, Any] = dict(container)  # the node's keys as given, strings or not
        name = params.pop("name", None)
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is not None and entry.params is not None:
            check_params(key, params, entry.params, name=name)


def _selected_entry_points() -> list[Any]:
    eps = list(entry_points(group=GROUP))
    only = [s.strip() for s in os.environ.get("RODECO_LOAD_PLUGINS", "").split(",") if s.strip()]
    if os.environ.get("RODECO_DISABLE_PLUGIN_AUTOLOAD", "").lower() in ("1", "true", "yes") and not only:
        return [ep for ep in eps if ep.name in BUILTIN_ENTRY_POINTS]
    if only:
        known = {ep.name for ep in eps}
        missing = [name for name in only if name not in known]
        if missing:
            raise ConfigError(
                "RODECO_LOAD_PLUGINS",
                ",".join(only),
                f"no installed entry point named {missing}",
                f"installed entry points of group {GROUP!r}: {sorted(known)}",
            )
        eps = [ep for ep in eps if ep.name in BUILTIN_ENTRY_POINTS or ep.name in only]
    builtin = [ep for ep in eps if ep.name in BUILTIN_ENTRY_POINTS]
    return builtin + [ep for ep in eps if ep.name not in BUILTIN_ENTRY_POINTS]  # the built-ins register first


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, with pytest's rule for names: a ``rodeco_``-prefixed function of a plugin is a hook
    implementation even without ``@hookimpl``, so a misspelled or undecorated one fails ``check_pending`` (or
    registration) instead of being ignored."""

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(GROUP + "_"):
            try:
                found = inspect.getattr_static(plugin, name)
            except AttributeError:
                return None
            if isinstance(found, (staticmethod, classmethod)) or inspect.isfunction(found):
                return {}  # default options: pluggy fills in the rest
        return opts

    def check_pending(self) -> None:
        try:
            super().check_pending()
        except pluggy.PluginValidationError as e:
            known = sorted(n for n in dir(hookspecs) if n.startswith(GROUP + "_"))
            raise pluggy.PluginValidationError(
                e.plugin,
                f"{e}. Fix: rename it to one of the hooks in rodeco.common.hookspecs ({', '.join(known)}); "
                f"see docs/plugins.md",
            ) from e


class Plugins:
    """The plugin manager, the registries it filled, and typed calls of the lifecycle hooks (it is the loop's
    ``rodeco.common.protocols.LoopHooks``: the loop fires ``round_end`` and ``prompt_done`` through it)."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self.rewards = Registry("reward", "reward.name")
        self.policies = Registry("policy", "policy.name")
        self.experiments = Registry("experiment", "experiment")
        self.sources = Registry("task source", "data.source")
        self._fill(self.pm.hook.rodeco_register_rewards, self.rewards)
        self._fill(self.pm.hook.rodeco_register_policies, self.policies)
        self._fill(self.pm.hook.rodeco_register_experiments, self.experiments)
        self._fill(self.pm.hook.rodeco_register_sources, self.sources)

    @staticmethod
    def _fill(hook: Any, registry: Registry) -> None:
        for impl in hook.get_hookimpls():  # in registration order
            plugin_name = impl.plugin_name

            def register(
                name: str, factory: Callable[..., Any], description: str = "", _p: str = plugin_name, **kw: Any
            ) -> None:
                registry.register(name, factory, description, plugin=_p, **kw)

            impl.function(register=register)

    def source(self, name: str) -> TaskSource:
        """The task source registered as ``name`` (``data.source``), built by its factory."""
        return cast("TaskSource", self.sources.get(name).factory())

    def config_dirs(self) -> list[str]:
        return [d for dirs in self.pm.hook.rodeco_config_dirs() for d in dirs]

    def experiment_schemas(self) -> list[tuple[str, type]]:
        """(name, dataclass) of every registered experiment that declares its ``experiment_args``."""
        return [(n, e.args) for n in self.experiments.names() if (e := self.experiments.get(n)).args is not None]

    def build(
        self, entry: Entry, params: dict[str, Any], ctx: BuildContext, identities: dict[str, str] | None = None
    ) -> Any:
        """The one builder: a registered reward or policy (``entry``), built by its factory from ``params`` with
        ``ctx`` (its ``plugins`` filled in; ``identities``, what the scores come from, put in it when given).
        ``rodeco.roles.RoleBuilder`` builds every role through it, the policy with the identities of its scorers;
        ``build_reward`` and ``build_policy`` are thin wrappers for one config node."""
        if identities is not None:
            ctx = replace(ctx, identities=dict(identities))
        if ctx.plugins is None:
            ctx.plugins = self
        return entry.factory(dict(params), ctx)

    def build_reward(self, node: Any, ctx: BuildContext, key: str = "reward") -> Reward:
        """The reward a config node (``{name: ..., <params>}``) describes."""
        name, params = split_node(node, key)
        return self.build(self.rewards.get(name, f"{key}.name"), params, ctx)

    def build_policy(
        self, node: Any, ctx: BuildContext, key: str = "policy", identities: dict[str, str] | None = None
    ) -> Policy:
        """The policy a config node describes; ``identities`` (``rodeco.core.calibration.identities``: what the scores
        it decides by come from) go into its ``BuildContext``, so that a policy tied to them (``calibrated``'s
        calibration file) checks them. Without them such a policy cannot check and says so."""
        name, params = split_node(node, key)
        return self.build(self.policies.get(name, f"{key}.name"), params, ctx, identities)

    # Lifecycle hooks: called at run/round/prompt boundaries only, always with keyword arguments.
    def run_start(self, config: dict[str, Any], n_prompts: int) -> None:
        self.pm.hook.rodeco_run_start(config=config, n_prompts=n_prompts)

    def round_end(self, view: RoundView, counts: list[Counts]) -> None:
        """A decision point's hook, given the policy's answer as counts (``rodeco.core.contracts.select_checked``)."""
        self.pm.hook.rodeco_round_end(view=view, kept=[c.kept for c in counts], counts=[list(c) for c in counts])

    def prompt_done(self, result: PromptResult) -> None:
        self.pm.hook.rodeco_prompt_done(result=result)

    def run_end(self, results: list[PromptResult], compute: Compute) -> None:
        self.pm.hook.rodeco_run_end(results=results, compute=compute)


def get_plugin_manager(load_entrypoints: bool = True, extra: list[Any] = ()) -> Plugins:  # type: ignore[assignment]
    """Build a fresh manager: hookspecs, entry points of group ``rodeco`` (filtered by the env switches), and
    ``extra`` plugin objects (modules or instances, handy in tests). A hook implementation whose name matches
    no spec (a typo) raises ``pluggy.PluginValidationError``."""
    pm = PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    if load_entrypoints:
        for ep in _selected_entry_points():
            if pm.get_plugin(ep.name) is None:
                log.debug("loading plugin %s from %s", ep.name, ep.value)
                pm.register(ep.load(), name=ep.name)
    for obj in extra:
        pm.register(obj)
    pm.check_pending()
    return Plugins(pm)


@lru_cache(maxsize=1)
def default_plugins() -> Plugins:
    """The process-wide manager with entry points loaded (built on first use, not on import)."""
    return get_plugin_manager()
