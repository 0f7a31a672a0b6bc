"""Every config group option composes and builds; the CLI runs end to end on the embedded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import rodeco
from rodeco.data import load_prompts
from rodeco.plugins import default_plugins
from rodeco.plugins import BuildContext
from rodeco.config import split_node, validate

CONF = REPO / "rodeco" / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_default_config_composes_and_validates():
    cfg = rodeco.load_config()
    validate(cfg)
    assert cfg.policy.name == "fixed" and cfg.task == "decode"


@pytest.mark.parametrize("group", ["reward", "policy"])
def test_every_plugin_option_builds(group, tiny_gen):
    registry = getattr(default_plugins(), "rewards" if group == "reward" else "policies")
    for opt in options(group):
        cfg = rodeco.load_config([f"{group}={opt}"])
        name, params = split_node(cfg[group], group)
        entry = registry.get(name)
        if getattr(entry.factory, "needs_network", False):
            continue
        obj = entry.factory(params, BuildContext(generator=tiny_gen(), device="cpu"))
        assert hasattr(obj, "score" if group == "reward" else "select"), opt


def test_every_budget_and_generator_option_composes():
    for opt in options("budget"):
        validate(rodeco.load_config([f"budget={opt}"]))
    for opt in options("generator"):
        cfg = rodeco.load_config([f"generator={opt}", "generator.model=some/model"])
        assert cfg.generator.engine in ("auto", "fast", "hf")


def test_every_data_option_loads():
    for opt in options("data"):
        cfg = rodeco.load_config([f"data={opt}"])
        if cfg.data.path and not (REPO / cfg.data.path).exists():
            pytest.skip(f"{cfg.data.path} is absent (../shared/data is not beside the repo)")
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            prompts = load_prompts(cfg.data.path, cfg.data.prompts, cfg.data.field, cfg.data.offset, cfg.data.limit)
        finally:
            os.chdir(cwd)
        assert prompts and all(p.text.strip() for p in prompts)


def test_every_experiment_composes():
    for opt in options("experiment"):
        cfg = rodeco.load_config([f"experiment={opt}"])
        assert cfg.task == opt


@pytest.mark.integration
def test_cli_end_to_end_on_embedded_model(tmp_path: Path):
    rodeco_bin = Path(sys.executable).with_name("rodeco")
    cmd = [str(rodeco_bin), "data.prompts=[Write a haiku about autumn.,What is 2+2?]", "n=4",
           "sampling.max_new_tokens=32", "budget.kv_tokens=300", "reward=logprob", "output.all_candidates=true",
           f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best of 4" in proc.stdout and "compute saved" in proc.stdout
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert [r["prompt_index"] for r in recs] == [0, 1]
    for r in recs:
        assert r["best"]["text"] and r["rounds"] and r["compute"]["gen_decode_tokens"] > 0
        assert r["compute"]["peak_kv_tokens"] <= 300
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["compute"]["gen_flops"] > 0


@pytest.mark.integration
def test_cli_bad_input_exits_2_with_the_key(tmp_path: Path):
    rodeco_bin = Path(sys.executable).with_name("rodeco")
    proc = subprocess.run([str(rodeco_bin), "policy.alpha=1.5", "data.prompts=[hi]", "generator.model=/nonexistent",
                           f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "generator.model" in proc.stderr or "policy.alpha" in proc.stderr
