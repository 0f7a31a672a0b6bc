"""``scripts/paged_memory.py``: one Speculative Rejection batch on the fast and the paged engine at one budget."""

from __future__ import annotations

import json

from rodeco.experiments.bench import paged_memory


def test_both_engines_stay_within_the_budget_and_the_ratios_are_printed(tiny_gen, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--data", "demo", "--prompts", "2", "--n", "8", "--max-tokens", "40"]
    out = paged_memory.main([*args, "--kv-tokens", "600"], generator=tiny_gen("fast"))
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-2].startswith("paged_over_fast_peak_kv: ") and printed[-1].startswith("paged_pool_over_fast")
    fast, paged = out["engines"]["fast"], out["engines"]["paged"]
    assert 0 < fast["peak_kv_tokens"] <= 600 and 0 < paged["peak_kv_tokens"] <= 600
    assert fast["pool_tokens"] is None and paged["pool_tokens"] >= paged["peak_kv_tokens"]
    assert paged["decision_points"] > 0 and fast["decision_points"] > 0
    assert out["paged_over_fast_peak_kv"] == paged["peak_kv_tokens"] / fast["peak_kv_tokens"]
    assert json.loads((tmp_path / "paged_memory.json").read_text())["engines"]["paged"] == paged
