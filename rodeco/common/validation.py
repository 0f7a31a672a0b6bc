"""Checking values from configs and plugins. Every error names the value, the config key that holds it, and the
fix; plugins raise the same errors for their own parameters (``policy.alpha``, ``reward.batch_tokens``)."""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A bad value in the configuration or input data."""

    def __init__(self, key: str, value: object, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}. Fix: {fix}")


class PluginError(RuntimeError):
    """A plugin broke its contract (wrong count, non-finite score, bad indices...)."""


def check_number(
    key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False, fix: str
) -> float:
    """``value`` as a float if it lies in the interval, else a ``ConfigError`` naming ``key`` and ``fix``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ConfigError(key, value, f"must be a number in {rng}", fix)
    return float(value)


def check_positive_int(key: str, value: object, example: int, allow_none: bool = False) -> None:
    """A positive integer (or null where ``allow_none``), e.g. a batch size or a token budget."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            key, value, "must be a positive integer" + (" or null" if allow_none else ""), f"set {key}={example}"
        )


def check_compile(value: object) -> str:
    """``generator.compile`` as ``auto``, ``true`` or ``false`` (a bool or any case of those words)."""
    v = str(value).lower() if isinstance(value, (bool, str)) else value
    if v not in ("auto", "true", "false"):
        raise ConfigError(
            "generator.compile", value, "not a compile setting", "use generator.compile=auto, true or false"
        )
    return v


class Interrupted(Exception):
    """A run stopped by a signal (SIGTERM from a scheduler, SIGINT from the keyboard) at a decision point or batch
    boundary; every prompt finished before is in its results file."""

    def __init__(self, signal_name: str, done: int, total: int, path: str | None) -> None:
        self.signal_name, self.done, self.total, self.path = signal_name, done, total, path
        where = f"; their results are in {path}" if path else ""
        super().__init__(f"stopped by {signal_name} after {done} of {total} prompts{where}")


def node_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """A config mapping node (a ``DictConfig``) as a plain dict: ``OmegaConf.to_container``, whose result is typed as
    any container, checked to be a mapping."""
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(out, dict):
        raise TypeError(f"expected a mapping config node, got {type(out).__name__}")
    return {str(k): v for k, v in out.items()}
