"""Errors that tell the user which value was wrong, which config key holds it, and how to fix it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad value in the configuration or input data."""

    def __init__(self, key: str, value: object, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}. Fix: {fix}")


class PluginError(RuntimeError):
    """A plugin broke its contract (wrong count, non-finite score, bad indices...)."""
