"""pluggy hook specifications. Every hook is prefixed ``rodeco_`` and documented in docs/plugins.md.

Registration hooks (``rodeco_register_*``, ``rodeco_config_dirs``) are called once, when the plugin manager is
built: rodeco calls each implementation itself, in the order the plugins were registered (the built-ins
``rewards``, ``policies`` and ``experiments`` first, then other entry points, then plugins passed in by code).
Lifecycle hooks are called by pluggy at run, decision-point and prompt boundaries, never inside the per-token
decode step: every implementation runs, the most recently registered first, and return values are ignored. The loop
(``rodeco.core.loop``) fires ``rodeco_round_end`` and ``rodeco_prompt_done`` wherever it runs with a plugin manager
(decode runs, ``Decoder.batch`` and ``Decoder.decode``, the server, replays); what runs it fires ``rodeco_run_start``
and ``rodeco_run_end`` (docs/plugins.md lists where).
No hook is ``firstresult``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from rodeco.common.state import Compute, PromptResult, RoundView

hookspec = pluggy.HookspecMarker("rodeco")
hookimpl = pluggy.HookimplMarker("rodeco")


@hookspec
def rodeco_register_rewards(register: Callable[..., None]) -> None:
    """Register reward factories: ``register(name, factory, description="", params=None)``.

    ``factory(params: dict, ctx: BuildContext) -> Reward``; ``params`` is the ``reward`` config node without
    ``name``. The ``params=`` dataclass, when given, is checked against the ``reward`` and ``partial_reward`` nodes
    when the config is composed (``rodeco.common.params``). A name registered twice (by any two plugins) is an error.
    """


@hookspec
def rodeco_register_policies(register: Callable[..., None]) -> None:
    """Register rejection-policy factories: ``register(name, factory, description="", params=None)``.

    ``factory(params: dict, ctx: BuildContext) -> Policy``. The ``params=`` dataclass, when given, is checked
    against the ``policy`` node when the config is composed (``rodeco.common.params``). A name registered twice is
    an error.
    """


@hookspec
def rodeco_register_experiments(register: Callable[..., None]) -> None:
    """Register experiments: ``register(name, run, description="", args=None)``.

    ``run(cfg: DictConfig, plugins: Plugins, out_dir: Path | None) -> RunOutput`` runs ``rodeco experiment=NAME``,
    whose config file (``experiment/NAME.yaml`` in a config dir) sets ``task: NAME``. ``args`` is the dataclass
    schema of its ``experiment_args``; rodeco stores it in Hydra's ConfigStore as ``experiment_args/NAME`` for the
    config file to extend, so a misspelled or mistyped argument fails when the config is composed. A name
    registered twice is an error.
    """


@hookspec
def rodeco_register_sources(register: Callable[..., None]) -> None:
    """Register task sources, generators of problems by name (``data.source``): ``register(name, factory,
    description="")``.

    ``factory() -> TaskSource`` (``rodeco.common.protocols.TaskSource``): it generates ``data.size`` problems of
    ``data.task`` from ``data.seed`` with ``data.task_config``, each a prompt and its record (the gold answer and
    what the task's checker reads), and checks an answer against a record (the ``gold`` judge asks it). A name
    registered twice is an error.
    """


@hookspec
def rodeco_config_dirs() -> list[str]:
    """Directories of Hydra config files (``reward/*.yaml``, ``policy/*.yaml``, ``experiment/*.yaml``, ...) that a
    plugin adds. The results of all implementations go on Hydra's search path, after rodeco's own ``conf/``."""
    raise NotImplementedError  # a specification: pluggy calls the plugins' implementations, never this body


@hookspec
def rodeco_run_start(config: dict[str, Any], n_prompts: int) -> None:
    """Called once before the first prompt is decoded: by a decode run (the CLI, ``rodeco.decode``,
    ``Decoder.decode``), each ``Decoder.batch`` call, ``rodeco experiment=replay``, and the server when it starts
    (``n_prompts`` 0: not known in advance). ``config`` is the resolved run config."""


@hookspec
def rodeco_round_end(view: RoundView, kept: list[list[int]], counts: list[list[int]]) -> None:
    """Called by the loop at each decision point, wherever it runs, with its ``RoundView``, the rows kept per prompt
    (local indices) and the policy's counts per prompt (one per row: 0 rejected, 1 kept, ``c > 1`` kept with
    ``c - 1`` copies), before they are applied."""


@hookspec
def rodeco_prompt_done(result: PromptResult) -> None:
    """Called by the loop with each ``PromptResult`` as soon as it is final, wherever it runs (after the caller took
    it: written to disk, answered)."""


@hookspec
def rodeco_run_end(results: list[PromptResult], compute: Compute) -> None:
    """Called once after the last prompt, with all ``PromptResult``s and the run's total ``Compute``, by what fired
    ``rodeco_run_start``; the server's, when it has stopped, has no results and its answered requests' compute."""
