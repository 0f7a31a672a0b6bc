"""Custom value functions (``value_function``, ``reward=custom``): any Python callable becomes a reward under a name,
without writing a class.

In a plugin (a module or object with a ``rodeco_register_rewards`` hook implementation)::

    from rodeco import hookimpl
    from rodeco_rewards import value_function

    def brevity(prompt: str, response: str, partial: bool, scale: float = 100.0) -> float:
        return -len(response) / scale

    @hookimpl
    def rodeco_register_rewards(register):
        register("brevity", value_function(brevity, params={"scale": 100.0}), "shorter is better")

then ``rodeco reward=custom reward.function=brevity`` (``+reward.scale=50`` sets the parameter). A batched callable
takes the list of ``ScoreRequest``s and returns one float per request: ``value_function(fn, batched=True)``.
See docs/rewards.md for a runnable example.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rodeco import BuildContext, ConfigError, PluginError, Plugins, RewardCost, ScoreRequest, required, take_params


class FunctionReward:
    """Wraps a callable; the loop's ``Scorer`` checks its output (count, finiteness) like any reward's."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        needs_logprobs: bool = False,
        params: Mapping[str, Any] | None = None,
        name: str = "",
    ) -> None:
        self.fn, self.batched, self.params = fn, batched, dict(params or {})
        self.name = name or getattr(fn, "__name__", "value_function")
        self.needs_logprobs = needs_logprobs
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        if self.batched:
            out = self.fn(list(requests), **self.params)
            try:
                return list(out)
            except TypeError:
                raise PluginError(
                    f"value function {self.name!r} (batched) returned {type(out).__name__}, not a sequence of floats"
                ) from None
        return [self.fn(r.prompt, r.response, r.partial, **self.params) for r in requests]


def value_function(
    fn: Callable[..., Any],
    *,
    batched: bool = False,
    needs_logprobs: bool = False,
    params: Mapping[str, Any] | type | None = None,
) -> Callable[[dict[str, Any], BuildContext], FunctionReward]:
    """A reward factory for ``register(name, factory)`` made from a plain callable.

    ``fn(prompt, response, partial, **params) -> float``, or with ``batched=True``
    ``fn(requests, **params) -> list[float]``. ``params`` are the defaults of the keyword parameters a config may
    set (``reward.<param>``), a dict or the dataclass also registered as the reward's ``params``; an unknown key is a
    ``ConfigError`` naming it. ``needs_logprobs=True`` makes the loop
    fill ``ScoreRequest.logprobs`` (batched functions read them from the requests).
    """
    if not callable(fn):
        raise TypeError(f"value_function needs a callable, got {fn!r}")
    schema: type | None = None
    if params is None or isinstance(params, Mapping):
        defaults = dict(params or {})
    else:  # the reward's params dataclass
        schema, defaults = params, dataclasses.asdict(params())
    _check_signature(fn, batched, defaults)

    def factory(cfg_params: dict[str, Any], ctx: BuildContext) -> FunctionReward:
        return FunctionReward(
            fn,
            batched=batched,
            needs_logprobs=needs_logprobs,
            params=take_params("reward", cfg_params, schema or defaults),
        )

    factory.__doc__ = f"reward factory wrapping {getattr(fn, '__qualname__', fn)!r}"
    return factory


def _check_signature(fn: Callable[..., Any], batched: bool, params: Mapping[str, Any]) -> None:
    """Fail at registration (not mid-run) when the callable cannot take the arguments it will get."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: checked when called
    args: list[Any] = [[]] if batched else ["", "", False]
    try:
        sig.bind(*args, **params)
    except TypeError as e:
        shape = "fn(requests, **params)" if batched else "fn(prompt, response, partial, **params)"
        raise TypeError(
            f"value function {getattr(fn, '__qualname__', fn)!r} cannot be called as {shape} "
            f"with params {sorted(params)}: {e}"
        ) from None


@dataclass
class LengthParams:
    scale: float = 1.0  # characters per unit of score


def response_length(prompt: str, response: str, partial: bool, scale: float) -> float:
    """The built-in example value function, and the length-only baseline: characters of the response / scale
    (``scale``'s default: ``LengthParams``)."""
    return len(response) / scale


@dataclass
class CustomParams:
    """``reward=custom``: ``function`` names the reward; the other keys are that reward's parameters (checked when
    it is built)."""

    function: str = required("a registered reward or value function, e.g. length")
    open_keys: ClassVar[bool] = True


def registries(ctx: BuildContext, who: str) -> Plugins:
    """The plugin registries a reward built from other rewards looks them up in (``ctx.plugins``)."""
    if ctx.plugins is None:
        raise ValueError(
            f"{who} builds other rewards by name and needs BuildContext.plugins; build it with "
            "Plugins.build_reward (as runs do), or pass plugins=... in its BuildContext"
        )
    return ctx.plugins


def build_custom(params: dict[str, Any], ctx: BuildContext) -> Any:
    """``reward=custom reward.function=NAME``: the reward (or value function) registered as ``NAME``; the other
    keys of the node are its parameters."""
    params = dict(params)
    name = params.pop("function", None)
    plugins = registries(ctx, "custom")
    if not isinstance(name, str) or name not in plugins.rewards or name == "custom":
        raise ConfigError(
            "reward.function",
            name,
            "not a registered reward or value function",
            f"use one of {[n for n in plugins.rewards.names() if n != 'custom']}, or register yours "
            "in a plugin (docs/rewards.md)",
        )
    return plugins.rewards.get(name).factory(params, ctx)
