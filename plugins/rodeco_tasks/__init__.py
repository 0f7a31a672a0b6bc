"""rodeco's built-in task sources, registered through the ``rodeco`` entry-point group like any third-party plugin:
``reasoning_gym`` (procedural reasoning tasks with gold answers and checkers, from the optional ``reasoning-gym``
package: ``pip install 'rodeco[tasks]'``), with its data option (``data=reasoning_gym``).

Nothing heavy is imported here: the package is imported when a run generates problems or checks an answer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rodeco import hookimpl

CONF_DIR = Path(__file__).parent / "conf"


@hookimpl
def rodeco_register_sources(register: Callable[..., None]) -> None:
    from rodeco_tasks.reasoning_gym import ReasoningGym

    register(
        "reasoning_gym",
        ReasoningGym,
        "reasoning-gym's procedural tasks (chain_sum, leg_counting, ...): problems with gold answers and checkers",
    )


@hookimpl
def rodeco_config_dirs() -> list[str]:
    return [str(CONF_DIR)]
