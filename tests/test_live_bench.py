"""``scripts/vllm_bench.py --engine fast``: Speculative Rejection against Best-of-N inside rodeco's own engine at
equal memory, Best-of-N in waves of ``--memory-of`` rows (the vLLM form is in ``tests/test_vllm.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a live benchmark


def test_the_live_bench_on_the_fast_engine_runs_best_of_n_in_waves_within_the_memory(tmp_path, tiny_model_dir):
    p = subprocess.run(
        [
            sys.executable,
            "scripts/vllm_bench.py",
            "--engine",
            "fast",
            "--model",
            str(tiny_model_dir),
            "--prompts",
            "2",
            "--new-tokens",
            "12",
            "--bon",
            "8",
            "--memory-of",
            "4",
            "--bootstrap",
            "50",
            "--reward",
            "logprob",
            "--out",
            str(tmp_path),
        ],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wall-time speedup of SR over it" in p.stdout
    res = json.loads((tmp_path / "vllm_bench.json").read_text())
    pool = res["summary"]["pool_tokens"]
    assert res["summary"]["engine"] == "fast" and len(res["rows"]) == 2
    for r in res["rows"]:
        assert r["bon_8"]["decodes"] == 2 and r["bon_8"]["n_start"] == 8  # two waves of 4 rows
        assert r["sr"]["decodes"] == 1 and r["sr"]["n_start"] > 4  # SR starts wider than a wave in the same memory
        assert max(r["sr"]["peak_kv_tokens"], r["bon_8"]["peak_kv_tokens"]) <= pool
    bad = subprocess.run(
        [
            sys.executable,
            "scripts/vllm_bench.py",
            "--engine",
            "fast",
            "--model",
            str(tiny_model_dir),
            "--prompts",
            "1",
            "--bon",
            "6",
            "--memory-of",
            "4",
        ],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bad.returncode != 0 and "--bon 6" in bad.stderr and "multiple" in bad.stderr
