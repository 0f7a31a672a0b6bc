"""Every config group option composes and builds; the CLI runs end to end on the embedded model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf

import rodeco
from rodeco.budget import Budget, budget_from_device
from rodeco.compose import conf_dir
from rodeco.config import make_budget, split_node, validate
from rodeco.data import prompts_of
from rodeco.plugins import BuildContext, default_plugins


def options(group: str) -> list[str]:
    """The options of a config group, from rodeco's conf/ and every plugin's config dir (as Hydra sees them)."""
    dirs = [conf_dir(), *map(Path, default_plugins().config_dirs())]
    found = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
    assert found, f"no options of group {group!r} in {dirs}"
    return found


def test_the_option_lists_are_what_ships():
    assert {"cpu", "cuda", "unlimited"} <= set(options("budget"))
    assert {"fixed", "none", "adaptive", "correlation"} <= set(options("policy"))
    assert {"minilm_rm", "logprob", "preference_rm", "composite", "custom"} <= set(options("reward"))
    assert {"efficiency", "perplexity", "correlation", "engine_bench", "rm_train", "rm_eval", "rm_bench"} <= set(
        options("experiment"))


def test_default_config_composes_and_validates():
    cfg = rodeco.load_config()
    validate(cfg)
    assert cfg.policy.name == "fixed" and cfg.reward.name == "minilm_rm" and cfg.task == "decode"
    assert cfg.data.path is None and len(cfg.data.prompts) == 3


@pytest.mark.parametrize("group", ["reward", "policy"])
def test_every_plugin_option_builds(group, tiny_gen):
    plugins = default_plugins()
    registry = plugins.rewards if group == "reward" else plugins.policies
    built = 0
    for opt in options(group):
        cfg = rodeco.load_config([f"{group}={opt}"])
        name, _ = split_node(cfg[group], group)
        if getattr(registry.get(name).factory, "needs_network", False):
            continue
        ctx = BuildContext(generator=tiny_gen(), device="cpu", plugins=plugins)
        obj = plugins.build_reward(cfg[group], ctx) if group == "reward" else plugins.build_policy(cfg[group], ctx)
        assert isinstance(obj, rodeco.Reward if group == "reward" else rodeco.Policy), opt
        built += 1
    assert built >= 4


def test_every_budget_option_gives_its_budget(monkeypatch):
    cpu = SimpleNamespace(device=torch.device("cpu"), kv_bytes_per_token=1024)  # what make_budget reads
    cuda = SimpleNamespace(device=torch.device("cuda"), kv_bytes_per_token=1024, layer_devices=lambda: {"cuda": 30})
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    got = {}
    for opt in options("budget"):
        cfg = rodeco.load_config([f"budget={opt}"])
        validate(cfg)
        got[opt] = (make_budget(cfg, cpu), make_budget(cfg, cuda))
    from_device = budget_from_device(10 * 2**30, 1024, 0.9, 2 * 2**30)  # (10 - 2) GiB * 0.9 / 1 KiB
    assert from_device == int(8 * 2**30 * 0.9 // 1024)
    assert got["cpu"] == (Budget(2048, 8), Budget(2048, 8))  # a fixed budget, on any device
    assert got["unlimited"] == (Budget(None, 8), Budget(from_device, 8))  # no limit on CPU; free memory on CUDA
    assert got["cuda"] == (Budget(None, 8), Budget(from_device, 8))


def test_every_generator_option_composes():
    for opt in options("generator"):
        cfg = rodeco.load_config([f"generator={opt}", "generator.model=some/model"])
        assert cfg.generator.model == "some/model" and cfg.generator.engine in ("auto", "fast", "hf")


def test_every_data_option_loads():
    for opt in options("data"):
        cfg = rodeco.load_config([f"data={opt}"])
        if cfg.data.path and not (REPO / cfg.data.path).exists():
            pytest.skip(f"{cfg.data.path} is absent (../shared/data is not beside the repo)")
        cwd = os.getcwd()
        os.chdir(REPO)
        try:
            prompts = prompts_of(cfg.data)
        finally:
            os.chdir(cwd)
        assert prompts and all(p.text.strip() for p in prompts)


def test_every_experiment_composes_with_its_schema():
    plugins = default_plugins()
    for opt in options("experiment"):
        cfg = rodeco.load_config([f"experiment={opt}"])
        assert cfg.task == opt
        entry = plugins.experiments.get(opt)
        assert OmegaConf.get_type(cfg.experiment_args) is entry.args, opt  # typed: a typo fails at compose time
        assert not OmegaConf.missing_keys(cfg.experiment_args), opt  # every argument has its value in the YAML


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
