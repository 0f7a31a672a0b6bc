"""Custom value functions, ``composite`` (arithmetic, standardization, errors) and the reward contract checks."""

from __future__ import annotations

import math

import pytest

from rodeco import hookimpl
from rodeco.common.state import ScoreRequest
from rodeco.common.validation import ConfigError, PluginError
from rodeco.core.contracts import Scorer
from rodeco.plugins import BuildContext, get_plugin_manager
from rodeco_rewards import value_function
from rodeco_rewards.composite import CompositeReward, build_composite


def n_chars(prompt: str, response: str, partial: bool, scale: float = 1.0) -> float:
    return len(response) / scale


def n_words_batched(requests, bonus: float = 0.0) -> list[float]:
    return [len(r.response.split()) + bonus * r.partial for r in requests]


class Stats:
    """A reward that declares its score statistics (as the embedded RM does), for ``standardize: auto``."""

    score_stats = (10.0, 4.0)

    def score(self, requests):
        return [float(len(r.response)) for r in requests]


class ValuePlugin:
    @hookimpl
    def rodeco_register_rewards(self, register):
        register("chars", value_function(n_chars, params={"scale": 1.0}), "characters")
        register("words", value_function(n_words_batched, batched=True, params={"bonus": 0.0}), "words")
        register("stats", lambda params, ctx: Stats(), "declares score_stats")
        register("nan", value_function(lambda p, r, partial: math.nan), "broken")
        register("short", value_function(lambda reqs: [1.0], batched=True), "wrong count")


@pytest.fixture(scope="module")
def plugins():
    return get_plugin_manager(extra=[ValuePlugin()])


@pytest.fixture()
def ctx(plugins):
    return BuildContext(plugins=plugins)


REQS = [
    ScoreRequest("p", "one two three", (), partial=True),
    ScoreRequest("p", "four", (), partial=False),
    ScoreRequest("q", "", (), partial=True),
]


def test_value_functions_plain_and_batched(plugins, ctx):
    chars = plugins.rewards.get("chars").factory({"scale": 2.0}, ctx)
    assert chars.score(REQS) == [6.5, 2.0, 0.0]
    words = plugins.rewards.get("words").factory({"bonus": 10.0}, ctx)
    assert words.score(REQS) == [13.0, 1.0, 10.0]
    with pytest.raises(ConfigError) as e:
        plugins.rewards.get("chars").factory({"scael": 2.0}, ctx)
    assert e.value.key == "reward.scael"


def test_value_function_signature_is_checked_at_registration():
    with pytest.raises(TypeError, match="cannot be called"):
        value_function(lambda prompt, response: 0.0)  # no `partial`
    with pytest.raises(TypeError, match="cannot be called"):
        value_function(n_chars, params={"nope": 1})
    with pytest.raises(TypeError):
        value_function("not callable")  # type: ignore[arg-type]


def test_composite_weighted_sum(ctx):
    r = build_composite(
        {"components": {"c": {"name": "chars"}, "w": {"name": "words"}}, "weights": {"c": 2.0, "w": -0.5}}, ctx
    )
    assert r.score(REQS) == pytest.approx([2 * 13 - 0.5 * 3, 2 * 4 - 0.5 * 1, 0.0])
    default_weight = build_composite({"components": {"c": {"name": "chars"}, "w": "words"}}, ctx)
    assert default_weight.score(REQS) == pytest.approx([16.0, 5.0, 0.0])


def test_composite_component_params_and_standardization(ctx):
    r = build_composite(
        {
            "components": {"c": {"name": "chars", "scale": 2.0}, "s": {"name": "stats"}},
            "weights": {"c": 1.0, "s": 3.0},
            "standardize": {"c": {"mean": 1.0, "std": 0.5}, "s": "auto"},
        },
        ctx,
    )
    want = [
        (13 / 2 - 1.0) / 0.5 + 3 * (13 - 10.0) / 4.0,
        (4 / 2 - 1.0) / 0.5 + 3 * (4 - 10.0) / 4.0,
        (0 - 1.0) / 0.5 + 3 * (0 - 10.0) / 4.0,
    ]
    assert r.score(REQS) == pytest.approx(want)


def test_composite_scores_do_not_depend_on_batch_neighbours(ctx):
    r = build_composite({"components": {"c": "chars", "s": "stats"}, "standardize": {"s": "auto"}}, ctx)
    alone = [r.score([q])[0] for q in REQS]
    assert r.score(REQS[::-1])[::-1] == pytest.approx(alone, abs=1e-12)


def test_composite_needs_logprobs_and_cost(ctx):
    r = build_composite({"components": {"c": "chars", "lp": {"name": "logprob"}}, "weights": {"lp": 0.5}}, ctx)
    assert r.needs_logprobs
    reqs = [ScoreRequest("p", "ab", (1, 2), partial=True, logprobs=(-1.0, -3.0))]
    assert r.score(reqs) == pytest.approx([2.0 + 0.5 * -2.0])
    assert r.cost.calls == 1
    assert not build_composite({"components": {"c": "chars"}}, ctx).needs_logprobs


@pytest.mark.parametrize(
    "params, key",
    [
        ({"components": {}}, "reward.components"),
        ({"components": None}, "reward.components"),
        ({"components": {"c": "chars"}, "weights": {"x": 1.0}}, "reward.weights.x"),
        ({"components": {"c": "chars"}, "weights": {"c": "heavy"}}, "reward.weights.c"),
        ({"components": {"c": "chars"}, "weights": {"c": math.inf}}, "reward.weights.c"),
        ({"components": {"c": "chars"}, "weights": [1.0]}, "reward.weights"),
        ({"components": {"c": "chars"}, "standardize": {"c": "auto"}}, "reward.standardize.c"),  # no score_stats
        ({"components": {"c": "chars"}, "standardize": {"c": {"mean": 0.0, "std": 0.0}}}, "reward.standardize.c.std"),
        ({"components": {"c": "chars"}, "standardize": {"c": {"mean": 0.0}}}, "reward.standardize.c"),
        ({"components": {"c": "chars"}, "standardize": {"x": "auto"}}, "reward.standardize.x"),
        ({"components": {"c": {"name": "nope"}}}, "reward.components.c.name"),
        ({"components": {"c": {"name": "chars", "scael": 1}}}, "reward.components.c.scael"),
        ({"components": {"c": "chars"}, "beta": 1.0}, "reward.beta"),
    ],
)
def test_composite_config_errors(params, key, ctx):
    with pytest.raises(ConfigError) as e:
        build_composite(params, ctx)
    assert e.value.key == key and "Fix:" in str(e.value)


@pytest.mark.parametrize("name, match", [("nan", "non-finite"), ("short", "1 scores for 3 requests")])
def test_contract_breaks_name_the_plugin(name, match, plugins, ctx):
    reward = plugins.rewards.get(name).factory({}, ctx)
    with pytest.raises(PluginError, match=f"'{name}'.*{match}|{match}.*'{name}'"):
        Scorer(reward, name)(REQS)
    comp = CompositeReward({"bad": reward}, {})
    with pytest.raises(PluginError, match="composite.bad"):
        comp.score(REQS)


@pytest.mark.parametrize(
    "out, match",
    [
        ([1.0, math.inf, 0.0], "non-finite"),
        ([1.0, 2.0], "2 scores"),
        (["a", "b", "c"], "not a list of floats"),
        (None, "not a list of floats"),
    ],
)
def test_scorer_rejects_bad_output(out, match):
    class Bad:
        def score(self, requests):
            return out

    with pytest.raises(PluginError, match=f"'bad'.*{match}|{match}"):
        Scorer(Bad(), "bad")(REQS)


def test_custom_reward_selected_by_config_end_to_end(plugins, tiny_gen):
    import rodeco

    out = rodeco.decode(
        ["write a haiku about autumn leaves"],
        generator=tiny_gen(),
        n=4,
        policy="fixed",
        plugins=plugins,
        overrides=[
            "reward=custom",
            "reward.function=chars",
            "+reward.scale=10",
            "sampling.max_new_tokens=16",
            "output.all_candidates=true",
        ],
    )
    (res,) = out.results
    finished = [c for c in res.candidates if c.finished]
    assert finished and all(c.score == pytest.approx(len(c.text) / 10) for c in finished)
    assert res.best.score == max(c.score for c in finished)
