"""rodeco.roles: each role's node is split and looked up once, each reward built once, by one function for live
runs and pool replays alike."""

from __future__ import annotations

import pytest
from helpers import run_tiny

import rodeco
from rodeco.common.validation import ConfigError
from rodeco.plugins import Registry, default_plugins
from rodeco.roles import ORACLE, SAME, RoleBuilder, choose_roles


def test_a_live_run_looks_up_and_builds_each_role_once(tiny_gen, monkeypatch):
    import rodeco.runner as runner

    looked_up: list[tuple[str, str]] = []
    built: list[str] = []
    get = Registry.get

    def counting_get(self, name, key=None):
        entry = get(self, name, key)
        if inside:
            looked_up.append((self.kind, name))

            class Counted:  # the entry, with its factory counted
                def __getattr__(_, attr):
                    return getattr(entry, attr)

                def factory(_, params, ctx):
                    built.append(f"{self.kind}:{name}")
                    return entry.factory(params, ctx)

            return Counted()
        return entry

    inside = False
    run_decode = runner.run_decode

    def spy(*a, **kw):
        nonlocal inside
        inside = True
        try:
            return run_decode(*a, **kw)
        finally:
            inside = False

    monkeypatch.setattr(Registry, "get", counting_get)
    monkeypatch.setattr(runner, "run_decode", spy)
    out = run_tiny(
        tiny_gen(),
        ["write a haiku"],
        n=4,
        overrides=["sampling.max_new_tokens=8", "budget=unlimited", "partial_reward=logprob"],
    )
    assert out.results[0].best.text is not None
    assert sorted(looked_up) == [("policy", "fixed"), ("reward", "logprob"), ("reward", "logprob")]  # reward, partial
    assert sorted(built) == ["policy:fixed", "reward:logprob", "reward:logprob"]


def test_an_unknown_name_fails_when_chosen_before_any_model_loads():
    plugins = default_plugins()
    base = rodeco.load_config()
    with pytest.raises(ConfigError) as e:
        choose_roles(base, plugins).with_(plugins, policy={"name": "fixd"})
    assert e.value.key == "policy.name" and "fixed" in e.value.problem
    with pytest.raises(ConfigError) as e:
        choose_roles(base, plugins).with_(plugins, partial={"name": "logprb"})
    assert e.value.key == "partial_reward.name"


def test_a_live_run_refuses_the_oracle():
    cfg = rodeco.load_config(["partial_reward=oracle"])
    with pytest.raises(ConfigError) as e:
        choose_roles(cfg, default_plugins())
    assert e.value.key == "partial_reward" and "pool" in e.value.fix
    assert choose_roles(cfg, default_plugins(), live=False).partial.name == ORACLE


def test_a_builder_builds_each_reward_node_once_and_shares_it(tiny_gen):
    plugins = default_plugins()
    gen = tiny_gen()
    cfg = rodeco.load_config(["reward=logprob", "partial_reward=same"])
    builder = RoleBuilder(plugins, gen.name, rodeco.BuildContext(generator=gen, plugins=plugins))
    choices = choose_roles(cfg, plugins)
    a = builder.roles(choices.with_(plugins, policy={"name": "fixed", "alpha": 0.3}))
    b = builder.roles(choices.with_(plugins, policy={"name": "adaptive"}))
    assert a.reward.reward is b.reward.reward and a.policy is not b.policy
    assert a.partial is None and a.partial_name == SAME
    assert a.identities == {"generator": gen.name, "reward": "logprob:form=mean", "partial_reward": "logprob:form=mean"}
    c = builder.roles(choices.with_(plugins, partial={"name": "logprob", "form": "sum"}))
    assert c.partial is not None and c.partial.reward is not a.reward.reward and c.partial.role == "partial_reward"
    with pytest.raises(ConfigError, match="recorded pool"):  # a live builder has no final rewards to be the oracle
        builder.partial(choices.with_(plugins, partial={"name": ORACLE}))
