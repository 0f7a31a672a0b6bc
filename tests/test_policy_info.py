"""What a policy needs from the loop is declared once, as its ``info`` (``rodeco.PolicyInfo``), and read once
(``rodeco.core.contracts.policy_info``): the built-ins declare theirs, a third-party policy gets the same powers through
the same record, and a bare ``decision_tokens`` attribute or ``n="calibrated"`` still work, with a warning. A
reward's optional members are read the same way, by the scoring contract (``rodeco.core.contracts.reward_info``)."""

from __future__ import annotations

import dataclasses

import pytest

from rodeco import BuildContext, PluginError, PolicyInfo, get_plugin_manager
from rodeco.core.contracts import policy_info


def built(name: str, **params):
    return get_plugin_manager().build_policy({"name": name, **params}, BuildContext())


def test_the_built_in_policies_declare_what_they_need():
    assert policy_info(built("none"), "none") == PolicyInfo(rejects=False)
    assert policy_info(built("fixed"), "fixed") == PolicyInfo()
    assert policy_info(built("beam", decision_tokens=8), "beam") == PolicyInfo(decision_tokens=8)
    assert policy_info(built("particle_filter"), "particle_filter").decision_tokens == 16
    assert policy_info(built("calibrated"), "calibrated").chooses_start


def test_a_bare_decision_tokens_attribute_still_works_with_a_warning():
    class Old:
        decision_tokens = 5

        def select(self, view):
            return [list(range(pv.k)) for pv in view.prompts]

    with pytest.warns(DeprecationWarning, match="PolicyInfo"):
        assert policy_info(Old(), "old") == PolicyInfo(decision_tokens=5)


def test_a_bad_declaration_is_the_policys_error():
    class Bad:
        info = PolicyInfo(decision_tokens=0)

    with pytest.raises(PluginError, match="decision every 0 tokens"):
        policy_info(Bad(), "bad")

    class NoChooser:
        info = PolicyInfo(chooses_start=True)

    with pytest.raises(PluginError, match="no choose_start"):
        policy_info(NoChooser(), "nochooser")
    with pytest.raises(PluginError, match="not a rodeco.PolicyInfo"):
        policy_info(type("Wrong", (), {"info": {"decision_tokens": 4}})(), "wrong")


def test_n_calibrated_is_n_policy_with_a_warning():
    from rodeco.core.loop import LoopSettings

    s = LoopSettings(n=4, sampling=None, max_new_tokens=8, budget=None)
    with pytest.warns(DeprecationWarning, match="n=.policy."):
        assert dataclasses.replace(s, n="calibrated").n == "policy"


def test_a_rewards_optional_members_are_read_by_the_contract():
    from rodeco import RewardCost
    from rodeco.core.contracts import RewardInfo, Scorer, identity_of, reward_cost, reward_info

    class Plain:
        def score(self, reqs):
            return [0.0 for _ in reqs]

    class Rich(Plain):
        needs_logprobs, identity, cost = True, "head-abc", RewardCost(calls=3)

    assert reward_info(Plain()) == RewardInfo() and reward_cost(Plain()) is None and identity_of(Plain()) is None
    assert reward_info(Rich()) == RewardInfo(needs_logprobs=True, identity="head-abc")
    s = Scorer(Rich(), "rich")
    assert s.needs_logprobs and s.identity == "head-abc" and s.cost().calls == 3
    assert Scorer(Plain(), "plain").cost() == RewardCost(calls=0)
