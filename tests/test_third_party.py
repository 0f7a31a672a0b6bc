"""Third-party plugins: the autoload switches, and the example package installed with pip and run from the CLI.

``test_example_package_*`` install ``plugins/rodeco_example`` into the running venv (and leave it installed). No
other test depends on it being installed or not: they build their managers from explicit plugin lists.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import types
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from rodeco import hookimpl
from rodeco.common.validation import ConfigError
from rodeco.plugins import get_plugin_manager

pytestmark = pytest.mark.slow  # installs a plugin package

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plugins" / "rodeco_example"
RODECO = Path(sys.executable).with_name("rodeco")


# ---------------------------------------------------------------------------------------------------------------
# RODECO_DISABLE_PLUGIN_AUTOLOAD / RODECO_LOAD_PLUGINS, with fake installed entry points


def fake_plugin_module(name: str, reward: str) -> types.ModuleType:
    mod = types.ModuleType(name)

    @hookimpl
    def rodeco_register_rewards(register):
        register(reward, lambda params, ctx: None)

    mod.rodeco_register_rewards = rodeco_register_rewards
    return mod


@pytest.fixture()
def fake_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two third-party entry points, ``alpha`` and ``beta``, next to the real built-ins."""
    builtin = [ep for ep in entry_points(group="rodeco") if ep.name in ("rewards", "policies", "experiments", "tasks")]
    fakes = []
    for name in ("alpha", "beta"):
        module = f"rodeco_fake_{name}"
        monkeypatch.setitem(sys.modules, module, fake_plugin_module(module, f"{name}_reward"))
        fakes.append(EntryPoint(name=name, value=module, group="rodeco"))
    monkeypatch.setattr("rodeco.plugins.entry_points", lambda group: [*builtin, *fakes] if group == "rodeco" else [])
    monkeypatch.delenv("RODECO_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("RODECO_LOAD_PLUGINS", raising=False)


@pytest.mark.parametrize(
    "env, rewards",
    [
        ({}, ["alpha_reward", "beta_reward", "logprob"]),
        ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1"}, ["logprob"]),
        ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "true"}, ["logprob"]),
        ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "0"}, ["alpha_reward", "beta_reward", "logprob"]),
        ({"RODECO_LOAD_PLUGINS": "beta"}, ["beta_reward", "logprob"]),
        ({"RODECO_LOAD_PLUGINS": " alpha , beta "}, ["alpha_reward", "beta_reward", "logprob"]),
        ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1", "RODECO_LOAD_PLUGINS": "alpha"}, ["alpha_reward", "logprob"]),
    ],
)
def test_autoload_switches(
    fake_entry_points: None, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rewards: list[str]
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugins = get_plugin_manager()
    assert [r for r in plugins.rewards.names() if r in ("alpha_reward", "beta_reward", "logprob")] == rewards
    assert {"none", "fixed"} <= set(plugins.policies.names())  # built-ins always load


def test_load_plugins_names_an_unknown_entry_point(fake_entry_points: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RODECO_LOAD_PLUGINS", "alpha,gamma")
    with pytest.raises(ConfigError) as e:
        get_plugin_manager()
    assert e.value.key == "RODECO_LOAD_PLUGINS" and "gamma" in str(e.value) and "alpha" in str(e.value)


# ---------------------------------------------------------------------------------------------------------------
# The example package, installed with pip


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    for k in ("RODECO_DISABLE_PLUGIN_AUTOLOAD", "RODECO_LOAD_PLUGINS"):
        if k not in (env or {}):
            full_env.pop(k, None)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


CHECK_ENTRY_POINTS = textwrap.dedent("""
    import json, os
    from importlib.metadata import entry_points
    from rodeco.plugins import get_plugin_manager

    eps = {ep.name: ep.value for ep in entry_points(group="rodeco")}
    out = {"entry_point": eps.get("example")}
    for label, env in [("default", {}), ("disabled", {"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1"}),
                       ("only", {"RODECO_LOAD_PLUGINS": "example"})]:
        os.environ.pop("RODECO_DISABLE_PLUGIN_AUTOLOAD", None)
        os.environ.pop("RODECO_LOAD_PLUGINS", None)
        os.environ.update(env)
        p = get_plugin_manager()
        out[label] = {"rewards": p.rewards.names(), "policies": p.policies.names(), "dirs": p.config_dirs(),
                      "experiments": p.experiments.names(),
                      "plugins": sorted(name for name, _ in p.pm.list_name_plugin())}
    print(json.dumps(out))
""")


def test_example_package_entry_points_load(installed_example: None) -> None:
    p = run([sys.executable, "-c", CHECK_ENTRY_POINTS])
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["entry_point"] == "rodeco_example"
    default, disabled, only = out["default"], out["disabled"], out["only"]
    assert "example_length" in default["rewards"] and "example_keep" in default["policies"]
    assert "example_sweep" in default["experiments"] and "efficiency" in default["experiments"]
    assert {"example", "example_observer"} <= set(default["plugins"])
    (conf,) = [d for d in default["dirs"] if "rodeco_example" in d]
    assert (Path(conf) / "reward" / "example_length.yaml").is_file()
    assert (Path(conf) / "policy" / "example_keep.yaml").is_file()
    assert (Path(conf) / "experiment" / "example_sweep.yaml").is_file()
    assert not str(conf).startswith(str(EXAMPLE)), "the example must run from its installed copy"
    assert "example" not in disabled["plugins"] and "example_length" not in disabled["rewards"]
    assert {"logprob"} <= set(disabled["rewards"]) and {"fixed", "none"} <= set(disabled["policies"])
    assert only["plugins"] == sorted(["example", "experiments", "rewards", "policies", "tasks"])
    assert "example_length" in only["rewards"]


def test_example_package_runs_from_the_cli(installed_example: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    args = [
        str(RODECO),
        "reward=example_length",
        "policy=example_keep",
        "reward.target_words=6",
        "policy.keep=3",
        f"generator.model={tiny_model_dir}",
        "data.prompts=[w1 w2 w3,w4 w5]",
        "n=6",
        "sampling.max_new_tokens=24",
        "budget.kv_tokens=160",
        "budget.min_tokens_per_round=4",
        f"output.dir={tmp_path / 'out'}",
        "output.progress=false",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    p = run(args)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    results = [json.loads(line) for line in lines]
    assert len(results) == 2
    assert {r["reward"] for r in results} == {"example_length"} and {r["policy"] for r in results} == {"example_keep"}
    assert all(rd["rows_kept"] <= 3 for r in results for rd in r["rounds"])
    assert any(r["rounds"] for r in results), "the budget should force at least one decision point"
    assert "rodeco-example:" in p.stdout + p.stderr  # its lifecycle hooks ran and logged the summary

    # with autoload off, the package's config options are gone: the run fails instead of silently changing
    p = run(args, env={"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "rodeco: error: policy='example_keep': no such policy option" in p.stderr


def test_example_package_experiment_runs_from_the_cli(
    installed_example: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    p = run(
        [
            str(RODECO),
            "experiment=example_sweep",
            "reward=logprob",
            f"generator.model={tiny_model_dir}",
            "data.prompts=[w1 w2 w3]",
            "n=8",
            "sampling.max_new_tokens=40",
            "sampling.ignore_eos=true",
            "budget.kv_tokens=200",  # decision points on blocks of 8 as of 16
            "budget.min_tokens_per_round=2",
            "experiment_args.alphas=[0.0,0.5]",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("alpha ")]
    assert [x.split(":")[0] for x in lines] == ["alpha 0", "alpha 0.5"]
    tokens = [int(x.rsplit(" ", 1)[1]) for x in lines]
    assert tokens[1] < tokens[0]  # rejecting half the rows at each decision point decodes fewer tokens

    p = run([str(RODECO), "experiment=example_sweep", "experiment_args.alpha=[0.5]"])
    assert p.returncode == 2
    assert "experiment_args.alpha=[0.5]: unknown key; the keys of experiment_args are: alphas" in p.stderr


# ---------------------------------------------------------------------------------------------------------------
# Plugin parameters: checked when the config is composed if the plugin registers a params dataclass


@dataclasses.dataclass
class KeepParams:
    keep: int = 2


class KeepPlugin:
    """Two third-party policies: ``typed_keep`` registers its params dataclass, ``loose_keep`` does not."""

    def __init__(self, conf: Path) -> None:
        self.conf = conf

    @hookimpl
    def rodeco_register_policies(self, register):
        from rodeco import take_params
        from rodeco_policies.basic import NonePolicy

        register(
            "typed_keep",
            lambda params, ctx: take_params("policy", params, KeepParams) and NonePolicy(),
            params=KeepParams,
        )
        register("loose_keep", lambda params, ctx: take_params("policy", params, {"keep": 2}) and NonePolicy())

    @hookimpl
    def rodeco_config_dirs(self):
        return [str(self.conf)]


@pytest.fixture()
def keep_plugins(tmp_path: Path):
    import rodeco_policies
    import rodeco_rewards

    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "typed_keep.yaml").write_text(  # its defaults come from KeepParams
        "defaults:\n  - /policy_params/typed_keep@_here_\n  - _self_\nname: typed_keep\n"
    )
    (tmp_path / "policy" / "loose_keep.yaml").write_text("name: loose_keep\nkeep: 2\n")
    return get_plugin_manager(load_entrypoints=False, extra=[rodeco_rewards, rodeco_policies, KeepPlugin(tmp_path)])


def test_a_plugins_params_dataclass_checks_its_node_when_composing(keep_plugins) -> None:
    import rodeco

    assert rodeco.load_config(["policy=typed_keep"], keep_plugins).policy == {"name": "typed_keep", "keep": 2}
    assert rodeco.load_config(["policy=typed_keep", "policy.keep=3"], keep_plugins).policy.keep == 3
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(["policy=typed_keep", "+policy.kep=3"], keep_plugins)
    assert e.value.key == "policy.kep" and e.value.fix == "did you mean keep? Use policy.keep=3"
    with pytest.raises(ConfigError) as e:
        rodeco.load_config(["policy=typed_keep", "policy.keep=two"], keep_plugins)
    assert e.value.key == "policy.keep" and e.value.problem == "must be an integer, not a string"


def test_a_plugin_without_a_params_dataclass_still_works(keep_plugins) -> None:
    """Nothing is checked when composing; the plugin's own ``take_params`` checks when it is built."""
    import rodeco

    cfg = rodeco.load_config(["policy=loose_keep", "+policy.kep=3"], keep_plugins)
    with pytest.raises(ConfigError) as e:
        keep_plugins.build_policy(cfg.policy, rodeco.BuildContext())
    assert e.value.key == "policy.kep" and "did you mean keep?" in e.value.fix
    cfg = rodeco.load_config(["policy=loose_keep", "policy.keep=3"], keep_plugins)
    assert keep_plugins.build_policy(cfg.policy, rodeco.BuildContext()) is not None


def test_params_must_be_a_dataclass() -> None:
    class NotADataclass:
        keep: int = 2

    plugin = types.SimpleNamespace(
        rodeco_register_policies=lambda register: register("bad", lambda params, ctx: None, params=NotADataclass)
    )
    with pytest.raises(ValueError, match="params must be a dataclass"):
        get_plugin_manager(load_entrypoints=False, extra=[plugin])


# ---------------------------------------------------------------------------------------------------------------
# How plugin config dirs reach Hydra's search path: rodeco's SearchPathPlugin, for rodeco's app only


def test_plugin_config_dirs_are_on_the_search_path_of_rodeco_only(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from rodeco.compose import prepare

    dirs = [f"file://{d}" for d in prepare().config_dirs()]
    assert len(dirs) >= 2  # the built-in rewards' and policies' config options
    GlobalHydra.instance().clear()
    with initialize_config_module("rodeco.conf", version_base=None):
        paths = [f"{e.scheme()}://{e.path}" for e in GlobalHydra.instance().hydra.config_loader.get_sources()]
    assert paths.index("pkg://rodeco.conf") < min(paths.index(d) for d in dirs)  # after rodeco's own conf/
    (tmp_path / "other.yaml").write_text("x: 1\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(tmp_path), version_base=None):
        assert compose("other").x == 1
        paths = [f"{e.scheme()}://{e.path}" for e in GlobalHydra.instance().hydra.config_loader.get_sources()]
    assert paths and not set(dirs) & set(paths)  # another Hydra app in the same environment is left alone


def test_a_users_own_searchpath_keeps_working(tmp_path: Path) -> None:
    import rodeco

    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "mine.yaml").write_text("name: fixed\nalpha: 0.25\n")
    cfg = rodeco.load_config([f"hydra.searchpath=[file://{tmp_path}]", "policy=mine", "reward=logprob"])
    assert cfg.policy.alpha == 0.25 and cfg.reward.name == "logprob"  # the user's dir and the plugins' dirs
