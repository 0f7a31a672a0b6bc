"""``scripts/gpu_check.py`` on a CPU: its arguments, its report (JSON and Markdown), the skip without CUDA, one
step's failure not losing the others, the time limit, and every CPU-runnable step end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from rodeco.experiments.bench import gpu_check

pytestmark = pytest.mark.slow  # subprocesses of the GPU check


@pytest.fixture()
def gc():
    return gpu_check


def read(out):
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


def test_arguments(gc, tmp_path):
    a = gc.parse([])
    assert (a.device, a.dtype, a.model, a.quick, a.time_limit, a.data) == (
        "cuda",
        "bfloat16",
        "smollm2",
        False,
        480.0,
        "alpacafarm100",
    )
    assert a.steps.split(",") == ["greedy", "survivors", "engine_bench", "syncs", "efficiency", "budget", "oom"]
    a = gc.parse(["--device", "cpu", "--quick", "--out", str(tmp_path), "--steps", "oom,greedy", "--time-limit", "60"])
    assert (a.device, a.quick, a.out, a.steps, a.time_limit) == ("cpu", True, str(tmp_path), "oom,greedy", 60.0)
    with pytest.raises(SystemExit):
        gc.parse(["--steps", "greedy,warp"])


def test_without_cuda_it_says_so_and_exits_0(gc, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gc.main(["--out", str(tmp_path)]) == 0
    report, md = read(tmp_path)
    assert report["skipped"].startswith("no CUDA device") and report["steps"] == {}
    assert "**skipped: no CUDA device" in md and "skipped: no CUDA" in capsys.readouterr().out


def test_a_failing_step_is_recorded_and_the_others_still_run(gc, tmp_path, monkeypatch):
    def boom(c):
        raise RuntimeError("the engine fell over")

    monkeypatch.setattr(
        gc,
        "STEP_FNS",
        {
            "greedy": boom,
            "survivors": lambda c: {"ok": True, "peak": 1.5},
            "budget": lambda c: {"ok": False, "why": "over"},
        },
    )
    assert gc.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "greedy,survivors,budget"]) == 1
    report, md = read(tmp_path)
    s = report["steps"]
    assert s["greedy"]["ok"] is False and s["greedy"]["error"] == "RuntimeError: the engine fell over"
    assert s["survivors"] == {"ok": True, "peak": 1.5, "step_seconds": s["survivors"]["step_seconds"]}
    assert s["budget"]["ok"] is False and report["failed"] == ["greedy", "budget"]
    assert "| greedy | False |" in md and "| survivors | True |" in md and "the engine fell over" in md


def test_steps_after_the_time_limit_are_skipped(gc, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(
        gc,
        "STEP_FNS",
        {"greedy": lambda c: ran.append(1) or {"ok": True}, "survivors": lambda c: ran.append(2) or {"ok": True}},
    )
    assert gc.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "greedy,survivors", "--time-limit", "0"]) == 0
    report, _ = read(tmp_path)
    assert ran == [] and all(s["skipped"] == "the time limit was reached" for s in report["steps"].values())


def test_first_divergence(gc):
    assert gc.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert gc.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert gc.first_divergence([1, 2], [1, 2, 3]) == 2


@pytest.mark.integration
def test_the_cpu_steps_pass_on_a_tiny_model(gc, tmp_path, tiny_model_dir):
    """greedy, survivors, syncs, engine_bench and efficiency with --device cpu --quick on a tiny Llama saved to disk
    (budget
    and oom need CUDA: they say so)."""
    code = gc.main(
        [
            "--device",
            "cpu",
            "--quick",
            "--dtype",
            "float32",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path),
            "--data",
            "demo",
        ]
    )
    report, md = read(tmp_path)
    assert code == 0, md
    s = report["steps"]
    for engine in ("fast", "hf"):
        assert s["greedy"][engine]["exact"] == 4  # fp32 on a CPU: the same kernels' order as generate()
        sv = s["survivors"][engine]
        assert sv["rejected"] > 0 and sv["mismatches"] == 0 and sv["within_budget"]
        assert sv["survivors_equal"] + sv["rejected"] == 2 * gc.Sizes.quick().rows
    assert s["budget"]["skipped"].startswith("needs CUDA") and s["oom"]["skipped"].startswith("needs CUDA")
    sy = s["syncs"]  # eager only on CPU, without the sync debug mode (CUDA's)
    assert sy["fast"]["same_tokens"] and sy["fast"]["lagged"]["tokens_per_s"] > 0 and "fast-compiled" not in sy
    assert sy["sync_debug"].startswith("needs CUDA")
    assert s["engine_bench"]["speedup_vs_hf_generate"] > 0
    compiled = s["engine_bench"]["engines"]["fast-compiled"]  # generator.compile=true: compiled in the warm-up
    assert compiled["tokens_per_s"] > 0 and compiled["compiles_warm_up"] >= 1 and compiled["compiles_timed"] == 0
    # which kernel the linears ran on: MKL's under compile on an Intel CPU in fp32, oneDNN's eager
    from rodeco.core.loading import load_model_and_tokenizer
    from rodeco.engines.compiled import CompiledStep

    intel = CompiledStep.uses_mkl(load_model_and_tokenizer(str(tiny_model_dir), dtype="float32", device="cpu")[0])
    assert compiled["linears"] == ("mkl" if intel else "onednn")
    engines = s["engine_bench"]["engines"]
    assert engines["fast"]["linears"] == "onednn"
    eff = s["efficiency"]  # vllm_bench.py on the fast engine: SR within Best-of-4's memory, Best-of-N in waves of 4
    assert eff["data"] == "demo" and eff["prompts"] == 2 and eff["engine"] == "fast" and eff["memory_of"] == 4
    assert set(eff["methods"]) == {"sr", "bon_4", "bon_8"} and eff["command"].startswith("python scripts/vllm_bench")
    ratio, lo, hi = eff["methods"]["bon_8"]["speedup_vs_sr"]
    assert 0 < lo <= ratio <= hi
    assert (tmp_path / "efficiency" / "vllm_bench.json").is_file()  # prompt by prompt
