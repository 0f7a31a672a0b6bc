"""A plugin's parameters: the dataclass a reward or policy registers with its factory
(``register("fixed", build_fixed, "...", params=FixedParams)``), checked against the config node when the config
is composed (before any model loads) and read by the factory through ``take_params``, so that every default of a
parameter lives in that dataclass.

A field's type is what the check accepts: ``float`` (an int or a float, not a bool), ``int`` (not a bool),
``bool``, ``str``, ``Optional[...]``, ``Literal[...]``, ``list[...]``, ``dict[str, ...]`` and ``Any``. A field without
a default (``rodeco.required(help)``) must be given. A dataclass whose extra keys are the plugin's own business
(``reward=custom``'s parameters of the function it names) says so with ``open_keys: ClassVar[bool] = True``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeGuard, Union, cast, get_args, get_origin, get_type_hints

from rodeco.common.validation import ConfigError

MISSING_VALUE = "???"  # omegaconf's MISSING: the default of a ``rodeco.required`` field, a value still to be given


def is_schema(x: object) -> TypeGuard[type]:
    return isinstance(x, type) and dataclasses.is_dataclass(x)


def defaults_of(schema: type) -> dict[str, Any]:
    """Each field's default (``default_factory`` called); required fields are left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(schema):
        if f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        elif f.default is not dataclasses.MISSING and f.default != MISSING_VALUE:
            out[f.name] = f.default
    return out


def defaults_node(name: str, schema: type) -> dict[str, Any]:
    """A config node of plugin ``name`` with every parameter at its default (``???`` where it has none)."""
    defaults = defaults_of(schema)
    return {"name": name, **{f.name: defaults.get(f.name, MISSING_VALUE) for f in dataclasses.fields(schema)}}


def take_params(node: str, params: Mapping[str, Any], defaults: Mapping[str, Any] | type) -> dict[str, Any]:
    """``defaults`` updated by ``params``; an unknown key is an error naming ``node.key`` and the known keys.

    ``defaults`` is a dict, or the plugin's params dataclass: then its fields' defaults, and ``params`` is checked
    against it first (unknown keys, types, required fields), as the composed config was."""
    if is_schema(defaults):
        check_params(node, params, defaults, complete=True)
        return {**defaults_of(defaults), **params}
    defaults = cast("Mapping[str, Any]", defaults)  # not a params dataclass: the dict of defaults
    for key in sorted(set(params) - set(defaults)):
        raise _unknown(node, key, params[key], node, sorted(["name", *defaults]))
    return {**defaults, **params}


def check_params(node: str, params: Mapping[str, Any], schema: type, *, name: str = "", complete: bool = False) -> None:
    """``params`` (a config node without ``name``) against ``schema``: an unknown key gets the valid keys and the
    likely one, a value of the wrong type the type the key takes, both as a ``ConfigError`` naming ``node.key``.
    A ``???`` value is left for the plugin to report; with ``complete``, a required field must be there."""
    hints = get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    where = f"{node} ({name})" if name else node
    if not getattr(schema, "open_keys", False):
        for key in params:
            if key not in fields:
                raise _unknown(node, key, params[key], where, sorted(["name", *fields]))
    defaults = defaults_of(schema)
    for key in fields:
        if key not in params:
            if complete and key not in defaults:
                raise ConfigError(
                    f"{node}.{key}",
                    None,
                    f"missing; {where} needs it",
                    f"set {node}.{key}=... ({_describe(hints[key])})",
                )
            continue
        value = params[key]
        if not ((isinstance(value, str) and value == MISSING_VALUE) or fits(value, hints[key])):
            raise _wrong_type(f"{node}.{key}", value, hints[key], defaults.get(key))


def _wrong_type(key: str, value: Any, tp: Any, example: Any) -> ConfigError:
    choices = [
        a
        for t in (get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,))
        if get_origin(t) is Literal
        for a in get_args(t)
        if isinstance(a, str)
    ]
    close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
    problem = f"must be {_describe(tp)}" + ("" if choices and isinstance(value, str) else f", not {_kind(value)}")
    fix = (
        f"did you mean {close[0]}? Use {key}={close[0]}"
        if close
        else f"set {key}={_text(example)}, say"
        if isinstance(example, (bool, int, float, str))
        else f"give {_describe(tp)}"
    )
    return ConfigError(key, value, problem, fix)


def _unknown(node: str, key: str, value: Any, where: str, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1)
    fix = (
        f"did you mean {close[0]}? Use {node}.{close[0]}={_text(value)}"
        if close
        else f"remove it: {where} takes no parameters"
        if valid == ["name"]
        else f"use one of the keys of {where}"
    )
    return ConfigError(f"{node}.{key}", value, f"unknown key; the keys of {where} are: {', '.join(valid)}", fix)


def fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` (from a config: None, bool, int, float, str, list, dict) is of type ``tp``."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple) or tp in (list, tuple):
        return isinstance(value, (list, tuple)) and (not args or all(fits(v, args[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, Mapping) and (not args or all(fits(v, args[1]) for v in value.values()))
    return isinstance(value, origin or tp)


_NAMES = {int: "an integer", float: "a number", str: "a string", type(None): "null"}


def _describe(tp: Any) -> str:
    """``float | None`` -> "a number or null"; ``bool | Literal["auto"]`` -> "true, false or auto"."""
    words = _alternatives(tp)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _alternatives(tp: Any) -> list[str]:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return [w for a in args for w in _alternatives(a)]
    if origin is Literal:
        return [_text(a) for a in args]
    if tp is bool:
        return ["true", "false"]
    if tp is Any:
        return ["any value"]
    if origin in (list, tuple) or tp in (list, tuple):
        return [f"a list of {_plural(args[0])}" if args and args[0] is not Any else "a list"]
    if origin is dict or tp is dict:
        return ["a mapping"]
    return [_NAMES.get(tp, f"a {getattr(tp, '__name__', tp)}")]


def _plural(tp: Any) -> str:
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(tp, _describe(tp))


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        type(None): "null",
        list: "a list",
        tuple: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
