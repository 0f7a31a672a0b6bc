"""pluggy hook specifications. Every hook is prefixed ``rodeco_`` and documented in docs/plugins.md.

Registration hooks run once, when the plugin manager is built. Lifecycle hooks run at run/round/prompt
boundaries, never inside the per-token decode step. No hook is ``firstresult``: every implementation is called
(most recently registered first); lifecycle hooks' return values are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("rodeco")
hookimpl = pluggy.HookimplMarker("rodeco")


@hookspec
def rodeco_register_rewards(register: Callable[..., None]) -> None:
    """Register reward factories: ``register(name, factory, description="")``.

    ``factory(params: dict, ctx: BuildContext) -> Reward``; ``params`` is the ``reward`` config node without
    ``name``. Every implementation is called; a name registered twice is an error.
    """


@hookspec
def rodeco_register_policies(register: Callable[..., None]) -> None:
    """Register rejection-policy factories: ``register(name, factory, description="")``.

    ``factory(params: dict, ctx: BuildContext) -> Policy``. Every implementation is called.
    """


@hookspec
def rodeco_config_dirs() -> list[str]:
    """Directories of Hydra config files (``reward/*.yaml``, ``policy/*.yaml``, ...) that a plugin adds.

    Results of all implementations are concatenated and put on Hydra's search path by the CLI.
    """


@hookspec
def rodeco_run_start(config: dict[str, Any], n_prompts: int) -> None:
    """Called once before the first prompt is decoded. ``config`` is the resolved run config."""


@hookspec
def rodeco_round_end(view: Any, kept: list[list[int]]) -> None:
    """Called after each decision point with its ``RoundView`` and the rows kept per prompt (local indices)."""


@hookspec
def rodeco_prompt_done(result: Any) -> None:
    """Called with each ``PromptResult`` as soon as it is final (after it is written to disk)."""


@hookspec
def rodeco_run_end(results: list[Any], compute: Any) -> None:
    """Called once after the last prompt, with all ``PromptResult``s and the run's total ``Compute``."""
