r"""The roles of a decode, chosen and built from their config nodes in one place: the ``reward`` that picks the
winner among finished candidates, the ``partial_reward`` that scores active rows at decision points (``same``: the
reward itself; ``oracle``: a pool's final rewards), the ``policy`` that rejects, and the ``judge``\ s that score the
winners after the decode, which none of the others sees.

Two steps, so that a misspelled name fails before any model is loaded:

- ``choose_roles(cfg, plugins)`` splits each node once and looks its name up once (``Choices``);
- ``RoleBuilder(plugins, ctx).roles(choices)`` builds them (``Roles``): the scorers, then the policy with the
  identities of what the scores come from (a calibration file is tied to them). A builder serves rewards live, or
  from a recorded pool's cache (``pool=``), and builds each distinct reward node once, so an experiment that
  replays many policies with many partial rewards shares their caches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from rodeco.common.protocols import Policy, Reward
from rodeco.common.state import GOLD
from rodeco.common.validation import ConfigError
from rodeco.core.calibration import identities
from rodeco.core.config import split_node
from rodeco.core.contracts import Scorer, identity_of
from rodeco.core.judging import Judge, Judges
from rodeco.plugins import BuildContext, Entry, Plugins
from rodeco.replays.pool import reward_key
from rodeco.replays.pool_rewards import OracleReward, PoolReward

if TYPE_CHECKING:
    from rodeco.replays.pool import Pool

SAME, ORACLE = "same", "oracle"  # partial_reward options that are not rewards of their own


@dataclass(frozen=True)
class Choice:
    """One role's config node, split (``name``, ``params``) under its config ``key``, with the registry entry that
    builds it (None for ``same`` and ``oracle``)."""

    key: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    entry: Entry | None = field(default=None, compare=False, repr=False)

    @property
    def node(self) -> dict[str, Any]:
        return {**self.params, "name": self.name}

    def cache_key(self) -> str:
        return json.dumps(self.node, sort_keys=True, default=str)


@dataclass(frozen=True)
class Choices:
    reward: Choice
    partial: Choice  # name SAME: the reward scores partial responses too
    policy: Choice
    judges: tuple[Choice, ...] = ()  # each under ``judge.<option>``; scored after the decode, never seen by it

    def with_(self, plugins: Plugins, partial: Any = None, policy: Any = None) -> Choices:
        """These choices with another ``partial_reward`` and/or ``policy`` node (checked like the run's own)."""
        out = self
        if partial is not None:
            out = replace(out, partial=_choose_partial(partial, plugins, live=False))
        if policy is not None:
            out = replace(out, policy=choose(policy, "policy", plugins))
        return out


def choose(node: Any, key: str, plugins: Plugins) -> Choice:
    """One node (``reward``, ``partial_reward`` or ``policy`` style: ``{name: ..., <params>}``) split under ``key``
    and looked up in its registry."""
    name, params = split_node(node, key)
    registry = plugins.policies if key == "policy" else plugins.rewards
    return Choice(key, name, params, registry.get(name, f"{key}.name"))


def _choose_partial(node: Any, plugins: Plugins, live: bool) -> Choice:
    name, params = split_node(node, "partial_reward")
    if name == ORACLE and live:
        raise ConfigError(
            "partial_reward",
            ORACLE,
            "the oracle scores a partial response with its final reward, which only a recorded pool knows",
            "use it when replaying a pool: rodeco "
            "experiment=replay pool=DIR partial_reward=oracle (or experiment=efficiency)",
        )
    if name in (SAME, ORACLE):
        return Choice("partial_reward", name, params)
    return Choice("partial_reward", name, params, plugins.rewards.get(name, "partial_reward.name"))


def choose_roles(cfg: Any, plugins: Plugins, live: bool = True) -> Choices:
    """The run's nodes (``cfg.reward``, ``cfg.partial_reward``, ``cfg.policy`` and the ``cfg.judge`` options), each
    split and looked up once: an unknown name is a ``ConfigError`` here, before any model is loaded. ``live``: the
    oracle, which only a pool knows, is refused."""
    reward, partial = choose(cfg.reward, "reward", plugins), _choose_partial(cfg.partial_reward, plugins, live)
    return Choices(
        reward,
        partial,
        choose(cfg.policy, "policy", plugins),
        choose_judges(cfg.get("judge"), plugins, (reward, partial)),
    )


def choose_judges(node: Any, plugins: Plugins, guides: tuple[Choice, ...] = ()) -> tuple[Choice, ...]:
    """The ``judge`` node (``{option: reward node}``, what ``judge=chrf`` or ``judge=[chrf,ref_sim]`` composes) as
    choices keyed ``judge.<option>``. A judge whose resolved config is a guide's (the ``reward`` or the
    ``partial_reward`` that steers the decode) is refused: it would measure what the search optimised."""
    if node is None:
        return ()
    items = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(items, dict) or not all(isinstance(v, dict) for v in items.values()):
        raise ConfigError(
            "judge",
            items,
            "must be options of the judge group, each a reward node",
            "judge=chrf, judge=[chrf,ref_sim] or judge=none; any reward option can judge",
        )
    out = []
    for option, sub in items.items():
        c = choose(sub, f"judge.{option!s}", plugins)
        for g in guides:
            if g.entry is not None and g.node == c.node:
                raise ConfigError(
                    f"judge.{option!s}",
                    c.node,
                    f"it is the {g.key} that guides the decode: a judge must be something the search did not optimise",
                    "judge by another reward (judge=smollm_judge, judge=chrf), or drop it: judge=none",
                )
        out.append(c)
    return tuple(out)


@dataclass
class Roles:
    reward: Scorer
    partial: Scorer | None  # None: partial_reward=same (the reward decides too)
    policy: Policy
    identities: dict[str, str]  # what the scores come from (``BuildContext.identities``)
    choices: Choices
    judges: Judges = field(default_factory=Judges)  # the runner calls them after the decode; the loop never sees them

    @property
    def partial_name(self) -> str:
        return self.choices.partial.name

    def check_records(self, prompts: Sequence[Any]) -> None:
        """Every prompt's record holds the fields each role's reward and each judge needs (``needs_meta``: the
        ``gold`` judge needs a ``gold_answer``): else a ``ConfigError`` naming the role and the first such prompt,
        before anything is decoded. ``prompts`` have ``index``, ``text`` and ``meta``."""
        scorers = [("reward", self.reward)] + ([("partial_reward", self.partial)] if self.partial is not None else [])
        scorers += [(f"judge.{j.name}", j.scorer) for j in self.judges.judges]
        for key, sc in scorers:
            for name in sc.needs_meta:
                bad = [p for p in prompts if p.meta.get(name) is None]
                if bad:
                    shown = " ".join(bad[0].text.split())[:60]
                    what = "gold answer" if name == GOLD else f"{name!r} field"
                    raise ConfigError(
                        key,
                        sc.name,
                        f"{len(bad)} of {len(prompts)} prompts have no {what} (the first: prompt {bad[0].index}, "
                        f"{shown!r}); {sc.name} scores against it",
                        "decode a task whose records carry it (data=reasoning_gym, or a JSONL file with a "
                        f"{name} field beside the prompt), or drop {key}",
                    )


def pool_served(plugins: Plugins, pool: Pool, node: Any, key: str = "reward") -> PoolReward:
    """The reward ``node`` names, built and served from (and filling) ``pool``'s score cache: what an experiment
    that reads a pool scores with outside a decode (correlation, learned heads' training)."""
    served = RoleBuilder(plugins, str(pool.settings["generator"].get("model", "")), pool=pool).reward(
        choose(node, key, plugins)
    )
    assert isinstance(served, PoolReward)  # a builder with a pool serves each reward from its cache
    return served


class RoleBuilder:
    """Builds ``Roles`` for one generator, serving rewards live or from a pool's cache; each distinct reward node
    is built once per builder."""

    def __init__(
        self, plugins: Plugins, generator_name: str, ctx: BuildContext | None = None, pool: Pool | None = None
    ) -> None:
        self.plugins, self.generator_name, self.pool = plugins, generator_name, pool
        self.ctx = ctx or BuildContext(plugins=plugins)
        self._built: dict[tuple[str, str], Reward] = {}

    def reward(self, choice: Choice) -> Reward:
        """The reward ``choice`` names, built once (from a pool: a ``PoolReward`` serving the pool's cache)."""
        k = (choice.key, choice.cache_key())
        if k not in self._built:
            assert choice.entry is not None  # a reward's choice (only same and oracle have no entry)
            built = self.plugins.build(choice.entry, choice.params, self._ctx())
            if self.pool is not None:
                built = PoolReward(self.pool, built, reward_key(choice.node, identity_of(built)))
            self._built[k] = built
        return self._built[k]

    def partial(self, choices: Choices) -> Reward | None:
        name = choices.partial.name
        if name == SAME:
            return None
        if name == ORACLE:
            final = self.reward(choices.reward)
            if not isinstance(final, PoolReward):
                raise ConfigError(
                    "partial_reward",
                    ORACLE,
                    "the oracle needs a recorded pool's final rewards",
                    "replay a pool: rodeco experiment=replay pool=DIR partial_reward=oracle",
                )
            k = ("oracle", choices.reward.cache_key())
            if k not in self._built:
                self._built[k] = OracleReward(final)
            return self._built[k]
        return self.reward(choices.partial)

    def scorers(self, choices: Choices) -> tuple[Scorer, Scorer | None, dict[str, str]]:
        """The ``reward`` and ``partial_reward`` scorers (``None`` for ``same``), and the identities of what their
        scores come from."""
        reward = Scorer(self.reward(choices.reward), choices.reward.name)
        built = self.partial(choices)
        partial = Scorer(built, choices.partial.name, "partial_reward") if built is not None else None
        ids = identities(self.generator_name, _ident(reward), _ident(partial) if partial is not None else None)
        return reward, partial, ids

    def roles(self, choices: Choices) -> Roles:
        """The scorers, then the policy, built with the identities of what the scores come from."""
        reward, partial, ids = self.scorers(choices)
        assert choices.policy.entry is not None  # set by ``choose``
        policy = self.plugins.build(choices.policy.entry, choices.policy.params, self._ctx(), identities=ids)
        return Roles(reward, partial, policy, ids, choices, self.judges(choices.judges))

    def judges(self, choices: tuple[Choice, ...]) -> Judges:
        """The judges, built once like the other rewards (from a pool: served from and filling its cache). They
        read the response's text and token ids only: a reward that needs the decode's log-probs (the sampled
        tokens' or the top-k) or hidden states, which results do not keep, is refused."""
        out = []
        for c in choices:
            option = c.key.partition(".")[2]
            scorer = Scorer(self.reward(c), option, "judge")
            if scorer.needs_logprobs or scorer.needs_top_logprobs or scorer.needs_hidden_states:
                what = "log-probs" if scorer.needs_logprobs or scorer.needs_top_logprobs else "hidden states"
                raise ConfigError(
                    c.key,
                    c.name,
                    f"it reads the generator's {what} from the decode, which a judge, "
                    "scoring written results, does not have",
                    "judge with a reward that scores the "
                    "text (logprob with judge.<option>.model=smollm2 scores it under a model of its "
                    "own)",
                )
            out.append(Judge(option, scorer, c.node))
        return Judges(out)

    def _ctx(self) -> BuildContext:
        if self.ctx.plugins is None:
            self.ctx.plugins = self.plugins
        return self.ctx


def _ident(x: Scorer) -> tuple[str, str | None]:
    return x.name, x.identity
