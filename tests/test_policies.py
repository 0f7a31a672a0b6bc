"""Rejection policies: the contract (hypothesis, for every built-in policy), and what adaptive and correlation do
with constructed score histories."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rodeco_policies
from rodeco.common.state import Counts, PromptView, RoundView
from rodeco.common.validation import ConfigError, PluginError
from rodeco.core.contracts import select_checked
from rodeco.plugins import BuildContext, Plugins, get_plugin_manager
from rodeco_policies.adaptive import AdaptivePolicy, build_adaptive, estimate_noise
from rodeco_policies.correlation import CorrelationPolicy, build_correlation, rank_agreement

BUILTIN = ("none", "fixed", "adaptive", "correlation", "calibrated", "allocate", "deepconf")
SEARCH = ("particle_filter", "beam", "dvts")  # answer with Counts: tests/test_search.py holds them to the contract
CROSS_PROMPT = ("allocate",)  # may reject fewer than a prompt's min_reject where another prompt rejects more
NEVER_REJECTS = {"none"}  # Best-of-N: fails (select_checked) when the budget forces a rejection
MAY_END = {"deepconf"}  # may stop every row of a prompt that has a finished candidate (the contract allows it)


@pytest.fixture(scope="module")
def builtins() -> Plugins:
    """The built-in policies only, whatever third-party plugins are installed."""
    return get_plugin_manager(load_entrypoints=False, extra=[rodeco_policies])


def build(plugins: Plugins, name: str, **params):
    return plugins.policies.get(name).factory(params, BuildContext())


def pv(scores, history=None, *, finished=(), tokens=16, min_reject=0, prompt_index=0) -> PromptView:
    scores = np.asarray(scores, dtype=np.float64)
    hist = np.zeros((len(scores), 0)) if history is None else np.asarray(history, dtype=np.float64)
    return PromptView(
        prompt_index=prompt_index,
        candidate_ids=list(range(len(scores))),
        scores=scores,
        history=hist,
        finished_scores=list(finished),
        tokens_generated=tokens,
        min_reject=min_reject,
    )


def rview(*prompts: PromptView, max_new_tokens: int = 64, rnd: int = 0) -> RoundView:
    total = sum(p.k for p in prompts)
    return RoundView(
        round=rnd,
        prompts=list(prompts),
        max_rows_next=total - sum(p.min_reject for p in prompts),
        max_new_tokens=max_new_tokens,
    )


# ---------------------------------------------------------------------------------------------------------------
# Property tests: the contract of rodeco.common.protocols.Policy, for every built-in policy.

score = st.one_of(st.floats(-50, 50, allow_nan=False, allow_subnormal=False), st.sampled_from([0.0, 1.0, -1.0]))


@st.composite
def prompt_views(draw, index: int, allow_min_reject: bool) -> PromptView:
    k = draw(st.integers(1, 9))
    r = draw(st.integers(0, 3))
    scores = np.array(draw(st.lists(score, min_size=k, max_size=k)))
    hist = np.full((k, r), np.nan)
    for i in range(k):
        present = draw(st.integers(0, r))  # right-aligned: nan before a candidate's first decision point
        if present:
            hist[i, r - present :] = draw(st.lists(score, min_size=present, max_size=present))
    finished = draw(st.lists(score, max_size=3))
    tokens = draw(st.integers(1, 200))
    candidate_ids = sorted(draw(st.sets(st.integers(0, 64), min_size=k, max_size=k)))
    min_reject = draw(st.integers(0, k - 1)) if allow_min_reject else 0
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))  # each row's top-5 log-probs so far (deepconf reads them)
    top = [-np.sort(rng.exponential(size=(tokens, 5)), axis=1) for _ in range(k)]
    return PromptView(
        prompt_index=index,
        candidate_ids=candidate_ids,
        scores=scores,
        history=hist,
        finished_scores=finished,
        tokens_generated=tokens,
        min_reject=min_reject,
        top_logprobs=top,
    )


@st.composite
def round_views(draw, allow_min_reject: bool = True) -> RoundView:
    n = draw(st.integers(1, 4))
    prompts = [draw(prompt_views(i, allow_min_reject)) for i in range(n)]
    max_new = max(p.tokens_generated for p in prompts) + draw(st.integers(1, 300))
    return rview(*prompts, max_new_tokens=max_new, rnd=draw(st.integers(0, 5)))


def test_every_builtin_policy_is_covered(builtins: Plugins) -> None:
    # A new built-in policy must be added to BUILTIN, so the properties below run on it.
    assert builtins.policies.names() == sorted(BUILTIN + SEARCH)


@pytest.mark.parametrize("name", BUILTIN)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_policy_contract(builtins: Plugins, name: str, data) -> None:
    view = data.draw(round_views(allow_min_reject=name not in NEVER_REJECTS))
    policy = build(builtins, name)
    before = copy.deepcopy(view)
    keep = policy.select(view)
    assert len(keep) == len(view.prompts)
    for kept, p in zip(keep, view.prompts):
        kept = [int(i) for i in kept]
        assert kept or (name in MAY_END and p.finished_scores), f"{name} kept no row of a prompt"
        assert len(set(kept)) == len(kept), f"{name} returned duplicates {kept}"
        assert all(0 <= i < p.k for i in kept), f"{name} returned out-of-range rows {kept} for k={p.k}"
        if name not in CROSS_PROMPT:
            assert p.k - len(kept) >= p.min_reject, f"{name} rejected {p.k - len(kept)} < min_reject={p.min_reject}"
    assert sum(len(k) for k in keep) <= view.max_rows_next
    assert select_checked(policy, name, view) == [Counts.keep(k, p.k) for k, p in zip(keep, view.prompts)]
    # deterministic: the same inputs (a fresh copy, a fresh policy) give the same output; the view is not mutated
    assert build(builtins, name).select(copy.deepcopy(before)) == keep
    assert policy.select(view) == keep
    for a, b in zip(view.prompts, before.prompts):
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.history, b.history)
        assert (a.candidate_ids, a.finished_scores, a.min_reject) == (b.candidate_ids, b.finished_scores, b.min_reject)


def test_none_fails_when_the_budget_forces_a_rejection(builtins: Plugins) -> None:
    view = rview(pv([0.1, 0.2, 0.3], min_reject=1))
    with pytest.raises(PluginError, match="budget allows"):
        select_checked(build(builtins, "none"), "none", view)


# ---------------------------------------------------------------------------------------------------------------
# adaptive

SCORES = np.linspace(0.0, 1.0, 10)  # this round's partial scores, spread 1.0


def stable_history(r: int = 3, jitter: float = 0.005) -> np.ndarray:
    """Every candidate moved up together (a shared drift) with tiny relative moves: the ranking holds."""
    rng = np.random.default_rng(0)
    return np.column_stack([SCORES - 0.2 * (r - j) + rng.normal(0, jitter, SCORES.size) for j in range(r)])


def noisy_history(r: int = 3, scale: float = 1.0) -> np.ndarray:
    """Scores jumped around between decision points: earlier rankings say little about this one."""
    rng = np.random.default_rng(1)
    return np.column_stack([rng.normal(0.5, scale, SCORES.size) for _ in range(r)])


def adaptive(**params) -> AdaptivePolicy:
    return build_adaptive(params, BuildContext())


def test_adaptive_keeps_more_when_scores_are_noisy_between_rounds() -> None:
    policy = adaptive(horizon="round")
    stable = policy.select(rview(pv(SCORES, stable_history())))[0]
    noisy = policy.select(rview(pv(SCORES, noisy_history())))[0]
    assert len(noisy) > len(stable), (noisy, stable)
    assert len(stable) <= 3 and len(noisy) >= 7
    assert 9 in stable and 9 in noisy  # the best row always survives
    # with the default horizon as well
    policy = adaptive()
    assert len(policy.select(rview(pv(SCORES, noisy_history())))[0]) > len(
        policy.select(rview(pv(SCORES, stable_history())))[0]
    )


def test_adaptive_noise_estimate_ignores_a_shared_drift_and_uses_the_prior_without_history() -> None:
    drift = np.column_stack([SCORES - 1.0, SCORES - 0.5])  # everybody moved by the same amount: no relative noise
    est = estimate_noise(pv(SCORES, drift), prior_noise=0.5, prior_weight=0.0)
    assert est.sigma == pytest.approx(0.0, abs=1e-12) and est.moves == 2 * (SCORES.size - 1)
    prior = estimate_noise(pv(SCORES), prior_noise=0.5, prior_weight=2.0)
    assert prior.moves == 0 and prior.sigma == pytest.approx(0.5 * np.std(SCORES))


def test_adaptive_rejects_more_as_the_end_approaches_and_when_a_finished_row_is_far_ahead() -> None:
    policy = adaptive()
    early = policy.select(rview(pv(SCORES, noisy_history(1, 0.3), tokens=8), max_new_tokens=256))[0]
    late = policy.select(rview(pv(SCORES, noisy_history(1, 0.3), tokens=240), max_new_tokens=256))[0]
    assert len(early) > len(late)
    ahead = policy.select(rview(pv(SCORES, noisy_history(1, 0.3), finished=[50.0])))[0]
    assert ahead == [9]  # nothing active can catch up: keep only the best (one row must stay)


def test_adaptive_delta_and_min_reject() -> None:
    view = rview(pv(SCORES, noisy_history(2, 0.3)))
    lenient, strict = adaptive(delta=0.001).select(view)[0], adaptive(delta=0.4).select(view)[0]
    assert len(lenient) > len(strict)
    assert adaptive(delta=0.001).select(rview(pv(SCORES, noisy_history(), min_reject=6)))[0] == [6, 7, 8, 9]


@pytest.mark.parametrize(
    "key, value",
    [
        ("delta", 0.0),
        ("delta", 1.0),
        ("delta", "x"),
        ("prior_noise", -1.0),
        ("prior_weight", math.nan),
        ("horizon", "forever"),
        ("alpha", 0.5),
    ],
)
def test_adaptive_bad_parameters_name_the_key(key: str, value) -> None:
    with pytest.raises(ConfigError) as e:
        adaptive(**{key: value})
    assert e.value.key == f"policy.{key}" and "Fix:" in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# correlation


def correlation(**params) -> CorrelationPolicy:
    return build_correlation(params, BuildContext())


def n_rejected(policy, view: RoundView) -> list[int]:
    return [p.k - len(k) for p, k in zip(view.prompts, policy.select(view))]


def test_correlation_rejects_more_at_tau_near_one_than_near_zero() -> None:
    k = 12
    now = np.arange(k, dtype=float)
    agree = now - 3.0  # the same ranking one decision point earlier: tau = 1
    shuffled = np.array([5, 11, 0, 7, 3, 9, 1, 10, 4, 2, 8, 6], dtype=float)  # tau near 0
    tau0 = rank_agreement(pv(now, shuffled[:, None])).tau
    assert abs(tau0) < 0.2 and rank_agreement(pv(now, agree[:, None])).tau == pytest.approx(1.0)
    policy = correlation()
    high = n_rejected(policy, rview(pv(now, agree[:, None])))[0]
    low = n_rejected(policy, rview(pv(now, shuffled[:, None])))[0]
    assert high > low
    assert high == math.floor(0.8 * k) and low == math.floor(policy.rate_for_tau(tau0) * k)
    # an inverted ranking (tau = -1) is treated like no correlation at all
    assert n_rejected(policy, rview(pv(now, -now[:, None])))[0] == math.floor(0.1 * k)


def test_correlation_falls_back_to_alpha_then_pools_small_prompts() -> None:
    policy = correlation(alpha=0.25, min_candidates=4)
    first = rview(pv(np.arange(8.0)), pv(np.arange(4.0), prompt_index=1))
    assert [r.source for r in policy.rates(first)] == ["fallback", "fallback"]
    assert n_rejected(policy, first) == [2, 1]
    # prompt 1 has only 3 candidates with history: it borrows prompt 0's tau (= 1)
    big = pv(np.arange(8.0), np.arange(8.0)[:, None])
    small = pv(np.array([0.0, 2.0, 1.0]), np.array([[0.0], [1.0], [2.0]]), prompt_index=1)
    rates = policy.rates(rview(big, small))
    assert [r.source for r in rates] == ["prompt", "pooled"]
    assert rates[1].tau == pytest.approx((1.0 * 28 + rank_agreement(small).tau * 3) / 31)
    # no prompt has a usable tau (ties everywhere): fall back to alpha
    flat = pv(np.ones(5), np.ones((5, 1)))
    assert [r.source for r in policy.rates(rview(flat))] == ["fallback"]


def test_correlation_uses_only_candidates_seen_at_both_points() -> None:
    hist = np.array([[0.0], [1.0], [2.0], [np.nan], [3.0]])
    assert rank_agreement(pv(np.array([0.0, 1.0, 2.0, -5.0, 3.0]), hist)).n == 4


@pytest.mark.parametrize(
    "params, key",
    [
        ({"alpha": 1.0}, "policy.alpha"),
        ({"alpha_min": -0.1}, "policy.alpha_min"),
        ({"alpha_min": 0.6, "alpha_max": 0.5}, "policy.alpha_min"),
        ({"tau_low": 0.5, "tau_high": 0.5}, "policy.tau_high"),
        ({"min_candidates": 1}, "policy.min_candidates"),
        ({"delta": 0.1}, "policy.delta"),
    ],
)
def test_correlation_bad_parameters_name_the_key(params: dict, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        correlation(**params)
    assert e.value.key == key and "Fix:" in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# config options


@pytest.mark.parametrize("name, cls", [("adaptive", AdaptivePolicy), ("correlation", CorrelationPolicy)])
def test_config_option_builds_the_policy(builtins: Plugins, name: str, cls: type) -> None:
    from rodeco.api import load_config
    from rodeco.core.config import split_node

    cfg = load_config([f"policy={name}"])
    p_name, params = split_node(cfg.policy, "policy")
    assert p_name == name
    assert isinstance(builtins.policies.get(p_name).factory(params, BuildContext()), cls)


# ---------------------------------------------------------------------------------------------------------------
# parameters: one dataclass per policy holds them and their defaults


@pytest.mark.parametrize("alpha", [False, True, math.nan, 1.0, "0.5"])
def test_fixed_rejects_booleans_and_rates_outside_the_unit_interval(builtins: Plugins, alpha) -> None:
    from rodeco_policies.basic import FixedPolicy

    for make in (lambda: FixedPolicy(alpha), lambda: build(builtins, "fixed", alpha=alpha)):
        with pytest.raises(ConfigError) as e:
            make()
        assert e.value.key == "policy.alpha" and e.value.value is alpha and "Fix:" in str(e.value)
    assert FixedPolicy(0).alpha == 0.0  # an integer rate is a number


@pytest.mark.parametrize("name", BUILTIN)
def test_each_policy_states_its_defaults_once(builtins: Plugins, name: str) -> None:
    """The option file names the policy and extends its params dataclass (``/policy_params/<name>``): the composed
    node holds the dataclass's defaults, and the file repeats none of them."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from rodeco.api import load_config
    from rodeco.common.params import defaults_node

    schema = builtins.policies.get(name).params
    assert schema is not None
    node = OmegaConf.to_container(load_config([f"policy={name}"]).policy)
    assert node == defaults_node(name, schema)
    own = OmegaConf.to_container(OmegaConf.load(Path(rodeco_policies.__file__).parent / f"conf/policy/{name}.yaml"))
    assert set(own) - {"defaults"} == {"name"}, f"policy/{name}.yaml repeats a default of its dataclass"


def test_a_policy_built_without_parameters_takes_the_dataclass_defaults(builtins: Plugins) -> None:
    from rodeco_policies.adaptive import AdaptiveParams
    from rodeco_policies.basic import FixedParams

    assert build(builtins, "fixed").alpha == FixedParams.alpha == 0.5
    a = build(builtins, "adaptive")
    assert (a.delta, a.prior_noise, a.prior_weight, a.horizon) == (0.05, 1.0, 2.0, "remaining")
    assert a.delta == AdaptiveParams.delta
