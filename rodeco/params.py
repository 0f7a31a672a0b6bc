"""Reading plugin parameters from a config node, with errors that name the key."""

from __future__ import annotations

from typing import Any

from rodeco.errors import ConfigError


def take_params(node: str, params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` updated by ``params``; an unknown key is an error naming ``node.key`` and the known keys."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ConfigError(f"{node}.{unknown[0]}", params[unknown[0]], "unknown parameter",
                          f"remove it; known parameters of this {node}: {sorted(defaults)}")
    return {**defaults, **params}
