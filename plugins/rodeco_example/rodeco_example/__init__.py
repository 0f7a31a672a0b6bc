"""rodeco-example: the hook implementations behind the ``example`` entry point of group ``rodeco``.

rodeco registers this module with its plugin manager; every ``@hookimpl`` below must match a hook in
``rodeco.hookspecs`` (a misspelled name is an error when the manager is built).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rodeco import hookimpl
from rodeco_example.observer import RoundObserver
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
def rodeco_config_dirs() -> list[str]:
    return [str(CONF_DIR)]  # reward/example_length.yaml, policy/example_keep.yaml


_observer = RoundObserver()  # lifecycle hooks live on an object: it keeps per-run counts


@hookimpl
def rodeco_run_start(config, n_prompts: int) -> None:
    _observer.run_start(config, n_prompts)


@hookimpl
def rodeco_round_end(view, kept: list[list[int]]) -> None:
    _observer.round_end(view, kept)


@hookimpl
def rodeco_run_end(results, compute) -> None:
    _observer.run_end(results, compute)
