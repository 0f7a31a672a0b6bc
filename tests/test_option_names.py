"""A policy option is its file's registered ``name`` and parameters (``rodeco.compose.option_node``) wherever an
experiment or script picks policies by option: the efficiency experiment's methods and its calibrated check, and
``scripts/allocate_bench.py``. A test-only plugin ships an option whose file names another registered policy
(``gentle``: ``fixed`` at alpha 0.25), as ``reward=minilm_prefix`` names ``minilm_rm``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import rodeco
from rodeco import hookimpl
from rodeco.experiments import efficiency
from rodeco.experiments.bench import allocate_bench
from rodeco.plugins import BuildContext, Plugins, get_plugin_manager
from rodeco.roles import Choices, choose_roles


class OptionsPlugin:
    def __init__(self, conf: Path) -> None:
        self.conf = conf

    @hookimpl
    def rodeco_config_dirs(self) -> list[str]:
        return [str(self.conf)]


@pytest.fixture
def plugins(tmp_path) -> Plugins:
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "gentle.yaml").write_text("# fixed, rejecting a quarter\nname: fixed\nalpha: 0.25\n")
    return get_plugin_manager(extra=[OptionsPlugin(tmp_path)])


class Builder:
    """What a ``RoleBuilder`` is asked for, with the policy really built (no reward: no model is loaded)."""

    def __init__(self, plugins: Plugins) -> None:
        self.plugins, self.asked = plugins, []

    def reward(self, choice):
        return choice.name

    def roles(self, choices: Choices) -> SimpleNamespace:
        self.asked.append(choices)
        return SimpleNamespace(
            policy=self.plugins.build_policy(choices.policy.node, BuildContext(plugins=self.plugins)), choices=choices
        )


def is_gentle(choices: Choices, policy) -> bool:
    return (choices.policy.name, choices.policy.params) == ("fixed", {"alpha": 0.25}) and policy.alpha == 0.25


def test_an_efficiency_method_is_its_option_files_policy(plugins):
    me = SimpleNamespace(choices=choose_roles(rodeco.load_config([], plugins), plugins, live=False))
    got = efficiency.Measurer.method_choices(me, efficiency.Method("gentle", "gentle", {}), plugins)
    assert is_gentle(got, plugins.build_policy(got.policy.node, BuildContext(plugins=plugins)))
    got = efficiency.Measurer.method_choices(me, efficiency.Method("g", "gentle", {"alpha": 0.5}), plugins)
    assert (got.policy.name, got.policy.params) == ("fixed", {"alpha": 0.5})  # the method's parameters win
    with pytest.raises(rodeco.ConfigError, match="experiment_args.policies='nope': unknown policy"):
        efficiency.Measurer.method_choices(me, efficiency.Method("nope", "nope", {}), plugins)


def test_the_calibrated_check_builds_the_calibrated_option_as_its_file_says(plugins, monkeypatch, tmp_path):
    cfg = rodeco.load_config([], plugins)
    (tmp_path / "policy" / "calibrated.yaml").write_text("name: fixed\nalpha: 0.25\n")  # first on the path, below
    dirs = plugins.config_dirs()
    monkeypatch.setattr(plugins, "config_dirs", lambda: [str(tmp_path), *dirs])
    builder = Builder(plugins)
    a = {"calibrated_deltas": [0.05]}
    assert efficiency.check_calibrated(cfg, plugins, a, builder) is a
    (choices,) = builder.asked
    assert (choices.policy.name, choices.policy.params) == ("fixed", {"alpha": 0.25})


def test_allocate_bench_builds_a_method_from_its_option_file(plugins):
    bench = allocate_bench
    builder = Builder(plugins)
    cfg = rodeco.load_config([], plugins)
    roles = bench.build(cfg, plugins, builder, "gentle", {}, {})
    assert is_gentle(builder.asked[-1], roles.policy) and roles.choices.reward.name == "minilm_rm"
    roles = bench.build(cfg, plugins, builder, "gentle", {}, {"gentle": {"alpha": 0.75}})
    assert builder.asked[-1].policy.name == "fixed" and roles.policy.alpha == 0.75  # the per-policy overrides win
