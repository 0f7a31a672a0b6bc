"""``scripts/results_tables.py``: the docs' result tables rendered from a run's JSON (here a synthetic one, built by
the efficiency analysis on hand-made prompt records), ``check`` catching a hand-edited cell and ``write`` fixing
it, snapshots without the per-prompt records, and every marked block of the docs up to date."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO
from helpers import TM, records

from rodeco.experiments import analysis, efficiency, perplexity, render
from rodeco.experiments.bench import results_tables

rt = results_tables
SCRIPT = [sys.executable, str(REPO / "scripts" / "results_tables.py")]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REF = "fixed_alpha_0.5"
ARGS = {
    "n": 2,
    "bootstrap": 40,
    "scales": [1, 2],
    "alphas": [0.3, 0.5, 0.9],
    "adaptive_deltas": [0.1],
    "policies": ["correlation"],
    "starts": [16, 64],
    "calibrated_deltas": [0.1],
    "partial_rewards": ["same", "oracle", "text_value"],
}


def quantile(x: float):
    return lambda p, final: (np.quantile(final, x), 3e9)


def above(p: int, final: np.ndarray) -> tuple[float, float]:
    return final.max() + 1.0, 5e9  # better than Best-of-16: a lower bound


def below(p: int, final: np.ndarray) -> tuple[float, float]:
    return final.min(), 1e9  # worse than Best-of-1: an upper bound


def behaviour(label: str, i: int):
    """What each method scores: fixed alpha 0.3 above the curve, 0.9 below it; at x2 fixed alpha 0.5 and 0.3 both
    above it (their paired ratio: unknown); a start of 64 rows does not fit the budget x1."""
    if label == "fixed_alpha_0.3":
        return above
    if label == "fixed_alpha_0.9":
        return below
    if label == REF:
        return {1: quantile(0.7), 2: above}
    if label.startswith("fixed_alpha_0.5_start_64"):
        return {1: lambda p, final: None, 2: quantile(0.6)}
    return quantile(0.5 + 0.02 * i)


def run_json(args: dict[str, Any] = ARGS, prompts: int = 24) -> dict[str, Any]:
    """An efficiency.json as ``efficiency.report`` writes it (with a perplexity run's keys too where asked)."""
    labels = [m.label for m in efficiency.methods(args)]
    recs = records({k: behaviour(k, i) for i, k in enumerate(labels)}, n_prompts=prompts, scales=(1, 2))
    summary = analysis.summarize(recs, args, TM, 20, labels)
    return json.loads(json.dumps({"args": args, **summary, "headline": analysis.headline(summary), "per_prompt": recs}))


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    return run_json()


def table_rows(block: str) -> dict[str, list[str]]:
    """A rendered table's rows by their first cell (the caption and the header's separator left out)."""
    lines = [x for x in block.splitlines() if x.startswith("| ") and not x.startswith("|---")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in x.strip("|").split(" | ")] for x in lines)}


def test_budget_table_has_one_row_per_method_and_a_column_per_partial_reward(run):
    rows = table_rows(rt.render(run, "budget-1"))
    head = rows.pop("method")
    assert head[:3] == ["partial_reward=same", "partial_reward=oracle", "partial_reward=text_value"]
    bases = [
        "fixed_alpha_0.3",
        "fixed_alpha_0.5",
        "fixed_alpha_0.9",
        "adaptive_delta_0.1",
        "correlation",
        "fixed_alpha_0.5_start_16",
        "fixed_alpha_0.5_start_64",
        "calibrated_delta_0.1",
        "calibrated_delta_0.1_start_calibrated",
    ]
    assert list(rows) == bases and all(len(r) == len(head) for r in rows.values())
    t = run["methods"]
    for base, cells in rows.items():
        for part, cell in zip(("", "_oracle", "_text_value"), cells):
            r = t.get(f"{base}{part}@1", {}).get("report")
            if r:
                assert cell == render.with_ci(r["speedup_flops"], r["speedup_flops_ci"], r["bound"])
    r = t[f"{REF}@1"]["report"]
    pair = t["correlation@1"]["report"][f"vs_{REF}"]
    assert rows["correlation"][3] == f"{pair['ratio']:.2f} [{pair['ci'][0]:.2f}, {pair['ci'][1]:.2f}]"
    assert rows[REF][3:] == [
        "1.00 [1.00, 1.00]",
        f"{r['relative_compute_memory_bound_model']:.2f}",
        f"{t[f'{REF}@1']['selection']['speedup_flops']:.2f}",
    ]
    assert "Best-of-4's memory" in rt.render(run, "budget-2") and "report half (12 prompts)" in rt.render(run, "curve")


def test_bounds_are_marked(run):
    one, two = table_rows(rt.render(run, "budget-1")), table_rows(rt.render(run, "budget-2"))
    assert one["fixed_alpha_0.3"][0].startswith("≥") and one["fixed_alpha_0.3"][3].startswith("≥")  # / exact ref
    assert one["fixed_alpha_0.9"][0].startswith("≤") and one["fixed_alpha_0.9"][4].startswith("≤")
    assert not any(c[:1] in "≥≤?" for c in one[REF] if c)
    assert two["fixed_alpha_0.3"][3].startswith("?")  # both above Best-of-16's curve at x2: unknown either way
    assert two[REF][3] == "1.00 [1.00, 1.00]"  # over itself: exact


def test_a_partial_reward_not_run_shows_a_dash_and_an_infeasible_start_says_so(run):
    rows = table_rows(rt.render(run, "budget-1"))
    assert rows["fixed_alpha_0.5_start_16"][2] == "–"  # starts are swept with same and oracle only
    assert rows["calibrated_delta_0.1"][1:3] == ["–", "–"]
    assert rows["fixed_alpha_0.5_start_64"] == ["infeasible", "infeasible", "–", "", "", ""]
    assert "–" not in rows["fixed_alpha_0.3"] and "–" not in rows["correlation"]


def test_curve_and_headline_are_what_the_run_printed(run):
    curve = table_rows(rt.render(run, "curve"))
    c = run["curve"]["report"]
    assert list(curve)[1:] == [f"Best-of-{int(N)}" for N in c["N"]]
    assert curve["Best-of-4"] == render.curve_cells(c, c["N"].index(4.0), 2)
    head = analysis.headline(run)
    lines = "".join(f"{k}: {render.fmt(v)}\n" for k, v in head.items())  # as efficiency.report prints them
    assert rt.render(run, "headline") == f"```\n{lines}```\n"


def test_perplexity_snapshot_renders_its_table_and_headline(run, tmp_path):
    selection, report = perplexity.table(run, "selection"), perplexity.table(run, "report")
    ppl = {
        **run,
        "table": report,
        "table_selection": selection,
        "headline": perplexity.headline(run, selection, report),
    }
    snap = json.loads(json.dumps(ppl, sort_keys=True))  # as a snapshot holds it: keys sorted
    assert rt.render(snap, "perplexity-2") == perplexity.markdown([r for r in report if r.get("scale", 2) == 2], 12)
    assert rt.render(snap, "headline").splitlines()[1:-1] == render.headline_lines(ppl["headline"])
    assert "perplexity-1" not in rt.tables(run)
    with pytest.raises(rt.TableError, match="one of curve, headline, .*budget-1"):
        rt.render(snap, "budget-3")


def test_snapshot_drops_the_per_prompt_records_and_is_deterministic(run, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "efficiency.json").write_text(json.dumps(run, indent=2))
    a, b = (
        rt.snapshot(tmp_path / "run", tmp_path / "a.json"),
        rt.snapshot(tmp_path / "run" / "efficiency.json", tmp_path / "data" / "b.json"),
    )
    got = json.loads(a.read_text())
    want = {**{k: v for k, v in run.items() if k != "per_prompt"}, "starts": rt.starts_of(run["per_prompt"])}
    assert "per_prompt" not in got and got == want
    assert a.read_bytes() == b.read_bytes() and list(got) == sorted(got)
    assert a.stat().st_size < len(json.dumps(run)) / 2
    whole = rt.snapshot(tmp_path / "run", tmp_path / "w.json.gz")  # compressed: per_prompt kept for checking
    assert rt.load(whole) == {**run, "starts": rt.starts_of(run["per_prompt"])}
    assert whole.read_bytes() == rt.snapshot(tmp_path / "run", tmp_path / "w2.json.gz").read_bytes()
    (tmp_path / "run" / "perplexity.json").write_text("{}")
    with pytest.raises(rt.TableError, match="give the file"):
        rt.snapshot(tmp_path / "run", tmp_path / "c.json")


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_check_finds_a_hand_edited_cell_and_write_fixes_it(run, tmp_path):
    """The documented commands, on a synthetic run: snapshot, render, write, check."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "efficiency.json").write_text(json.dumps(run))
    snap = tmp_path / "data" / "eff.json"
    assert cli("snapshot", str(tmp_path / "run"), str(snap)).returncode == 0
    p = cli("render", str(snap), "budget-1")
    assert p.returncode == 0 and p.stdout == rt.render(run, "budget-1")
    doc = tmp_path / "results.md"
    text = (
        f"# Results\n\nProse.\n\n<!-- table: {snap} budget-1 -->\nold\n<!-- /table -->\n\nMore prose.\n\n"
        f"Printed last:\n<!-- table: {snap} headline -->\n<!-- /table -->\n"
    )
    doc.write_text(text)
    p = cli("check", str(doc))
    assert p.returncode == 1 and "-old" in p.stdout and "+```" in p.stdout
    assert cli("write", str(doc)).returncode == 0
    assert cli("check", str(doc)).returncode == 0
    fixed = doc.read_text()
    assert fixed.startswith("# Results\n\nProse.\n\n") and "\nMore prose.\n\nPrinted last:\n" in fixed
    assert rt.render(run, "budget-1") in fixed and rt.render(run, "headline") + "<!-- /table -->\n" in fixed
    cell = table_rows(rt.render(run, "budget-1"))["correlation"][0]
    doc.write_text(fixed.replace(f"| correlation | {cell} |", "| correlation | 9.99 [9.00, 9.99] |"))
    p = cli("check", str(doc))
    assert p.returncode == 1 and f"+| correlation | {cell} |" in p.stdout and "-| correlation | 9.99" in p.stdout
    assert rt.write(doc) == 1 and doc.read_text() == fixed and rt.check(doc) == []


def test_broken_markers_are_reported(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("<!-- table: docs/data/none.json curve -->\nx\n")
    with pytest.raises(rt.TableError, match="close every block"):
        rt.check(doc)
    doc.write_text("<!-- table: docs/data/none.json curve -->\nx\n<!-- /table -->\n")
    assert "no such snapshot" in rt.check(doc)[0]
    with pytest.raises(rt.TableError, match="snapshot RUN_DIR docs/data/none.json"):
        rt.write(doc)


def test_every_marked_table_in_the_docs_is_up_to_date():
    for doc in DOCS:
        for block in rt.marked(doc.read_text(encoding="utf-8"), doc):
            assert (REPO / block["path"]).is_file(), f"{doc.name}: {block['path']} is not committed"
    p = cli("check", *(str(d.relative_to(REPO)) for d in DOCS))
    assert p.returncode == 0, p.stdout + p.stderr + "\nrun: python scripts/results_tables.py write docs/results.md"


def test_excerpt_live_and_starts_tables(run, tmp_path):
    """``methods:`` gives efficiency.md's rows of the methods named, in that order; ``live`` the live check's lines;
    ``starts`` how many prompts each chosen start took, kept by the snapshot when per_prompt is dropped."""
    full = render.markdown(run).splitlines()
    got = rt.render(run, f"methods:correlation@2,{REF}@1").splitlines()
    assert got[:4] == full[:4] and got[-2:] == [x for x in full if x.startswith("| SR correlation (budget x2) |")] + [
        x for x in full if x.startswith(f"| SR {REF} (budget x1) |")
    ]
    with pytest.raises(rt.TableError, match="no method"):
        rt.render(run, "methods:nothing@1")
    lc = {
        "same_winner": 5,
        "same_tokens": 6,
        "n": 6,
        "live_over_model_seconds": 0.91234,
        "live_over_model_seconds_by_method": {REF: 0.9, "best_of_4": 1.1},
    }
    assert rt.render({**run, "live_check": lc}, "live").splitlines() == [
        "```",
        "live_vs_replay_same_winner: 5/6",
        "live_vs_replay_same_decode_tokens: 6/6",
        "live_seconds_over_time_model: 0.912",
        f"live_seconds_over_time_model_{REF}: 0.900",
        "live_seconds_over_time_model_best_of_4: 1.100",
        "```",
    ]
    run = json.loads(json.dumps(run))  # the module's run stays as it is
    for p in run["per_prompt"]:  # the records carry no n_start: give each prompt one
        p["methods"][REF]["1"]["n_start"] = 8 if p["prompt_index"] % 3 else 16
    (tmp_path / "efficiency.json").write_text(json.dumps(run))
    snap = json.loads(rt.snapshot(tmp_path / "efficiency.json", tmp_path / "s.json").read_text())
    line = [x for x in rt.render(snap, "starts").splitlines() if x.startswith(f"| {REF} | x1 |")]
    assert line == [f"| {REF} | x1 | 8: 16, 16: 8 |"]  # 24 prompts: 8 of them index 0 mod 3


def test_the_rows_nothing_chose_are_also_given_over_all_prompts(run):
    lines = [x for x in rt.render(run, "all").splitlines() if x.startswith("| ") and not x.startswith("| method")]
    want = [k for k, v in run["methods"].items() if "all" in v]
    assert want and [x.split(" | ")[0][2:] + "@" + x.split(" | ")[1][1:] for x in lines] == want
    r = run["methods"][f"{REF}@1"]
    cells = [x for x in rt.render(run, "all").splitlines() if x.startswith(f"| {REF} | x1 |")][0].split(" | ")
    assert cells[2] == rt.speedup_cell(r)
    assert cells[3].rstrip(" |") == render.with_ci(
        r["all"]["speedup_flops"], r["all"]["speedup_flops_ci"], r["all"]["bound"]
    )


def test_a_correlation_run_renders_its_table(tmp_path):
    from rodeco.experiments.correlation import summarize as corr_summary

    rng = np.random.default_rng(0)
    rows = []
    for p in range(6):
        f = rng.normal(size=8)
        rows.append(
            {
                "prompt_index": p,
                "lengths": {
                    str(L): {"partial": (f + rng.normal(size=8) * 8 / L).tolist(), "final": f.tolist()} for L in (8, 32)
                },
            }
        )
    summary = {"minilm_rm": corr_summary(rows, [8, 32], 50)}
    run = {
        "lengths": [8, 32],
        "candidates": 8,
        "prompts": 6,
        "final": "each reward's own",
        "summary": summary,
        "per_prompt": {"minilm_rm": rows},
    }
    (tmp_path / "correlation.json").write_text(json.dumps(run))
    snap = json.loads(rt.snapshot(tmp_path, tmp_path / "c.json").read_text())
    assert "per_prompt" not in snap and list(rt.tables(snap)) == ["correlation"]
    lines = rt.render(snap, "correlation").splitlines()
    s8 = summary["minilm_rm"]["8"]
    assert lines[4] == (
        f"| 8 | {s8['pearson']:.3f} [{s8['pearson_ci'][0]:.3f}, {s8['pearson_ci'][1]:.3f}] | "
        f"{s8['kendall']:.3f} [{s8['kendall_ci'][0]:.3f}, {s8['kendall_ci'][1]:.3f}] | 6 |"
    )
    assert len(lines) == 6


def test_a_snapshot_names_its_pool_relatively(run, tmp_path):
    """A committed snapshot holds no path of the machine that ran it: a pool inside the repository is named from its
    root, one elsewhere by its name."""
    for pool, want in ((rt.REPO / "pools" / "af100", "pools/af100"), (Path("/elsewhere/pools/p9"), "p9")):
        (tmp_path / "efficiency.json").write_text(json.dumps({**run, "pool": str(pool)}))
        assert json.loads(rt.snapshot(tmp_path, tmp_path / "s.json").read_text())["pool"] == want
    for f in (rt.REPO / "docs" / "data").glob("*.json"):
        assert not Path(json.loads(f.read_text()).get("pool", "x")).is_absolute(), f


@pytest.mark.parametrize("kind", ["text_value", "value_head", "minilm_prefix_head"])
def test_a_committed_heads_verdict_renders_from_its_file(kind):
    """The verdict table of a committed head is its ``.json``'s verdict: one row per length and the mean."""
    f = rt.REPO / "plugins" / "rodeco_rewards" / "assets" / f"{kind}.json"
    meta = json.loads(f.read_text())
    lines = rt.render(meta, "verdict").splitlines()
    rows = [x for x in lines if x.startswith("| ") and not x.startswith("| L ")]
    assert len(rows) == len(meta["verdict_by_length"]) + 1
    for r, (L, v) in zip(rows, meta["verdict_by_length"].items()):
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert cells[0] == L and cells[3].startswith(f"{v['diff']:+.3f} [") and cells[4] == str(v["prompts"])
    assert f"{meta['verdict']['mean_diff']:+.3f}" in rows[-1]


def test_versus_says_which_figures_move_beyond_the_other_snapshots_ci(run, tmp_path):
    """``versus:OTHER.json@K``: a snapshot against itself is within everywhere; a method whose speedup moved beyond
    the other's CI is marked, and counted in the caption."""
    (tmp_path / "efficiency.json").write_text(json.dumps(run))
    other = rt.snapshot(tmp_path / "efficiency.json", tmp_path / "other.json")
    same = rt.render(run, f"versus:{other}@1")
    rows = table_rows(same)
    labels = [k for k in run["methods"] if k.endswith("@1") and "infeasible" not in run["methods"][k]]
    assert len(rows) == len(labels) + 1 and all(r[-1] == "yes" for k, r in rows.items() if k != "method")
    assert f"{len(labels)} of {len(labels)} methods within" in same
    moved = json.loads(json.dumps(run))
    r = moved["methods"][f"{REF}@1"]["report"]
    r["speedup_flops"] = 10 * r["speedup_flops_ci"][1]
    got = rt.render(moved, f"versus:{other}@1")
    assert table_rows(got)[REF][-1] == "**no**" and f"{len(labels) - 1} of {len(labels)} methods within" in got
    with pytest.raises(rt.TableError, match="no method at budget x9"):
        rt.render(run, f"versus:{other}@9")


def test_a_judged_snapshot_renders_each_table_with_whole_rows():
    """search_bench's judged snapshot: every table renders, every row has its header's cells, and the cells are
    the snapshot's figures."""
    path = REPO / "docs" / "data" / "search_judged_af100x128.json.gz"
    snap = rt.load(path)
    assert set(rt.tables(snap)) == set(rt.JUDGED)
    for name in rt.JUDGED:
        lines = [x for x in rt.render(snap, name).splitlines() if x.startswith("|")]
        assert len({x.count(" | ") for x in lines}) == 1, name  # the alignment row included
    rows = rt.render(snap, "judge-methods").splitlines()
    beam = snap["analysis"]["smollm_judge"]["methods"]["beam_start_16"]
    assert any(x.startswith("| smollm_judge | beam | ") and f"{beam['judge']['value']:.4f}" in x for x in rows)
    assert len([x for x in rows if x.startswith("| ")]) == 2 + sum(len(a["methods"]) for a in snap["analysis"].values())
