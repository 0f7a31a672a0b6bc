"""``composite``: a weighted sum of named rewards, e.g. a reward model plus beta times the log-probability::

    reward:
      name: composite
      components:                 # key -> any reward config node (built through the same registry)
        rm: {name: minilm_rm}
        lp: {name: logprob, form: mean}
      weights: {rm: 1.0, lp: 0.1}  # a component without a weight gets 1.0
      standardize:                 # optional, per component: (score - mean) / std before weighting
        rm: auto                   #   auto: the component's own ``score_stats`` (the embedded RM has them)
        lp: {mean: -2.0, std: 0.5} #   or fixed constants

Standardization uses constants, never statistics of the current batch, so a request's score does not depend on
its batch neighbours (nor on how many candidates finished together).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from rodeco import BuildContext, ConfigError, Reward, RewardCost, Scorer, ScoreRequest, take_params
from rodeco_rewards.callable_reward import registries


@dataclass
class CompositeParams:
    """The keys are fixed; what they hold is open (component nodes are checked when each component is built)."""

    components: Optional[dict[str, Any]] = field(default=None, metadata={"help": "key -> a reward config node"})
    weights: Optional[dict[str, Any]] = field(default_factory=dict, metadata={"help": "key -> weight (default 1.0)"})
    standardize: Optional[dict[str, Any]] = field(
        default_factory=dict, metadata={"help": "key -> auto or {mean, std}: (score - mean) / std before weighting"}
    )


class CompositeReward:
    """``sum_k weight_k * (score_k - mean_k) / std_k`` over named component rewards."""

    def __init__(
        self,
        components: dict[str, Reward],
        weights: dict[str, float],
        stats: dict[str, tuple[float, float]] | None = None,
    ) -> None:
        self.components = components
        self.scorers = {k: Scorer(r, f"composite.{k}") for k, r in components.items()}  # checks count/finiteness
        self.weights = {k: float(weights.get(k, 1.0)) for k in components}
        self.stats = {k: (stats or {}).get(k, (0.0, 1.0)) for k in components}
        self.needs_logprobs = any(s.needs_logprobs for s in self.scorers.values())
        self.cost = RewardCost()

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        total = np.zeros(len(requests))
        for k, scorer in self.scorers.items():
            if self.weights[k] == 0.0:
                continue
            mean, std = self.stats[k]
            total += self.weights[k] * (scorer(requests) - mean) / std
        self._update_cost()
        return total.tolist()

    def _update_cost(self) -> None:
        costs = [s.cost() for s in self.scorers.values()]
        self.cost.tokens = sum(c.tokens for c in costs)
        self.cost.flops = sum(c.flops for c in costs)
        self.cost.calls += 1


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(key, value, "must be a finite number", f"set {key}=1.0, say")
    return float(value)


def _stats_of(key: str, spec: Any, reward: Reward) -> tuple[float, float]:
    if spec == "auto":
        stats = getattr(reward, "score_stats", None)
        if stats is None:
            raise ConfigError(
                key,
                spec,
                "this component declares no score_stats",
                f"give constants instead: {key}={{mean: 0.0, std: 1.0}}",
            )
        mean, std = stats
    elif isinstance(spec, dict) and set(spec) == {"mean", "std"}:
        mean, std = _number(f"{key}.mean", spec["mean"]), _number(f"{key}.std", spec["std"])
    else:
        raise ConfigError(key, spec, "must be auto or {mean: m, std: s}", f"e.g. {key}={{mean: 0.0, std: 1.0}}")
    if not std > 0:
        raise ConfigError(f"{key}.std", std, "must be > 0", "use the standard deviation of the component's scores")
    return float(mean), float(std)


def build_composite(params: dict[str, Any], ctx: BuildContext) -> CompositeReward:
    p = take_params("reward", params, CompositeParams)
    comps, weights, standardize = p["components"], p["weights"] or {}, p["standardize"] or {}
    if not isinstance(comps, dict) or not comps:
        raise ConfigError(
            "reward.components",
            comps,
            "needs at least one named component",
            "e.g. reward.components={rm: {name: minilm_rm}, lp: {name: logprob}}",
        )
    for what, table in (("weights", weights), ("standardize", standardize)):
        if not isinstance(table, dict):
            raise ConfigError(
                f"reward.{what}",
                table,
                "must be a mapping from component name",
                f"e.g. reward.{what}={{{next(iter(comps))}: ...}}",
            )
        extra = sorted(set(table) - set(comps))
        if extra:
            raise ConfigError(
                f"reward.{what}.{extra[0]}",
                table[extra[0]],
                "names no component",
                f"use one of the component names {sorted(comps)}",
            )
    plugins = registries(ctx, "composite")
    built: dict[str, Reward] = {}
    for k, node in comps.items():
        node = dict(node) if isinstance(node, dict) else {"name": node}  # `lp: logprob` is short for {name: ...}
        name = node.pop("name", None)
        if not isinstance(name, str) or name not in plugins.rewards:
            raise ConfigError(
                f"reward.components.{k}.name", name, "not a registered reward", f"use one of {plugins.rewards.names()}"
            )
        try:
            built[k] = plugins.rewards.get(name).factory(node, ctx)
        except ConfigError as e:  # the component speaks of reward.*: say which component
            key = e.key.replace("reward.", f"reward.components.{k}.", 1) if e.key.startswith("reward.") else e.key
            raise ConfigError(key, e.value, e.problem, e.fix) from e
    w = {k: _number(f"reward.weights.{k}", v) for k, v in weights.items()}
    stats = {k: _stats_of(f"reward.standardize.{k}", v, built[k]) for k, v in standardize.items()}
    return CompositeReward(built, w, stats)
