"""The configs travel with the package: a wheel built from this checkout, installed into a folder of its own,
composes the default config from its own copy of conf/ (as rodeco.conf) and its plugins' config dirs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow  # builds and installs a wheel

IGNORE = shutil.ignore_patterns(
    ".venv", ".git", "outputs", "multirun", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
)

COMPOSE = textwrap.dedent("""
    import json, rodeco, rodeco_policies, rodeco_rewards
    from rodeco.compose import conf_dir
    from rodeco.plugins import default_plugins

    cfg = rodeco.load_config(["experiment=perplexity"])
    print(json.dumps({"rodeco": rodeco.__file__, "conf": str(conf_dir()), "rewards": rodeco_rewards.__file__,
                      "policies": rodeco_policies.__file__, "dirs": default_plugins().config_dirs(),
                      "task": cfg.task, "policy": cfg.policy.name, "reward": dict(cfg.reward),
                      "n": cfg.experiment_args.n}))
""")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "rodeco"
    shutil.copytree(REPO, src, ignore=IGNORE)  # setuptools writes build/ and *.egg-info next to the sources
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = out.glob("rodeco-*.whl")
    return whl


def test_the_wheel_carries_configs_plugins_and_assets(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in [
        "rodeco/conf/config.yaml",
        "rodeco/conf/experiment/efficiency.yaml",
        "rodeco/conf/budget/cpu.yaml",
        "rodeco_rewards/conf/reward/minilm_rm.yaml",
        "rodeco_rewards/conf/experiment/rm_train.yaml",
        "rodeco_policies/conf/policy/fixed.yaml",
        "rodeco_tasks/conf/data/reasoning_gym.yaml",
        "rodeco_tasks/reasoning_gym.py",
        "rodeco_rewards/assets/minilm_bt_head.safetensors",
        "rodeco/common/searchpath.py",
        "rodeco/engines/fast.py",
        "rodeco/engines/native/__init__.py",  # every subpackage is listed in pyproject's packages
        "rodeco/engines/native/attention.cpp",  # the native kernels' sources, built on first use
        "rodeco/engines/native/mkl_linear.cpp",
    ]:
        assert f in names, f
    assert not [n for n in names if n.startswith(("conf/", "plugins/", "tests/", "hydra_plugins/"))]


def test_an_installed_wheel_composes_from_its_own_configs(wheel: Path, tmp_path: Path):
    target = tmp_path / "site"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-c", COMPOSE], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("rodeco", "conf", "rewards", "policies"):
        assert out[key].startswith(str(target)), (key, out[key])  # the installed copy, not the checkout
    assert out["conf"] == str(target / "rodeco" / "conf")
    builtin = [d for d in out["dirs"] if "/rodeco_rewards/" in d + "/" or "/rodeco_policies/" in d + "/"]
    assert sorted(builtin) == [str(target / "rodeco_policies" / "conf"), str(target / "rodeco_rewards" / "conf")]
    assert (out["task"], out["policy"], out["n"]) == ("perplexity", "fixed", 4)
    assert out["reward"] == {"name": "logprob", "form": "perplexity", "model": None}  # plugin config + override
