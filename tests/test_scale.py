"""Scaling out: shards over Hydra launchers, merge, kill and resume, OOM back-off, plugin failures,
``generator.device_map``. CLI runs use the tiny model saved to disk; each launcher runs real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import run_tiny

import rodeco
from rodeco.common.validation import ConfigError

pytestmark = pytest.mark.slow  # sharded runs in subprocesses

RODECO = Path(sys.executable).with_name("rodeco")
SETTINGS = [
    "data.path=prompts.jsonl",
    "reward=logprob",
    "n=4",
    "sampling.max_new_tokens=24",
    "budget.kv_tokens=300",
    "output.progress=false",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}


def rodeco_cli(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(RODECO), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=ENV)


def write_prompts(where: Path, n: int) -> None:
    (where / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(n))
    )


def records(path: Path) -> list[dict]:
    """A results file's records without their compute shares (their timings differ from run to run)."""
    return [{k: v for k, v in json.loads(x).items() if k != "compute"} for x in path.read_text().splitlines()]


def unsharded(tmp_path: Path, model: Path, n_prompts: int, *settings: str) -> tuple[list[str], Path]:
    """``n_prompts`` prompts written to ``tmp_path``, the run's arguments, and the directory of one unsharded run
    of them: what the shards must reproduce."""
    write_prompts(tmp_path, n_prompts)
    given = {x.split("=")[0] for x in settings}
    args = [*(x for x in SETTINGS if x.split("=")[0] not in given), f"generator.model={model}", *settings]
    p = rodeco_cli([*args, "hydra.run.dir=single"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return args, tmp_path / "single"


def launcher_installed(name: str) -> None:
    pytest.importorskip(f"hydra_plugins.hydra_{name}_launcher", reason="pip install 'rodeco[scale]'")


def test_two_joblib_shards_merged_equal_one_unsharded_run(tiny_model_dir: Path, tmp_path: Path):
    """Whole batches are dealt to shards, so even with Speculative Rejection deciding per batch (2 prompts share
    the budget) the merged shards are the unsharded run: winners, texts, scores, rounds, and the compute."""
    launcher_installed("joblib")
    args, single = unsharded(tmp_path, tiny_model_dir, 8, "data.batch_prompts=2", "budget.kv_tokens=120")
    p = rodeco_cli(
        [
            "--multirun",
            *args,
            "data.num_shards=2",
            "data.shard=range(2)",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert "1 thread(s) of" in (tmp_path / "sweep/0/cli.log").read_text() or os.cpu_count() > 2
    m = rodeco_cli(["task=merge", "merge.dir=sweep", "output.alpaca_eval=tiny"], cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    merged = records(tmp_path / "sweep/results.jsonl")
    assert [r["prompt_index"] for r in merged] == list(range(8))
    assert merged == records(single / "results.jsonl")
    assert any(r["rounds"] for r in merged)  # decisions were made: the batches matter
    total, parts = (json.loads((d / "summary.json").read_text()) for d in (single, tmp_path / "sweep"))
    for k in ("gen_prefill_tokens", "gen_decode_tokens", "gen_flops", "reward_calls", "decode_steps"):
        assert parts["compute"][k] == total["compute"][k], k
    assert parts["complete"] and [s["n_prompts"] for s in parts["shards"]] == [4, 4]
    outputs = json.loads((tmp_path / "sweep/model_outputs.json").read_text())
    assert [o["output"] for o in outputs] == [r["best"]["text"] for r in merged]


def shard_pid(log: Path) -> int | None:
    """The process that holds ``log`` (a shard's Hydra job log) open."""
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == str(log.resolve()):
                return int(fd.parts[2])
        except OSError:
            continue
    return None


def pid_after_first_result(proc: subprocess.Popen, run_dir: Path) -> int:
    """Once the job of ``run_dir`` has written its first result: its process (it holds the job's log open)."""
    results, deadline = run_dir / "results.jsonl", time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if results.is_file() and results.read_text().strip():
            pid = shard_pid(run_dir / "cli.log")
            if pid is not None:
                return pid
        time.sleep(0.1)
    raise AssertionError(f"{run_dir} never wrote a result (the multirun exited {proc.poll()})")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the shard's process through /proc")
def test_a_shard_killed_mid_run_is_completed_by_rerunning_the_multirun(tiny_model_dir: Path, tmp_path: Path):
    """SIGKILL one joblib shard mid-run (nothing can be saved at that moment). Rerunning the same multirun command
    decodes only the prompts missing from each shard, and the merge equals the unsharded run."""
    launcher_installed("joblib")
    args, single = unsharded(tmp_path, tiny_model_dir, 30, "data.batch_prompts=1")
    multirun = [
        str(RODECO),
        "--multirun",
        *args,
        "data.num_shards=2",
        "data.shard=range(2)",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweep.dir=sweep",
    ]
    proc = subprocess.Popen(multirun, cwd=tmp_path, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.kill(pid_after_first_result(proc, tmp_path / "sweep/1"), signal.SIGKILL)
    proc.communicate(timeout=240)
    before = {
        d: records(tmp_path / f"sweep/{d}/results.jsonl")
        for d in (0, 1)
        if (tmp_path / f"sweep/{d}/results.jsonl").is_file()
    }
    n_before = sum(map(len, before.values()))
    assert 1 <= len(before[1]) < 15, "shard 1 was not killed mid-run"
    m = rodeco_cli(["task=merge", "merge.dir=sweep"], cwd=tmp_path)
    assert m.returncode == 1 and "prompts are in no shard's results" in m.stderr, m.stderr
    again = rodeco_cli(multirun[1:], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    decoded = [int(x) for x in re.findall(r"decoding (\d+) of 15 prompts", again.stdout + again.stderr)]
    assert len(decoded) == 2 and sum(decoded) == 30 - n_before  # only the missing prompts, counted
    for d, recs in before.items():  # what was written before the kill is untouched
        assert records(tmp_path / f"sweep/{d}/results.jsonl")[: len(recs)] == recs
    m = rodeco_cli(["task=merge", "merge.dir=sweep"], cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    assert records(tmp_path / "sweep/results.jsonl") == records(single / "results.jsonl")


def test_submitit_local_runs_a_shard(tiny_model_dir: Path, tmp_path: Path):
    launcher_installed("submitit")
    args, single = unsharded(tmp_path, tiny_model_dir, 6, "data.batch_prompts=1")
    p = rodeco_cli(
        [
            "--multirun",
            *args,
            "data.num_shards=3",
            "data.shard=1",
            "hydra/launcher=submitit_local",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    got = records(tmp_path / "sweep/0/results.jsonl")
    assert [r["prompt_index"] for r in got] == [1, 4]
    assert got == [r for r in records(single / "results.jsonl") if r["prompt_index"] in (1, 4)]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the shard's process through /proc")
def test_submitit_requeues_a_preempted_shard_which_resumes_after_its_last_prompt(tiny_model_dir: Path, tmp_path: Path):
    """SLURM's preemption warning is SIGUSR2 to the job: submitit checkpoints and requeues it (its local executor
    does what SLURM would), and the requeued job resumes from its results: complete, equal to one run."""
    launcher_installed("submitit")
    args, single = unsharded(tmp_path, tiny_model_dir, 30, "data.batch_prompts=1")
    proc = subprocess.Popen(
        [str(RODECO), "--multirun", *args, "hydra/launcher=submitit_local", "hydra.sweep.dir=sweep"],
        cwd=tmp_path,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    results, log = tmp_path / "sweep/0/results.jsonl", tmp_path / "sweep/0/cli.log"
    os.kill(pid_after_first_result(proc, tmp_path / "sweep/0"), signal.SIGUSR2)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    job_logs = "".join(p.read_text() for p in (tmp_path / "sweep/.submitit").glob("**/*_log.*"))
    assert "Requeued job" in job_logs
    assert re.search(r"resuming: \d+ of 30 prompts already", log.read_text())
    assert records(results) == records(single / "results.jsonl")


def test_ray_runs_two_shards_on_a_local_instance(tiny_model_dir: Path, tmp_path: Path):
    launcher_installed("ray")
    args, single = unsharded(tmp_path, tiny_model_dir, 6, "data.batch_prompts=2")
    p = rodeco_cli(
        [
            "--multirun",
            *args,
            "data.num_shards=2",
            "data.shard=range(2)",
            "hydra/launcher=ray",
            "+hydra.launcher.ray.init.num_cpus=2",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    m = rodeco_cli(["task=merge", "merge.dir=sweep"], cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    assert records(tmp_path / "sweep/results.jsonl") == records(single / "results.jsonl")


@pytest.mark.parametrize("launcher", ["rodeco_slurm", "rodeco_ray"])
def test_the_shipped_cluster_launcher_configs_compose(launcher: str, tmp_path: Path):
    """The SLURM and Ray-cluster configs (they need a cluster to run): they compose over the plugins' own."""
    launcher_installed("submitit" if "slurm" in launcher else "ray")
    p = rodeco_cli([f"hydra/launcher={launcher}", "--cfg", "hydra", "--package", "hydra.launcher"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    if launcher == "rodeco_slurm":
        assert "gpus_per_task: 1" in p.stdout and "timeout_min: 240" in p.stdout and "partition:" in p.stdout
        assert "SlurmLauncher" in p.stdout
    else:
        assert "address: auto" in p.stdout and "num_gpus: 1" in p.stdout and "RayLauncher" in p.stdout


def fake_shard(root: Path, name: str, overrides: dict, prompts: list[int]) -> None:
    cfg = rodeco.load_config([f"{k}={v}" for k, v in overrides.items()])
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra/config.yaml").write_text(__import__("omegaconf").OmegaConf.to_yaml(cfg))
    (d / "results.jsonl").write_text(
        "".join(json.dumps({"prompt_index": i, "prompt": f"p{i}", "best": {"text": f"r{i}"}}) + "\n" for i in prompts)
    )


def test_merge_refuses_shards_run_with_different_settings_and_names_the_keys(tmp_path: Path):
    common = {"data.prompts": "[a,b,c,d]", "data.path": "null", "data.num_shards": 2}
    fake_shard(tmp_path / "sweep", "0", {**common, "data.shard": 0, "n": 8}, [0, 2])
    fake_shard(tmp_path / "sweep", "1", {**common, "data.shard": 1, "n": 16, "policy.alpha": 0.7}, [1, 3])
    p = rodeco_cli(["task=merge", "merge.dir=sweep"], cwd=tmp_path)
    assert p.returncode == 2
    assert "differ in settings" in p.stderr and "n (0: 8, 1: 16)" in p.stderr and "policy.alpha" in p.stderr
    assert "data.shard" not in p.stderr.split("Fix:")[0]  # the shard's own key may differ
    assert not (tmp_path / "sweep/results.jsonl").exists()


def test_merge_lists_missing_prompts_and_fails_until_none_are_missing(tmp_path: Path):
    common = {"data.prompts": "[a,b,c,d,e]", "data.path": "null", "data.num_shards": 2}
    fake_shard(tmp_path / "sweep", "0", {**common, "data.shard": 0}, [0, 4])
    fake_shard(tmp_path / "sweep", "1", {**common, "data.shard": 1}, [1])
    p = rodeco_cli(["task=merge", "merge.dir=sweep"], cwd=tmp_path)
    assert p.returncode == 1 and "2 of 5 prompts are in no shard's results: prompt_index 2, 3" in p.stderr
    summary = json.loads((tmp_path / "sweep/summary.json").read_text())
    assert summary["missing"] == [2, 3] and not summary["complete"]
    assert [json.loads(x)["prompt_index"] for x in (tmp_path / "sweep/results.jsonl").read_text().splitlines()] == [
        0,
        1,
        4,
    ]
    p = rodeco_cli(["task=merge"], cwd=tmp_path)
    assert p.returncode == 2 and "merge.dir" in p.stderr


def test_cpu_share_of_threads_under_joblib():
    from rodeco.cli import cpu_share

    assert cpu_share(n_jobs=-1, jobs=2, cpus=16) == 8  # 2 shards, all cores: 8 threads each
    assert cpu_share(n_jobs=4, jobs=8, cpus=16) == 4  # 4 at a time
    assert cpu_share(n_jobs=-1, jobs=32, cpus=16) == 1
    assert cpu_share(n_jobs=-2, jobs=64, cpus=9) == 1


def test_device_map_auto_runs_with_the_hf_engine(tiny_model_dir: Path):
    """``generator.device_map=auto`` loads through accelerate (here: every layer on the CPU), picks the hf engine,
    and decodes what the same model on one device decodes."""
    pytest.importorskip("accelerate")
    from omegaconf import OmegaConf

    from rodeco.core.loading import load_generator

    base = {
        "model": str(tiny_model_dir),
        "gguf_file": None,
        "dtype": "float32",
        "device": "cpu",
        "engine": "hf",
        "chat_template": True,
        "system_prompt": None,
        "trust_remote_code": False,
    }
    spread = load_generator(OmegaConf.create({**base, "engine": "auto", "device_map": "auto"}))
    assert spread.engine_kind == "hf" and set(spread.layer_devices()) == {"cpu"}
    one = load_generator(OmegaConf.create({**base, "device_map": None}))
    ov = ["budget.kv_tokens=200", "sampling.max_new_tokens=12"]
    a, b = (run_tiny(g, ["w0 w1", "w1 w2"], n=4, overrides=ov) for g in (spread, one))
    assert [r.best.token_ids for r in a.results] == [r.best.token_ids for r in b.results]
    with pytest.raises(ConfigError, match="generator.engine"):
        load_generator(OmegaConf.create({**base, "engine": "fast", "device_map": "auto"}))


def test_scale_bench_script_prints_the_ratio(tiny_model_dir: Path, tmp_path: Path):
    """docs/scale.md's throughput command, on the tiny model: both sides run, merge, and agree."""
    write_prompts(tmp_path, 8)
    script = Path(__file__).resolve().parents[1] / "scripts/scale_bench.py"
    p = subprocess.run(
        [
            sys.executable,
            str(script),
            "--out",
            "bench",
            "--threads",
            "2",
            "--",
            "data.path=prompts.jsonl",
            f"generator.model={tiny_model_dir}",
            "reward=logprob",
            "budget.kv_tokens=300",
            "sampling.max_new_tokens=16",
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr + p.stdout
    res = json.loads((tmp_path / "bench/scale_bench.json").read_text())
    assert res["same_choices"] and res["tokens_single"] == res["tokens_sharded"] > 0
    assert res["max_score_difference"] < 1e-4
    assert f"ratio_sharded_over_single: {res['ratio_sharded_over_single']}" in p.stdout


def test_cost_model_script_prints_the_table(tmp_path: Path):
    script = Path(__file__).resolve().parents[1] / "scripts/cost_model.py"
    p = subprocess.run(
        [sys.executable, str(script), "--prompt-tokens", "67", "--json", str(tmp_path / "c.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    bon = {r["gpus"]: r for r in rows if r["method"] == "Best-of-N"}
    sr = {r["gpus"]: r for r in rows if r["method"] != "Best-of-N"}
    assert set(bon) == {1, 8, 64} and "| Best-of-N | 64 |" in p.stdout
    assert bon[1]["wall_h"] > bon[8]["wall_h"] > bon[64]["wall_h"]  # more GPUs: shorter
    assert bon[64]["gpu_h_slurm"] > bon[1]["gpu_h_slurm"]  # ... but each shard loads the models once more
    assert sr[1]["gpu_h_slurm"] < bon[1]["gpu_h_slurm"]


def test_shard_i_runs_on_gpu_i_mod_device_count(monkeypatch):
    """One shard per GPU under joblib: generator.device=auto becomes cuda:(shard % device_count)."""
    from rodeco.runner import shard_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    devices = [shard_device(rodeco.load_config(["data.num_shards=6", f"data.shard={i}"])).device for i in range(6)]
    assert devices == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert (
        shard_device(rodeco.load_config(["data.num_shards=6", "data.shard=5", "generator.device=cuda:3"])).device
        == "cuda:3"
    )  # an explicit device is kept
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert shard_device(rodeco.load_config(["data.num_shards=6", "data.shard=5"])).device == "auto"


def test_a_failing_job_of_a_multirun_is_reported_after_the_others_ran(tiny_model_dir: Path, tmp_path: Path):
    """Shard 2 of 2 does not exist: that job fails with the key named, the other jobs complete, the exit is 2."""
    write_prompts(tmp_path, 4)
    p = rodeco_cli(
        [
            "--multirun",
            *SETTINGS,
            f"generator.model={tiny_model_dir}",
            "data.num_shards=2",
            "data.batch_prompts=1",
            "data.shard=2,0,1",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 2
    assert re.search(r"rodeco: error: job 0 \(.*data.shard=2\): data.shard=2: must be in 0..1", p.stderr), p.stderr
    for d in ("1", "2"):  # jobs 1 and 2 ran shards 0 and 1
        assert (tmp_path / f"sweep/{d}/results.jsonl").read_text().strip()
