"""``scripts/paged_memory.py``: one Speculative Rejection batch at a budget, its memory and first decision point, and
its figures over a baseline's."""

from __future__ import annotations

import json

from rodeco.experiments.bench import paged_memory


def test_the_batch_stays_within_its_pool_and_the_ratios_to_a_baseline_are_printed(tiny_gen, tmp_path, capsys):
    args = ["--data", "demo", "--prompts", "2", "--n", "8", "--max-tokens", "40", "--kv-tokens", "600"]
    base = paged_memory.main([*args, "--out", str(tmp_path / "a")], generator=tiny_gen("fast"))["figures"]
    assert 0 < base["peak_kv_tokens"] <= base["pool_tokens"] <= 600  # the pool is the budget, fixed
    assert base["decision_points"] > 0 and base["tokens_before_first_decision"] > 0
    rows, clock = base["first_decision_rows"], base["first_decision_clock"]
    assert base["tokens_before_first_decision"] == sum(r * c for r, c in zip(rows, clock))
    capsys.readouterr()
    out = paged_memory.main(
        [
            *args,
            "--engine",
            "hf",
            "--out",
            str(tmp_path / "b"),
            "--baseline",
            str(tmp_path / "a" / "paged_memory.json"),
        ],
        generator=tiny_gen("fast"),
    )
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-3].startswith("tokens_before_first_decision_over_baseline: ")
    hf = out["figures"]
    assert out["over_baseline"]["peak_kv_tokens"] == hf["peak_kv_tokens"] / base["peak_kv_tokens"]
    assert hf["engine"] == "HFEngine" and hf["pool_tokens"] is None
    snap = json.loads((tmp_path / "b" / "paged_memory.json").read_text())
    assert snap["figures"] == hf and snap["baseline"] == base  # both sides of each ratio
