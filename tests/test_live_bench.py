"""``scripts/vllm_bench.py --engine fast``: Speculative Rejection against Best-of-N inside rodeco's own engine at
equal memory, Best-of-N in waves of ``--memory-of`` rows (the vLLM form is in ``tests/test_vllm.py``)."""

from __future__ import annotations

import pytest
from helpers import vllm_bench, vllm_bench_results

pytestmark = pytest.mark.slow  # a live benchmark


def test_the_live_bench_on_the_fast_engine_runs_best_of_n_in_waves_within_the_memory(tmp_path, tiny_model_dir):
    fast = ["--engine", "fast", "--model", str(tiny_model_dir)]
    args = "--prompts 2 --new-tokens 12 --bon 8 --memory-of 4 --bootstrap 50 --reward logprob".split()
    res = vllm_bench_results(*fast, *args, out=tmp_path)
    pool = res["summary"]["pool_tokens"]
    assert res["summary"]["engine"] == "fast" and len(res["rows"]) == 2
    for r in res["rows"]:
        assert r["bon_8"]["decodes"] == 2 and r["bon_8"]["n_start"] == 8  # two waves of 4 rows
        assert r["sr"]["decodes"] == 1 and r["sr"]["n_start"] > 4  # SR starts wider than a wave in the same memory
        assert max(r["sr"]["peak_kv_tokens"], r["bon_8"]["peak_kv_tokens"]) <= pool
    bad = vllm_bench(*fast, *"--prompts 1 --bon 6 --memory-of 4".split())
    assert bad.returncode != 0 and "--bon 6" in bad.stderr and "multiple" in bad.stderr
