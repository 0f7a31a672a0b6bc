"""rodeco-example: the hook implementations behind the ``example`` entry point of group ``rodeco``.

rodeco registers this module with its plugin manager; every ``@hookimpl`` below must match a hook in
``rodeco.common.hookspecs`` (a misspelled name is an error when the manager is built). The lifecycle hooks live on an
object instead (``observer.py``), registered through its own entry point ``example_observer``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rodeco import hookimpl
from rodeco_example.experiment import SweepArgs, sweep
from rodeco_example.policy import build_keep
from rodeco_example.reward import build_length

CONF_DIR = Path(__file__).parent / "conf"


@hookimpl
def rodeco_register_rewards(register: Callable[..., None]) -> None:
    register("example_length", build_length, "closeness of the response's word count to target_words")


@hookimpl
def rodeco_register_policies(register: Callable[..., None]) -> None:
    register("example_keep", build_keep, "keep the best `keep` rows of each prompt at every decision point")


@hookimpl
def rodeco_register_experiments(register: Callable[..., None]) -> None:
    register("example_sweep", sweep, "the configured prompts decoded once per alpha (policy=fixed)", args=SweepArgs)


@hookimpl
def rodeco_config_dirs() -> list[str]:
    return [str(CONF_DIR)]  # reward/example_length.yaml, policy/example_keep.yaml, experiment/example_sweep.yaml
