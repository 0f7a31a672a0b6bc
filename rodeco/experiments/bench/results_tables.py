"""The result tables of the docs, generated from an experiment run's ``efficiency.json`` or ``perplexity.json``
rather than copied by hand.

    python scripts/results_tables.py snapshot RUN_DIR docs/data/NAME.json   # the run's figures, to commit
    python scripts/results_tables.py render docs/data/NAME.json TABLE       # print one table
    python scripts/results_tables.py write docs/results/*.md                # regenerate the marked blocks
    python scripts/results_tables.py check docs/results/*.md                # fails, with a diff, where one differs

A snapshot is the run's JSON with sorted keys: to ``NAME.json.gz`` whole and gzip-compressed, ``per_prompt``
included (every prompt's measurements and, where the run keeps them, its winners' texts and scores: what a reader
needs to check a claim); to ``NAME.json`` without ``per_prompt``. A marked block in Markdown is a line ``<!-- table:
docs/data/NAME.json TABLE -->``, the block,
then a line ``<!-- /table -->`` (paths relative to the repository root). TABLE: ``curve`` (Best-of-N's curve on
the report half), ``budget-K`` (every method's speedup at the budget of Best-of-(K*n), one column per partial
reward), ``headline`` (the lines the experiment prints last, fenced) and, for a perplexity run, ``perplexity-K``
(its table at budget xK); for a learned head's ``.json``, ``verdict``; for ``allocate_bench``'s ``allocate.json``,
``allocate``; ``all`` (the rows nothing chose, also over all prompts), ``live`` (the live check's lines), ``starts``
(the rows each method started with) and
``methods:LABEL@K,...`` (those rows of ``efficiency.md``, every column); ``versus:docs/data/OTHER.json@K`` (the
methods both ran at budget xK, each figure against the other's CI: two pools of the same prompts, e.g. two dtypes);
for a correlation run, ``correlation``; for ``search_bench.py``'s ``search_judged.json.gz``, ``judge-curves``,
``judge-methods``, ``guide-split``, ``diagnostics`` and ``judge-checks``.
The cells are formatted by ``rodeco.experiments.render``, as in the run's own
``efficiency.md``. ``tests/test_results_tables.py`` checks every marked block of README.md and docs/.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import gzip
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rodeco.experiments import analysis, efficiency, perplexity
from rodeco.experiments import render as shown
from rodeco.experiments.bench import REPO
from rodeco.experiments.judged import ci_text
from rodeco.roles import SAME

RUN_FILES = ("efficiency.json", "perplexity.json", "correlation.json", "allocate.json")
DROP = ("per_prompt",)  # every prompt's measurements: they stay in the run directory
OPEN = re.compile(r"^<!-- table: (?P<path>\S+) (?P<table>\S+) -->$", re.M)
CLOSE = "<!-- /table -->"
BLOCK = re.compile(OPEN.pattern[:-1] + r"\n(?P<body>.*?)^" + re.escape(CLOSE) + "$", re.M | re.S)
DASH = "–"  # a partial reward the method was not run with


class TableError(Exception):
    """A marked block that cannot be rendered: its snapshot is missing, or it names no table of it."""


def starts_of(per_prompt: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How many prompts each method started with how many rows (``{"label@scale": {rows: prompts}}``, the first
    replicate's runs): what ``n: auto`` and ``n: calibrated`` chose, kept when ``per_prompt`` is dropped."""
    out: dict[str, dict[str, int]] = {}
    for p in per_prompt:
        for label, by_scale in p["methods"].items():
            for scale, r in by_scale.items():
                if "n_start" in r:
                    c = out.setdefault(f"{label}@{scale}", {})
                    c[str(r["n_start"])] = c.get(str(r["n_start"]), 0) + 1
    return out


def snapshot(run: Path, out: Path) -> Path:
    """Writes the run's JSON (``run``: the file, or the run directory holding one of ``RUN_FILES``) without
    ``DROP``, keys sorted, to ``out``; ``starts``: the rows each method started with (``starts_of``)."""
    src = run
    if run.is_dir():
        found = [run / f for f in RUN_FILES if (run / f).is_file()]
        if len(found) != 1:
            raise TableError(f"{run}: holds {[f.name for f in found]}, not one of {list(RUN_FILES)}; give the file")
        src = found[0]
    full = json.loads(src.read_text(encoding="utf-8"))
    whole = out.name.endswith(".gz")
    data = {k: v for k, v in full.items() if whole or k not in DROP}
    if isinstance(data.get("pool"), str) and Path(data["pool"]).is_absolute():  # no machine path in a committed file
        pool = Path(data["pool"])
        data["pool"] = str(pool.relative_to(REPO)) if pool.is_relative_to(REPO) else pool.name
    if isinstance(full.get("per_prompt"), list):  # an efficiency or perplexity run
        data["starts"] = starts_of(full["per_prompt"])
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if whole:
        out.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        out.write_text(text, encoding="utf-8")
    return out


def load(path: Path, shown: str | Path | None = None) -> dict[str, Any]:
    """A snapshot (or a run's JSON); ``shown``: its path as the user wrote it."""
    if not path.is_file():
        raise TableError(
            f"{shown or path}: no such snapshot; make it with "
            f"python scripts/results_tables.py snapshot RUN_DIR {shown or path}"
        )
    if path.name.endswith(".gz"):
        return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
    return json.loads(path.read_text(encoding="utf-8"))


def tables(snap: dict[str, Any]) -> dict[str, Callable[[], str]]:
    """The tables a snapshot can render, by name."""
    if "lengths" in snap and "summary" in snap:  # a correlation run
        return {"correlation": functools.partial(correlation, snap)}
    if "verdict_by_length" in snap:  # a learned head's file (value_train, prefix_train)
        return {"verdict": functools.partial(verdict, snap)}
    if "batches" in snap:  # scripts/allocate_bench.py's allocate.json
        return {"allocate": functools.partial(allocate, snap)}
    if "analysis" in snap and "winners" in snap:  # scripts/search_bench.py's search_judged.json.gz
        return {name: functools.partial(f, snap) for name, f in JUDGED.items()}
    out: dict[str, Callable[[], str]] = {
        "curve": functools.partial(curve, snap),
        "headline": functools.partial(headline, snap),
    }
    if any("all" in v for v in snap["methods"].values()):
        out["all"] = functools.partial(all_prompts, snap)
    if "live_check" in snap:
        out["live"] = functools.partial(live, snap)
    if "starts" in snap:
        out["starts"] = functools.partial(starts, snap)
    for k in snap["args"]["scales"]:
        out[f"budget-{k}"] = functools.partial(budget, snap, k)
        if "table" in snap:  # a perplexity run
            out[f"perplexity-{k}"] = functools.partial(perplexity_table, snap, k)
    return out


def render(snap: dict[str, Any], name: str) -> str:
    made = tables(snap)
    if name.startswith("methods:"):  # an excerpt of efficiency.md's rows: methods:LABEL@K,LABEL@K,...
        return methods_excerpt(snap, name.removeprefix("methods:").split(","))
    if name.startswith("versus:"):  # this snapshot against another's CIs: versus:docs/data/OTHER.json@K
        path, _, scale = name.removeprefix("versus:").rpartition("@")
        return versus(snap, load(REPO / path, path), path, int(scale))
    if name not in made:
        raise TableError(f"no table {name!r} in this snapshot: one of {', '.join(made)}")
    return made[name]()


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def report_prompts(snap: dict[str, Any]) -> int:
    return len(snap["halves"]["report"])


def curve(snap: dict[str, Any]) -> str:
    """Best-of-N's curve on the report half."""
    c, n = snap["curve"]["report"], snap["n"]
    out = [
        f"Best-of-N on the report half ({report_prompts(snap)} prompts); improvement score: Best-of-{n} = 100; "
        f"relative compute: N / {n}.",
        "",
        row(["Best-of-N", "mean reward", "improvement", "TFLOPs", "relative compute"]),
        "|---|---:|---:|---:|---:|",
    ]
    out += [row([f"Best-of-{int(N)}", *shown.curve_cells(c, i, n)]) for i, N in enumerate(c["N"])]
    return "\n".join(out) + "\n"


def method_rows(args: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every method the run swept, by what it is without its partial reward (the table's rows, in the experiment's
    order): its label for each partial reward it ran with (``efficiency.methods``)."""
    out: dict[str, dict[str, str]] = {}
    for m in efficiency.methods(args):
        base = m.label if m.partial == SAME else m.label.removesuffix(f"_{m.partial}")
        out.setdefault(base, {})[m.partial] = m.label
    return out


def speedup_cell(entry: dict[str, Any] | None) -> str:
    """A method's speedup in FLOPs on the report half with its CI and bound."""
    if entry is None:
        return DASH
    if "infeasible" in entry:
        return "infeasible"
    r = entry["report"]
    return shown.with_ci(r["speedup_flops"], r["speedup_flops_ci"], r["bound"])


def same_cells(entry: dict[str, Any] | None, ref: str) -> list[str]:
    """The ``same`` row's speedup over ``ref``'s (paired), relative compute and selection-half speedup."""
    if entry is None:
        return [DASH] * 3
    if "infeasible" in entry:
        return [""] * 3
    r, s = entry["report"], entry["selection"]
    pair = r.get(f"vs_{ref}")
    return [
        shown.with_ci(pair["ratio"], pair["ci"], pair["bound"]) if pair else "",
        shown.figure(r["relative_compute_memory_bound_model"], r["bound"]),
        shown.figure(s["speedup_flops"], s["bound"]),
    ]


def budget(snap: dict[str, Any], scale: int) -> str:
    """Every method's speedup in FLOPs at the budget of Best-of-(scale*n), one column per partial reward, then the
    ``same`` row's paired ratio, relative compute and selection-half speedup."""
    ref, parts, t = snap.get("reference", analysis.REF), snap["args"]["partial_rewards"], snap["methods"]
    top = int(snap["curve"]["report"]["N"][-1])
    head = [
        "method",
        *(f"partial_reward={p}" for p in parts),
        f"speedup / {ref}'s, paired, same",
        "relative compute (memory-bound model), same",
        "selection half, same",
    ]
    out = [
        f"Budget x{scale} (Best-of-{scale * snap['n']}'s memory), report half ({report_prompts(snap)} prompts): "
        "speedup in FLOPs over Best-of-N [95% CI] by the partial reward that decides; for `same`, its speedup "
        f"over {ref}'s paired on the same resamples [95% CI], relative compute and the selection half's speedup. "
        f"≥: at least (above Best-of-{top}'s curve); ≤: at most (below Best-of-1's); ?: a ratio of two figures "
        f"clamped at the same end; {DASH}: not run.",
        "",
        row(head),
        "|---|" + "---:|" * (len(head) - 1),
    ]
    for base, labels in method_rows(snap["args"]).items():
        cells = [speedup_cell(t.get(f"{labels[p]}@{scale}")) if p in labels else DASH for p in parts]
        same = t.get(f"{labels[SAME]}@{scale}") if SAME in labels else None
        out.append(row([base, *cells, *same_cells(same, ref)]))
    return "\n".join(out) + "\n"


def versus(snap: dict[str, Any], other: dict[str, Any], name: str, scale: int) -> str:
    """The methods both snapshots ran at budget x``scale``: their speedups in FLOPs and improvements on the report
    half [95% CI] in each, and whether each figure lies within the other snapshot's CI (two pools of the same
    prompts, e.g. two dtypes: do the figures move beyond their CIs?)."""

    def inside(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
        lo, hi = b[f"{key}_ci"]
        return lo <= a[key] <= hi

    rows, moved = [], 0
    for label, e in snap["methods"].items():
        o = other["methods"].get(label)
        if not label.endswith(f"@{scale}") or o is None or "infeasible" in e or "infeasible" in o:
            continue
        r, ro = e["report"], o["report"]
        ok = all(inside(a, b, k) for k in ("speedup_flops", "improvement") for a, b in ((r, ro), (ro, r)))
        moved += not ok
        rows.append(
            row(
                [
                    label.removesuffix(f"@{scale}"),
                    shown.with_ci(r["speedup_flops"], r["speedup_flops_ci"], r["bound"]),
                    shown.with_ci(ro["speedup_flops"], ro["speedup_flops_ci"], ro["bound"]),
                    shown.improvement(r),
                    shown.improvement(ro),
                    "yes" if ok else "**no**",
                ]
            )
        )
    if not rows:
        raise TableError(f"no method at budget x{scale} in both this snapshot and {name}")
    out = [
        f"Budget x{scale}, report half ({report_prompts(snap)} prompts here, {report_prompts(other)} in {name}): "
        f"speedup in FLOPs over Best-of-N and improvement (Best-of-{snap['n']} = 100) [95% CI]; within: each "
        f"figure lies within the other's CI. {len(rows) - moved} of {len(rows)} methods within.",
        "",
        row(["method", "speedup, this", f"speedup, {name}", "improvement, this", f"improvement, {name}", "within"]),
        "|---|---:|---:|---:|---:|---|",
    ]
    return "\n".join(out + rows) + "\n"


def headline(snap: dict[str, Any]) -> str:
    """The run's headline lines, as it printed them (fenced). The keys are sorted in a snapshot: their printed
    order is the one the experiment's headline function gives on the snapshot's summary."""
    stored = snap["headline"]
    order = list(
        perplexity.headline(snap, snap["table_selection"], snap["table"])
        if "table" in snap
        else analysis.headline(snap)
    )
    if sorted(order) != sorted(stored):
        raise TableError(
            f"the snapshot's headline keys {sorted(set(stored) ^ set(order))} differ from those its "
            "summary gives: a run of other code; snapshot a run of this one"
        )
    return "```\n" + "\n".join(shown.headline_lines({k: stored[k] for k in order})) + "\n```\n"


def methods_excerpt(snap: dict[str, Any], keys: list[str]) -> str:
    """``efficiency.md``'s rows (every column) of the methods ``keys`` (``label@scale``), in that order, after
    Best-of-N's rows."""
    full = shown.markdown(snap).splitlines()
    wanted = {f"| SR {k.split('@')[0]} (budget x{k.split('@')[1]}) |": k for k in keys}
    missing = [k for k in keys if k not in snap["methods"]]
    if missing:
        raise TableError(f"no method {missing} in this snapshot: one of {', '.join(snap['methods'])}")
    rows = {wanted[p]: x for x in full for p in wanted if x.startswith(p)}
    head = [x for x in full[:4]] + [x for x in full if x.startswith("| Best-of-")]
    return "\n".join(head + [rows[k] for k in keys]) + "\n"


def all_prompts(snap: dict[str, Any]) -> str:
    """The rows nothing chose (the reference, the oracle ceilings): their speedup in FLOPs on the report half and
    over all prompts, each with its CI."""
    P = report_prompts(snap) + len(snap["halves"]["selection"])
    out = [
        f"The rows nothing chose, on the report half ({report_prompts(snap)} prompts) and on all {P}: speedup in "
        "FLOPs over Best-of-N [95% CI].",
        "",
        row(["method", "budget", "report half", f"all {P} prompts"]),
        "|---|---:|---:|---:|",
    ]
    for key, v in snap["methods"].items():
        if "all" in v:
            label, scale = key.split("@")
            a = v["all"]
            out.append(
                row(
                    [
                        label,
                        f"x{scale}",
                        speedup_cell(v),
                        shown.with_ci(a["speedup_flops"], a["speedup_flops_ci"], a["bound"]),
                    ]
                )
            )
    return "\n".join(out) + "\n"


def live(snap: dict[str, Any]) -> str:
    """The live check's lines as the experiment printed them (fenced)."""
    lc = snap["live_check"]
    lines = [
        f"live_vs_replay_same_winner: {lc['same_winner']}/{lc['n']}",
        f"live_vs_replay_same_decode_tokens: {lc['same_tokens']}/{lc['n']}",
        f"live_seconds_over_time_model: {lc['live_over_model_seconds']:.3f}",
    ]
    lines += [
        f"live_seconds_over_time_model_{k}: {x:.3f}" for k, x in lc.get("live_over_model_seconds_by_method", {}).items()
    ]
    return "```\n" + "\n".join(lines) + "\n```\n"


def starts(snap: dict[str, Any]) -> str:
    """How many rows the reference (``n: auto``) and the calibrated policy (``n: auto`` and ``n: calibrated``)
    started with, over all prompts (the first replicate's runs)."""
    ref = snap.get("reference", analysis.REF)
    labels = [m.label for m in efficiency.methods(snap["args"]) if m.label == ref or m.policy == "calibrated"]
    out = [
        f"Rows at the start, over all {len(snap['halves']['report']) + len(snap['halves']['selection'])} "
        "prompts (rows: prompts).",
        "",
        row(["method", "budget", "start"]),
        "|---|---:|---|",
    ]
    for label in labels:
        for scale in snap["args"]["scales"]:
            counts = snap["starts"].get(f"{label}@{scale}", {})
            cells = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))
            out.append(row([label, f"x{scale}", cells or "infeasible"]))
    return "\n".join(out) + "\n"


def correlation(snap: dict[str, Any]) -> str:
    """The correlation run's table: per decision length, each reward's mean per-prompt Pearson and Kendall tau
    between partial and final reward [95% CI over prompts], and the prompts that had enough candidates."""
    names = list(snap["summary"])

    def cell(s: dict[str, Any], stat: str) -> str:
        v, ci = s[stat], s[f"{stat}_ci"]
        return "–" if v is None else f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"

    head = ["L (tokens)", *(f"{n} {stat}" for n in names for stat in ("Pearson", "Kendall τ")), "prompts used"]
    out = [
        f"{snap['prompts']} prompts x {snap['candidates']} candidates; final reward: {snap['final']}; mean over "
        "prompts [95% CI].",
        "",
        row(head),
        "|---:|" + "---|" * (len(head) - 2) + "---:|",
    ]
    for L in snap["lengths"]:
        per = [snap["summary"][n][str(L)] for n in names]
        used = "/".join(sorted({f"{s['prompts_used']}" for s in per}))
        out.append(row([str(L), *(cell(s, stat) for s in per for stat in ("pearson", "kendall")), used]))
    return "\n".join(out) + "\n"


def verdict(snap: dict[str, Any]) -> str:
    """A learned head's verdict against ``same`` (its ``.json``): per length, the head's and ``same``'s mean
    per-prompt Pearson r with the final reward and their paired difference [95% CI over the verdict prompts]; then
    the difference averaged over the verdict lengths."""
    v = snap["verdict"]

    def ci(x: float, lo_hi: list[float], sign: str = "") -> str:
        return f"{x:{sign}.3f} [{lo_hi[0]:{sign}.3f}, {lo_hi[1]:{sign}.3f}]"

    out = [
        f"{v['prompts']} verdict prompts; mean per-prompt Pearson r with the final reward [95% CI over prompts].",
        "",
        row(["L (tokens)", "head", "same", "head − same", "prompts"]),
        "|---:|---:|---:|---:|---:|",
    ]
    for L, r in snap["verdict_by_length"].items():
        out.append(
            row([L, DASH, DASH, DASH, "0"])
            if not r["prompts"]
            else row(
                [
                    L,
                    ci(r["head"], r["head_ci"]),
                    ci(r["same"], r["same_ci"]),
                    ci(r["diff"], r["diff_ci"], "+"),
                    str(r["prompts"]),
                ]
            )
        )
    lengths = ", ".join(str(x) for x in v["lengths"])
    out.append(row([f"mean over {lengths}", "", "", ci(v["mean_diff"], v["diff_ci"], "+"), str(v["prompts"])]))
    return "\n".join(out) + "\n"


def allocate(snap: dict[str, Any]) -> str:
    """``allocate_bench``'s table (its ``allocate.md``), from its ``allocate.json``."""
    from rodeco.experiments.bench import allocate_bench as bench

    return bench.markdown(snap)


def perplexity_table(snap: dict[str, Any], scale: int) -> str:
    """The perplexity run's table: Best-of-N's points and the methods at budget x``scale``."""
    rows = [r for r in snap["table"] if r.get("scale", scale) == scale]  # Best-of-N's rows have no scale
    return perplexity.markdown(rows, report_prompts(snap))


def _name(label: str) -> str:
    return label.replace("best_of_", "Best-of-").replace("fixed_alpha_0.5", "fixed α 0.5").replace("_start_16", "")


def _judged_head(snap: dict[str, Any]) -> str:
    return (
        f"{len(snap['prompts'])} report-half prompts × {len(snap['firsts'])} candidate sets; 95% bootstrap CIs "
        "over prompts and sets.\n\n"
    )


def judge_curves(snap: dict[str, Any]) -> str:
    """Best-of-N's winners (chosen by the guide) on the guide and on each judge, N = 1 ... 64."""
    an = snap["analysis"]
    cur = an["guide"]["curve"]
    out = [row(["N", "TFLOPs per prompt", *an]), row(["---:"] * (2 + len(an)))]
    for k, n in enumerate(cur["sizes"]):
        out.append(
            row(
                [
                    str(n),
                    f"{cur['flops'][k] / 1e12:.3f}",
                    *(
                        ci_text({"value": a["curve"]["judge"][k], "ci": a["curve"]["judge_ci"][k]}, ".4f")
                        for a in an.values()
                    ),
                ]
            )
        )
    out.append(row([f"{cur['sizes'][-1]} − 1", "", *(ci_text(a["gain"], "+.4f") for a in an.values())]))
    return _judged_head(snap) + "\n".join(out) + "\n"


def judge_methods(snap: dict[str, Any]) -> str:
    """Each method on the guide and each judge: its score and paired differences, the FLOPs speedup over Best-of-N
    at matched score on that scorer's curve, and the residual from the Best-of-N relation."""
    refs = snap["refs"]
    out = [
        row(
            [
                "scorer",
                "method",
                "score",
                *(f"− {_name(r)}" for r in refs),
                "FLOPs speedup at matched score",
                "residual from guide gain",
            ]
        ),
        row(["---", "---", *["---:"] * (3 + len(refs))]),
    ]
    for sc, an in snap["analysis"].items():
        for label, m in an["methods"].items():
            sp = m["speedup_flops_at_matched_judge"]
            bound = {"lower": "≥", "upper": "≤"}.get(sp["bound"], "") if sp else ""
            res = m["residual"]
            flags = (" below" if res["below"] else "") + (" (beyond the curve)" if res["beyond_curve"] else "")
            out.append(
                row(
                    [
                        sc,
                        _name(label),
                        ci_text(m["judge"], ".4f"),
                        *(ci_text(m[f"vs_{r}"], "+.4f") for r in refs),
                        bound + ci_text(sp, ".2f"),
                        ci_text(res, "+.4f") + flags,
                    ]
                )
            )
    return _judged_head(snap) + "\n".join(out) + "\n"


def guide_split(snap: dict[str, Any]) -> str:
    """The guide's two parts, each method's gain in each over Best-of-1 and over Best-of-64."""
    split = snap["guide_split"]
    keys = list(next(iter(split.values())))
    out = [
        row(["method", *(k.replace("_over_", " over ").replace("best_of_", "Best-of-") for k in keys)]),
        row(["---", *["---:"] * len(keys)]),
    ]
    out += [row([_name(label), *(ci_text(d[k], "+.3f") if k in d else "" for k in keys)]) for label, d in split.items()]
    return _judged_head(snap) + "\n".join(out) + "\n"


def diagnostics(snap: dict[str, Any]) -> str:
    """The winners' diagnostics (``rodeco.common.diagnostics``) and the guide's parts, per method."""
    diag = snap["diagnostics"]
    fields = [f for f in next(iter(diag.values())) if not f.startswith("guide_")]
    out = [row(["method", *(f.replace("_", " ") for f in fields)]), row(["---", *["---:"] * len(fields)])]
    out += [row([_name(label), *(ci_text(d[f], ".3f") for f in fields)]) for label, d in diag.items()]
    return _judged_head(snap) + "\n".join(out) + "\n"


def judge_checks(snap: dict[str, Any]) -> str:
    """Each judge against length and against the guide over the winners' texts, and what judging cost."""
    out = [
        row(
            [
                "judge",
                "texts",
                "Pearson r with log characters",
                "Spearman ρ with the guide",
                "ρ within a prompt (mean)",
                "calls",
                "tokens",
                "TFLOPs",
                "seconds",
            ]
        ),
        row(["---", *["---:"] * 8]),
    ]
    cost = snap["judge_cost"]
    for name, by in snap["correlations"].items():
        c = cost[name]
        for which, x in by.items():
            out.append(
                row(
                    [
                        f"{name}, {which.replace('_', ' ').replace('best of 1', 'Best-of-1')}",
                        str(x["texts"]),
                        f"{x['pearson_log_chars']:+.3f}",
                        f"{x['spearman_guide']:+.3f}",
                        f"{x['spearman_guide_within_prompt']:+.3f} ({x['prompts_within']} prompts)"
                        if x["prompts_within"]
                        else DASH,
                        *(
                            [str(c["calls"]), str(c["tokens"]), f"{c['flops'] / 1e12:.3f}", f"{c['seconds']:.0f}"]
                            if which == "every_winner"
                            else [""] * 4
                        ),
                    ]
                )
            )
    return "\n".join(out) + "\n"


JUDGED = {
    "judge-curves": judge_curves,
    "judge-methods": judge_methods,
    "guide-split": guide_split,
    "diagnostics": diagnostics,
    "judge-checks": judge_checks,
}


def marked(text: str, where: str | Path) -> list[re.Match[str]]:
    """The marked blocks of a Markdown text."""
    blocks = list(BLOCK.finditer(text))
    opened, closed = len(OPEN.findall(text)), len(re.findall(f"^{re.escape(CLOSE)}$", text, re.M))
    if not opened == closed == len(blocks) or any(OPEN.search(b["body"]) for b in blocks):
        raise TableError(f"{where}: {opened} table markers, {closed} {CLOSE} lines; close every block once")
    return blocks


def rendered(block: re.Match[str]) -> str:
    """What a marked block should hold: its snapshot's path is relative to the repository root (or absolute)."""
    try:
        return render(load(REPO / block["path"], block["path"]), block["table"])
    except TableError as e:
        raise TableError(f"{block['path']} {block['table']}: {e}") from None


def check(doc: Path) -> list[str]:
    """A diff for every marked block of ``doc`` that differs from what its snapshot renders (and why a block
    cannot be rendered); none where the document is up to date."""
    out = []
    for block in marked(doc.read_text(encoding="utf-8"), doc):
        try:
            want = rendered(block)
        except TableError as e:
            out.append(f"{doc}: {e}\n")
            continue
        if want != block["body"]:
            out.append(
                "".join(
                    difflib.unified_diff(
                        block["body"].splitlines(keepends=True),
                        want.splitlines(keepends=True),
                        f"{doc}: {block['path']} {block['table']}, as written",
                        "as rendered",
                        n=1,
                    )
                )
            )
    return out


def write(doc: Path) -> int:
    """Rewrites every marked block of ``doc`` with what its snapshot renders; how many changed."""
    text = doc.read_text(encoding="utf-8")
    parts, last, changed = [], 0, 0
    for block in marked(text, doc):
        want = rendered(block)
        changed += want != block["body"]
        parts += [text[last : block.start("body")], want]
        last = block.end("body")
    doc.write_text("".join(parts) + text[last:], encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("snapshot", help="a run's JSON to commit (.json.gz: whole; .json: without per_prompt)")
    p.add_argument("run", type=Path, help="the run directory (or its efficiency.json / perplexity.json)")
    p.add_argument("out", type=Path, help="e.g. docs/data/efficiency48.json")
    p = sub.add_parser("render", help="print one table of a snapshot")
    p.add_argument("snapshot", type=Path)
    p.add_argument(
        "table",
        help="curve, budget-K, headline, all, live, starts, perplexity-K, methods:LABEL@K,..., "
        "versus:OTHER.json@K, correlation, judge-curves, judge-methods, guide-split, "
        "diagnostics, judge-checks",
    )
    for name, what in (("write", "regenerate the marked blocks"), ("check", "diff the marked blocks")):
        sub.add_parser(name, help=what).add_argument("docs", type=Path, nargs="+", help="Markdown files")
    a = ap.parse_args(argv)
    try:
        if a.command == "snapshot":
            print(f"wrote {snapshot(a.run, a.out)}")
        elif a.command == "render":
            print(render(load(a.snapshot), a.table), end="")
        elif a.command == "write":
            for doc in a.docs:
                print(f"{doc}: {write(doc)} blocks rewritten")
        else:
            problems = [x for doc in a.docs for x in check(doc)]
            print("".join(problems), end="")
            return 1 if problems else 0
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
