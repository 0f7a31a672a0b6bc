"""``scripts/search_bench.py``'s live runs: which methods run on which prompts and sets, and how
particle_filter's temperature is set (a grid on the selection half, or given)."""

from __future__ import annotations

import argparse

from helpers import load_script


def fake_run(calls: list):
    def run(i: int, node: dict, n: int, kv: int, first: int) -> dict:
        calls.append((i, dict(node), first))
        return {"best": -abs(node.get("temperature", 1.0) - 0.5) + i / 100}  # 0.5 is the best temperature

    return run


def args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(
        run_dir=tmp_path,
        pool="pool",
        compile=False,
        report_only=True,
        methods=["particle_filter_start_16"],
        firsts=[0],
        pf_grid=[0.25, 0.5, 1.0],
        pf_temperature=None,
        alternatives=False,
    )
    return argparse.Namespace(**{**base, **kw})


def test_particle_filter_temperature_is_chosen_on_the_selection_half_or_given(tmp_path, monkeypatch):
    sb = load_script("search_bench")
    records = [{"prompt_index": i, "budget": {"1": 100}} for i in range(4)]
    sel, rep = [0, 1], [2, 3]
    calls: list = []
    monkeypatch.setattr(sb, "live_runner", lambda *a, **k: fake_run(calls))
    done = sb.run_searches(args(tmp_path / "grid"), records, sel, rep)
    grid = [(i, n["temperature"]) for i, n, _ in calls if i in sel]
    assert sorted(grid) == sorted((i, t) for i in sel for t in (0.25, 0.5, 1.0))
    assert {n["temperature"] for i, n, _ in calls if i in rep} == {0.5}  # the grid's best, on the report half
    assert set(done[2]["methods"]) == {"particle_filter_start_16"}

    calls.clear()
    sb.run_searches(args(tmp_path / "given", pf_temperature=0.25), records, sel, rep)
    assert [(i, n["temperature"]) for i, n, _ in calls] == [(2, 0.25), (3, 0.25)]  # no grid, the report half only


def test_best_of_n_sizes_follow_the_candidate_sets():
    sizes = load_script("search_judged").set_sizes
    assert sizes([0, 64], 128) == [1, 2, 4, 8, 16, 32, 64]
    assert sizes([0], 16) == [1, 2, 4, 8, 16]  # one set of a 16-candidate pool
    assert sizes([0], 100) == [1, 2, 4, 8, 16, 32, 64]
    assert sizes([0, 8], 24) == [1, 2, 4, 8]  # the smaller set bounds both
