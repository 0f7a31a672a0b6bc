"""``scripts/gpu_check.py`` on a CPU: its arguments, its report (JSON and Markdown), the skip without CUDA, one
step's failure not losing the others, the time limit, and every step's logic end to end on a tiny model."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch
from conftest import REPO


@pytest.fixture()
def gc_mod(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    for name in ("gpu_check", "gpu_check_steps"):
        sys.modules.pop(name, None)
    mod = importlib.import_module("gpu_check")
    yield mod
    for name in ("gpu_check", "gpu_check_steps"):
        sys.modules.pop(name, None)


def read(out):
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_arguments(gc_mod, tmp_path):
    a = gc_mod.parse_args([])
    assert (a.device, a.dtype, a.model, a.quick, a.time_limit) == ("cuda", "bfloat16", "smollm2", False, 480.0)
    assert a.steps.split(",") == ["engines", "memory", "oom", "engine_bench", "efficiency"]
    a = gc_mod.parse_args(["--device", "cpu", "--quick", "--out", str(tmp_path), "--model", "x", "--random-init",
                           "--steps", "oom,engines", "--time-limit", "60"])
    assert (a.device, a.quick, a.out, a.random_init, a.steps, a.time_limit) == ("cpu", True, tmp_path, True,
                                                                               "oom,engines", 60.0)
    with pytest.raises(SystemExit):
        gc_mod.parse_args(["--steps", "engines,warp"])


def test_without_cuda_it_says_so_and_exits_0(gc_mod, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gc_mod.main(["--out", str(tmp_path)]) == 0
    report, md = read(tmp_path)
    assert report["status"] == "skipped: no CUDA" and report["steps"] == {}
    assert "**Status: skipped: no CUDA**" in md and "skipped: no CUDA" in capsys.readouterr().out


def test_a_failing_step_is_recorded_and_the_others_still_run(gc_mod, tmp_path, monkeypatch):
    def boom(ctx):
        raise RuntimeError("the engine fell over")

    steps = {"engines": boom, "memory": lambda ctx: {"ok": True, "peak": 1.5, "nested": {"a": [1, 2]}},
             "oom": lambda ctx: {"ok": False, "why": "no warning"}}
    monkeypatch.setattr(gc_mod, "STEPS", steps)
    assert gc_mod.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "engines,memory,oom"]) == 1
    report, md = read(tmp_path)
    s = report["steps"]
    assert report["status"] == "fail"
    assert s["engines"]["status"] == "error" and "RuntimeError: the engine fell over" in s["engines"]["error"]
    assert s["memory"]["status"] == "pass" and s["memory"]["result"]["peak"] == 1.5
    assert s["oom"]["status"] == "fail"
    assert "| engines | error |" in md and "| memory | pass |" in md and "- nested.a: [1, 2]" in md
    assert "RuntimeError: the engine fell over" in md


def test_steps_after_the_time_limit_are_skipped(gc_mod, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(gc_mod, "STEPS", {"engines": lambda ctx: ran.append(1) or {"ok": True},
                                          "memory": lambda ctx: ran.append(2) or {"ok": True}})
    assert gc_mod.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "engines,memory",
                        "--time-limit", "0"]) == 0
    report, _ = read(tmp_path)
    assert ran == [] and report["status"] == "incomplete"
    assert all(s["status"].startswith("skipped: time limit") for s in report["steps"].values())


def test_overall_status(gc_mod):
    assert gc_mod.overall({"a": {"status": "pass"}, "b": {"status": "pass"}}) == "pass"
    assert gc_mod.overall({"a": {"status": "pass"}, "b": {"status": "error"}}) == "fail"
    assert gc_mod.overall({"a": {"status": "pass"}, "b": {"status": "skipped: time limit (9 s > 1 s)"}}) \
        == "incomplete"


@pytest.mark.parametrize("random_init", [False, True])
def test_every_step_passes_on_a_tiny_model_on_cpu(gc_mod, tmp_path, tiny_model_dir, random_init):
    """The whole check with --device cpu --quick on a tiny random Llama saved to disk (its own weights, or its
    config with fresh random weights); the AlpacaFarm file is missing on purpose: the built-in prompts stand in."""
    args = ["--device", "cpu", "--quick", "--dtype", "float32", "--model", str(tiny_model_dir), "--out",
            str(tmp_path), "--data-path", str(tmp_path / "missing.jsonl")] + ["--random-init"] * random_init
    if random_init:
        args += ["--steps", "engines"]
    code = gc_mod.main(args)
    report, md = read(tmp_path)
    assert code == 0 and report["status"] == "pass", md
    s = {k: v["result"] for k, v in report["steps"].items()}
    assert report["environment"]["weights"] == ("random init" if random_init else "loaded")
    for engine in ("fast", "hf"):
        e = s["engines"][engine]
        assert e["greedy_equal"] == e["greedy_runs"] == 4  # fp32 on a CPU: no tie breaks differently
        assert e["sr_vs_best_of_n"]["rejected"] > 0 and e["sr_vs_best_of_n"]["mismatches"] == []
    if random_init:
        return
    assert s["memory"]["rounds"] > 0 and s["memory"]["peak_kv_tokens"] <= s["memory"]["budget_kv_tokens"]
    assert s["oom"]["backed_off_to"] == 2 and "data.batch_prompts -> 2" in s["oom"]["warnings"][0]
    assert s["engine_bench"]["speedup_vs_hf_generate"] > 0
    eff = s["efficiency"]
    assert eff["prompt_source"].startswith("built-in")
    assert eff["speculative_rejection"]["decode_tokens"] < eff["best_of_n"]["decode_tokens"]
    assert eff["flops_ratio_bon_over_sr"] > 1
