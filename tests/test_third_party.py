"""Third-party plugins: the autoload switches, and the example package installed with pip and run from the CLI.

``test_example_package_*`` install ``plugins/rodeco_example`` into the running venv (and leave it installed). No
other test depends on it being installed or not: they build their managers from explicit plugin lists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from rodeco import hookimpl
from rodeco.errors import ConfigError
from rodeco.plugins import get_plugin_manager

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
    builtin = [ep for ep in entry_points(group="rodeco") if ep.name in ("rewards", "policies")]
    fakes = []
    for name in ("alpha", "beta"):
        module = f"rodeco_fake_{name}"
        monkeypatch.setitem(sys.modules, module, fake_plugin_module(module, f"{name}_reward"))
        fakes.append(EntryPoint(name=name, value=module, group="rodeco"))
    monkeypatch.setattr("rodeco.plugins.entry_points", lambda group: [*builtin, *fakes] if group == "rodeco" else [])
    monkeypatch.delenv("RODECO_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("RODECO_LOAD_PLUGINS", raising=False)


@pytest.mark.parametrize("env, rewards", [
    ({}, ["alpha_reward", "beta_reward", "logprob"]),
    ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1"}, ["logprob"]),
    ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "true"}, ["logprob"]),
    ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "0"}, ["alpha_reward", "beta_reward", "logprob"]),
    ({"RODECO_LOAD_PLUGINS": "beta"}, ["beta_reward", "logprob"]),
    ({"RODECO_LOAD_PLUGINS": " alpha , beta "}, ["alpha_reward", "beta_reward", "logprob"]),
    ({"RODECO_DISABLE_PLUGIN_AUTOLOAD": "1", "RODECO_LOAD_PLUGINS": "alpha"}, ["alpha_reward", "logprob"]),
])
def test_autoload_switches(fake_entry_points: None, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                           rewards: list[str]) -> None:
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


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``pip install ./plugins/rodeco_example`` into this venv, built from a copy so the checkout stays clean."""
    src = tmp_path_factory.mktemp("src") / "rodeco_example"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    # Offline and fast when this venv has setuptools (the build backend); otherwise pip fetches it to build.
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    p = run([sys.executable, "-m", "pip", "install", "--no-deps", *offline, "--disable-pip-version-check",
             "--quiet", str(src)])
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_hooks import one_thread, tiny_generator

    with one_thread():
        gen = tiny_generator()
    path = tmp_path_factory.mktemp("tiny-llama")
    gen.model.save_pretrained(path)
    gen.tokenizer.save_pretrained(path)
    return path


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
    assert "example" in default["plugins"]
    (conf,) = [d for d in default["dirs"] if "rodeco_example" in d]
    assert (Path(conf) / "reward" / "example_length.yaml").is_file()
    assert (Path(conf) / "policy" / "example_keep.yaml").is_file()
    assert not str(conf).startswith(str(EXAMPLE)), "the example must run from its installed copy"
    assert "example" not in disabled["plugins"] and "example_length" not in disabled["rewards"]
    assert {"logprob"} <= set(disabled["rewards"]) and {"fixed", "none"} <= set(disabled["policies"])
    assert only["plugins"] == sorted(["example", "rewards", "policies"])
    assert "example_length" in only["rewards"]


def test_example_package_runs_from_the_cli(installed_example: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    args = [str(RODECO), "reward=example_length", "policy=example_keep", "reward.target_words=6", "policy.keep=3",
            f"generator.model={tiny_model_dir}", "data.prompts=[w1 w2 w3,w4 w5]", "n=6",
            "sampling.max_new_tokens=24", "budget.kv_tokens=160", "budget.min_tokens_per_round=4",
            f"output.dir={tmp_path / 'out'}", "output.progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"]
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
    assert p.returncode != 0 and "Could not find 'policy/example_keep'" in p.stdout + p.stderr


# ---------------------------------------------------------------------------------------------------------------
# How the CLI puts plugin config dirs on Hydra's search path

@pytest.mark.parametrize("argv, expected", [
    ([], ["hydra.searchpath=['file:///p']"]),
    (["n=3", "--cfg", "job"], ["hydra.searchpath=['file:///p']", "n=3", "--cfg", "job"]),
    (["--cfg", "job", "n=3", "~seed"], ["--cfg", "job", "hydra.searchpath=['file:///p']", "n=3", "~seed"]),
    (["-m", "n=3,4"], ["-m", "hydra.searchpath=['file:///p']", "n=3,4"]),
    (["n=3", "hydra.searchpath=[file:///mine]"], ["n=3", "hydra.searchpath=['file:///mine','file:///p']"]),
])
def test_cli_adds_plugin_config_dirs_where_hydra_accepts_them(argv: list[str], expected: list[str]) -> None:
    from rodeco.cli import with_searchpath

    assert with_searchpath(argv, ["file:///p"]) == expected


def test_cli_searchpath_override_parses_back_with_odd_paths() -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rodeco.cli import with_searchpath

    paths = ["file:///a b/c,d", "file:///it's"]
    (arg,) = with_searchpath([], paths)
    assert OverridesParser.create().parse_override(arg).value() == paths
