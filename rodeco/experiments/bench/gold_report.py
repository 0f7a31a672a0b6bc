"""The gold yardstick's report (``python scripts/gold_bench.py report``): the figures from the records the ``run`` and
``search`` steps wrote (``rodeco.experiments.bench.gold_bench``).

Per task and pooled, with 95% CIs from a paired bootstrap over problems (every figure of a resample read from the same
problems, so accuracy and FLOPs move together):

- each (guide, method, rule)'s gold accuracy and FLOPs;
- the Best-of-N curve: at each N the best (guide, rule) pair's accuracy, every guide and every rule the methods get
  (the guide's argmax, the majority vote, the guide-weighted and the confidence-weighted vote);
- each row's speedup at matched accuracy: the FLOPs the curve needs to reach its accuracy (interpolated in log FLOPs
  on the curve's running maximum) over its own, recomputed in every resample (the matched point moves with it). A row
  above the curve's top is charged the top's FLOPs: its speedup is a lower bound, printed ``≥``; ``bound_share`` is
  the share of resamples where it was;
- each row's accuracy against the curve's at the same FLOPs (``gain_at_matched_flops``), and against the curve's
  best (``vs_best_bon``);
- any-of-N, the ceiling.

A problem whose text repeats an earlier problem's in its task is dropped (reasoning-gym's generators repeat easy
problems). The headline is one (guide, method, rule) row chosen on the selection problems (``--split select`` runs),
never on the report's: of the rows whose selection accuracy reaches the selection curve's best, the fastest at matched
accuracy; if none does, the most accurate. The report prints it, then the full table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from rodeco.experiments.bench.gold_tasks import BON, GUIDES, RULES, Gold, chosen, pool_gold, pools_of, records, runs_of
from rodeco.experiments.bootstrap import ci as bootstrap_ci
from rodeco.experiments.bootstrap import draws
from rodeco.experiments.speedup import matched_speedup, monotone

Runs = dict[str, dict[str, dict[int, dict]]]  # task -> guide -> problem index -> record


def load_runs(out: Path, split: str, tasks: list[str]) -> tuple[Runs, Runs, dict, dict[str, int]]:
    """The replayed methods' records; the same with the live search methods added, on the problems that have both;
    {task: {index: [gold of every pool candidate]}}; each task's count of problems dropped as repeated texts."""
    from rodeco.replays.pool import Pool

    gold = Gold()
    runs: Runs = {}
    both: Runs = {}
    ceiling: dict[str, dict[int, list[float]]] = {}
    dropped: dict[str, int] = {}

    def read(f: Path, keep: set[int]) -> dict[int, dict]:
        return {r["index"]: r for r in records(f) if r["index"] in keep}

    for task in tasks:
        path = pools_of(out, split) / task
        if not (path / "pool.json").is_file():
            continue
        pool = Pool(path)
        keep = first_of_each_text({i: pool.prompt(i).text for i in pool.indices()})
        dropped[task] = len(pool.indices()) - len(keep)
        ceiling[task] = {i: g for i, g in pool_gold(pool, gold).items() if i in keep}
        for guide in GUIDES:
            replayed = read(runs_of(out, split) / task / f"{guide}.jsonl", keep)
            if replayed:
                runs.setdefault(task, {})[guide] = replayed
            live = read(runs_of(out, split) / task / f"{guide}.search.jsonl", keep)
            if live:
                both.setdefault(task, {})[guide] = merged(replayed, live)
    return runs, both, ceiling, dropped


def first_of_each_text(texts: dict[int, str]) -> set[int]:
    """The indices of each text's first problem."""
    seen: dict[str, int] = {}
    for i in sorted(texts):
        seen.setdefault(texts[i], i)
    return set(seen.values())


def merged(replayed: dict[int, dict], live: dict[int, dict]) -> dict[int, dict]:
    """Each problem that ran both: its record with the replayed methods and the live ones."""
    return {i: {**r, "methods": {**replayed[i]["methods"], **r["methods"]}} for i, r in live.items() if i in replayed}


def curve_accuracy_at(f: float, curve_f: np.ndarray, curve_a: np.ndarray) -> float:
    """The Best-of-N curve's accuracy at FLOPs ``f``: its running maximum interpolated in log FLOPs, held flat past
    either end."""
    return float(np.interp(math.log(f), np.log(curve_f), monotone(curve_a)))


def table(runs: Runs, ceiling: dict, tasks: list[str], resamples: int, guides: list[str], seed: int = 0) -> dict:
    """Per (guide, method, rule): the figures of the module doc over the problems every guide ran, and the curve."""
    guides = [g for g in guides if all(g in runs.get(t, {}) for t in tasks)]
    keys = [(t, i) for t in tasks for i in sorted(set.intersection(*(set(runs[t][g]) for g in guides)))]
    P = len(keys)
    labels = list(next(iter(runs[keys[0][0]][guides[0]].values()))["methods"]) if P else []
    acc: dict[tuple[str, str, str], np.ndarray] = {}
    flops: dict[tuple[str, str], np.ndarray] = {}
    for g in guides:
        for m in labels:
            recs = [runs[t][g][i]["methods"][m] for t, i in keys]
            flops[g, m] = np.array([np.mean([r["flops"] for r in rs]) for rs in recs])
            for rule in RULES:
                acc[g, m, rule] = np.array([np.mean([r.get(rule, math.nan) for r in rs]) for rs in recs])
    anyof = {n: np.array([_any_of(ceiling[t][i], n) for t, i in keys]) for n in BON}
    # every figure at the problems as they are (column 0) and in each resample (columns 1..R), the same draws for all
    draw = np.concatenate([np.arange(P)[None], draws(P, resamples, seed)]) if P else np.zeros((1, 0), dtype=int)

    def means(x: np.ndarray) -> np.ndarray:
        return x[draw].mean(1)

    A = {k: means(v) for k, v in acc.items()}
    F = {k: means(v) for k, v in flops.items()}
    bon = [f"bon_{n}" for n in BON if f"bon_{n}" in labels]
    pairs = [(g, r) for g in guides for r in RULES]
    # the Best-of-N curve in each draw: [len(bon), R + 1] FLOPs and accuracy (the best guide and rule at each N)
    cf = np.array([np.mean([F[g, m] for g in guides], 0) for m in bon])
    ca = np.array([np.nanmax([A[g, m, r] for g, r in pairs], 0) for m in bon])

    def ci(v: np.ndarray) -> list[float]:
        return [float(v[0]), *bootstrap_ci(v[1:])]

    def best_pair(m: str) -> tuple[str, str]:  # the (guide, rule) at the top of Best-of-N's column m
        return max(pairs, key=lambda gr: float(np.nan_to_num(A[gr[0], m, gr[1]][0], nan=-1.0)))

    bon16 = np.mean([F[g, "bon_16"] for g in guides], 0) if "bon_16" in bon else np.full(len(draw), math.nan)
    out: dict[str, Any] = {"problems": P, "tasks": tasks, "guides": guides, "rows": {}}
    for g in guides:
        for m in labels:
            for rule in RULES:
                k = (g, m, rule)
                if not np.isfinite(acc[k]).all():
                    continue  # a rule the method's records lack
                a, f = A[k], F[g, m]
                row: dict[str, Any] = {"accuracy": ci(a), "gflops": ci(f / 1e9), "bon16_flops_ratio": ci(bon16 / f)}
                if bon:
                    sp = [matched_speedup(a[d], f[d], ca[:, d], cf[:, d]) for d in range(len(draw))]
                    gain = [a[d] - curve_accuracy_at(f[d], cf[:, d], ca[:, d]) for d in range(len(draw))]
                    row |= {
                        "speedup_at_matched_accuracy": ci(np.array([x for x, _ in sp])),
                        "speedup_bound": sp[0][1],
                        "bound_share": float(np.mean([b == "lower" for _, b in sp[1:]])) if len(sp) > 1 else 0.0,
                        "gain_at_matched_flops": ci(np.array(gain)),
                        "vs_best_bon": ci(a - ca.max(0)),
                    }
                out["rows"][f"{g}/{m}/{rule}"] = row
    out["any_of"] = {str(n): ci(means(anyof[n])) for n in BON}
    if "bon_16" in bon and "logprob" in guides:
        out["gap_closed"] = gap_closed(A, guides, means(anyof[16]), ci)
        out["auc_needed_modelled"] = needed(out, np.array([ceiling[t][i][:64] for t, i in keys], dtype=float))
    if bon:
        out["bon_curve"] = [
            {"n": int(m.split("_")[1]), "gflops": cf[j, 0] / 1e9, "accuracy": ca[j, 0], "by": best_pair(m)}
            for j, m in enumerate(bon)
        ]
        top = int(np.argmax(monotone(ca[:, 0])))
        out["best_bon"] = {**out["bon_curve"][top], "accuracy_ci": ci(ca.max(0))}
    out["best_bon16_accuracy"] = out["bon_curve"][bon.index("bon_16")]["accuracy"] if "bon_16" in bon else math.nan
    return out


def gap_closed(A: dict, guides: list[str], any16: np.ndarray, ci: Any) -> dict[str, Any]:
    """Per guide: its Best-of-16 under its best rule (chosen at the point estimate, then held in every draw), and the
    share of the gap between ``logprob``'s (the same way) and any-of-16 it closes, ``(g - logprob) / (any - logprob)``
    in each draw."""
    best = {g: max(RULES, key=lambda r: float(np.nan_to_num(A[g, "bon_16", r][0], nan=-1.0))) for g in guides}
    lp = A["logprob", "bon_16", best["logprob"]]
    out = {}
    for g in guides:
        a = A[g, "bon_16", best[g]]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = (a - lp) / (any16 - lp)
        out[g] = {"rule": best[g], "accuracy": ci(a), "share": ci(share)}
    return out


def needed(tab: dict[str, Any], gold: np.ndarray) -> dict[str, Any]:
    """What closing half the gap takes, modelled (``modelled_pick``): the Best-of-16 accuracy it means, the
    within-problem AUC a guide needs for it, and the modelled pick at a few AUCs."""
    lp, any16 = tab["gap_closed"]["logprob"]["accuracy"][0], tab["any_of"]["16"][0]
    target = lp + (any16 - lp) / 2
    return {
        "target": target,
        "auc": auc_needed(gold, target),
        "pick_at": {str(a): modelled_pick(gold, a) for a in (0.6, 0.7, 0.8, 0.9)},
    }


def modelled_pick(gold: np.ndarray, auc: float, n: int = 16, reps: int = 20, seed: int = 0) -> float:
    """The gold accuracy of a modelled guide's argmax among each problem's disjoint groups of ``n`` candidates
    (``gold``: [problems, candidates]): scores ``d * gold + noise``, unit normal noise, with ``d`` set so that a right
    row outranks a wrong one of its problem with probability ``auc`` (equal-variance binormal: ``d = sqrt(2) *
    Phi^-1(auc)``). The same noise for every ``auc`` (``reps`` draws, seeded), so the figure rises with it."""
    d = math.sqrt(2) * NormalDist().inv_cdf(min(max(auc, 1e-9), 1 - 1e-9))
    k = gold.shape[1] // n * n
    g = gold[:, :k].reshape(len(gold), -1, n)
    noise = np.random.default_rng(seed).standard_normal((reps, *g.shape))
    pick = np.argmax(d * g[None] + noise, axis=-1)
    return float(np.take_along_axis(np.broadcast_to(g, noise.shape), pick[..., None], -1).mean())


def auc_needed(gold: np.ndarray, target: float, n: int = 16) -> float:
    """The within-problem AUC at which the modelled guide's Best-of-``n`` pick reaches ``target`` (bisection; nan
    when even a near-perfect one does not)."""
    lo, hi = 0.5, 0.999
    if modelled_pick(gold, hi, n) < target:
        return math.nan
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if modelled_pick(gold, mid, n) < target else (lo, mid)
    return hi


def _any_of(g: list[float], n: int) -> float:
    """Any of N right, averaged over the pool's disjoint groups of N candidates."""
    groups = [g[k : k + n] for k in range(0, len(g) - n + 1, n)]
    return float(np.mean([max(x) for x in groups])) if groups else math.nan


def headline(selection: dict[str, Any]) -> str | None:
    """The row chosen on the selection problems' table: of the rows (not Best-of-N) whose accuracy reaches the
    curve's best, the fastest at matched accuracy; if none does, the most accurate."""
    rows = {k: r for k, r in selection["rows"].items() if "/bon_" not in k}
    if not rows:
        return None
    top = selection["best_bon"]["accuracy"]
    reached = [k for k, r in rows.items() if r["accuracy"][0] >= top]
    if reached:
        return max(reached, key=lambda k: rows[k]["speedup_at_matched_accuracy"][0])
    return max(rows, key=lambda k: rows[k]["accuracy"][0])


def report(a: argparse.Namespace) -> None:
    tasks = list(chosen(a))
    runs, both, ceiling, dropped = load_runs(a.out, "report", tasks)
    tasks = [t for t in tasks if runs.get(t)]
    own = [g for g in GUIDES if g != "minilm_rm"]  # the generator's own guides and the verifier: every problem
    out: dict[str, Any] = {"pooled": table(runs, ceiling, tasks, a.resamples, own)}
    for t in tasks:
        out[t] = table(runs, ceiling, [t], a.resamples, own)
    if any("minilm_rm" in runs[t] for t in tasks):  # the default reward, on the problems it ran
        out["pooled_with_minilm_rm"] = table(runs, ceiling, tasks, a.resamples, list(GUIDES))
    searched = [t for t in tasks if both.get(t)]
    if searched:  # the live search methods beside the replayed ones, on the problems they ran
        guides = [g for g in GUIDES if all(g in both[t] for t in searched)]
        out["pooled_with_search"] = table(both, ceiling, searched, a.resamples, guides)
        for t in searched:
            out[f"{t}_with_search"] = table(both, ceiling, [t], a.resamples, guides)
    sel_runs, sel_both, sel_ceiling, _ = load_runs(a.out, "select", tasks)
    sel_tasks = [t for t in tasks if sel_runs.get(t)]
    if sel_tasks:
        sel = sel_both if all(sel_both.get(t) for t in sel_tasks) else sel_runs
        sel_tab = table(sel, sel_ceiling, sel_tasks, 0, own)
        out["headline"] = {"row": headline(sel_tab), "selection": sel_tab}
    out["dropped_repeated_texts"] = dropped
    out["selection"] = json.loads((a.out / "select.json").read_text())
    for name, tab in out.items():
        if isinstance(tab, dict) and "rows" in tab:
            print_table(name, tab)
    if "headline" in out:
        print_headline(out["headline"]["row"], out)
    if a.snapshot:
        save_snapshot(a.snapshot, out, runs, both)


def save_snapshot(path: Path, out: dict[str, Any], runs: Runs, both: Runs) -> None:
    """The figures and, per task, guide, problem and method, the guide's best text (what a reader checks a claim
    by)."""
    texts = {t: {g: dict(both.get(t, {}).get(g, {})) for g in gs} for t, gs in runs.items()}
    for t, gs in runs.items():
        for g, rs in gs.items():
            texts[t][g] = {**rs, **texts[t][g]}  # a searched problem's record holds every method
    winners_texts = {
        t: {
            g: {i: {m: r["methods"][m][0].get("best", "") for m in r["methods"]} for i, r in rs.items()}
            for g, rs in gs.items()
        }
        for t, gs in texts.items()
    }
    blob = json.dumps({"figures": out, "winners": winners_texts, "command": " ".join(sys.argv)})
    with gzip.open(path, "wt") as f:
        f.write(blob)
    print(f"snapshot: {path}")


def fmt(x: list[float], d: int = 3, bound: str = "") -> str:
    if not x or not math.isfinite(x[0]):
        return "–"
    v, lo, hi = x
    sign = "≥ " if bound == "lower" else "≤ " if bound == "upper" else ""
    return f"{sign}{v:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]" if math.isfinite(lo) else f"{sign}{v:.{d}f}"


def print_table(name: str, tab: dict[str, Any]) -> None:
    """Per guide and method: FLOPs, the four rules' accuracies, and its best rule's speedup at matched accuracy."""
    print(f"\n## {name}: {tab['problems']} problems ({', '.join(tab['tasks'])})")
    if "best_bon" in tab:
        b = tab["best_bon"]
        print(f"best Best-of-N: N = {b['n']} ({'/'.join(b['by'])}) {fmt(b['accuracy_ci'])} at {b['gflops']:.0f} GFLOPs")
    print("any-of-N (the ceiling): " + ", ".join(f"{n}: {fmt(v)}" for n, v in tab["any_of"].items()))
    rows = tab["rows"]
    head = " | ".join(RULES)
    print(f"| guide | method | GFLOPs/problem | {head} | speedup at matched accuracy (its best rule) |")
    print("|---|---|---|" + "---|" * len(RULES) + "---|")
    for key in [k for k in rows if k.endswith("/reward")]:
        g, m, _ = key.split("/")
        accs: dict[str, dict[str, Any]] = {r: rows[f"{g}/{m}/{r}"] for r in RULES if f"{g}/{m}/{r}" in rows}
        best = max(accs, key=lambda r: accs[r]["accuracy"][0])
        row = accs[best]
        print(
            f"| {g} | {m} | {fmt(rows[key]['gflops'], 1)} | "
            + " | ".join(fmt(accs[r]["accuracy"]) if r in accs else "–" for r in RULES)
            + f" | {fmt(row['speedup_at_matched_accuracy'], 2, row['speedup_bound'])} ({best}) |"
        )
    for g, v in tab.get("gap_closed", {}).items():
        print(
            f"{g}: Best-of-16 ({v['rule']}) {fmt(v['accuracy'])}, the gap logprob's leaves to any-of-16 closed "
            f"{fmt(v['share'])}"
        )
    if "auc_needed_modelled" in tab:
        m = tab["auc_needed_modelled"]
        print(
            f"closing half the gap means Best-of-16 at {m['target']:.3f}: a guide needs a within-problem AUC of "
            f"{m['auc']:.3f} for it (modelled; the modelled pick at AUC "
            + ", ".join(f"{a}: {v:.3f}" for a, v in m["pick_at"].items())
            + ")"
        )
    for g in tab["guides"]:
        if f"{g}/bon_16/reward" in rows:
            argmax, vote = (rows[f"{g}/bon_16/{r}"]["accuracy"] for r in ("reward", "weighted"))
            print(
                f"{g}: Best-of-16 argmax {fmt(argmax)}, weighted vote {fmt(vote)}; any-of-16 {fmt(tab['any_of']['16'])}"
            )


def print_headline(key: str | None, out: dict[str, Any]) -> None:
    """The headline's report row: in the pooled table, or (a live search method) the table with the search methods,
    over the problems they ran."""
    name = next(
        (n for n in ("pooled", "pooled_with_search") if key is not None and key in out.get(n, {}).get("rows", {})), None
    )
    if name is None:
        print(f"\nheadline: {key} (chosen on the selection problems) has no report row")
        return
    r, b = out[name]["rows"][key], out[name]["best_bon"]
    print(
        f"\nheadline (chosen on the selection problems): {key}, from the {name} table "
        f"({out[name]['problems']} problems)"
    )
    print(f"  accuracy {fmt(r['accuracy'])} at {fmt(r['gflops'], 1)} GFLOPs")
    print(f"  best Best-of-N (N = {b['n']}): {fmt(b['accuracy_ci'])} at {b['gflops']:.0f} GFLOPs")
    print(f"  accuracy minus the best Best-of-N's (paired) {fmt(r['vs_best_bon'])}")
    print(
        f"  speedup at matched accuracy {fmt(r['speedup_at_matched_accuracy'], 2, r['speedup_bound'])}"
        f" (capped at the curve's top in {r['bound_share']:.0%} of resamples)"
    )


def matched_best_of(figures: dict[str, Any], row: str, tol: float = 0.02, table: str = "pooled") -> dict[str, Any]:
    """The load test's matched Best-of-N: for a method's report row (``guide/method/rule``), the smallest N whose
    Best-of-N under the same guide and rule is not below the method's gold accuracy by more than ``tol`` (points
    estimates of ``table``); None where no N of the curve reaches it."""
    rows = figures[table]["rows"]
    if row not in rows:
        raise SystemExit(f"--row {row}: not a row of the {table} table; e.g. logprob/sr_fixed_auto/reward")
    guide, _, rule = row.split("/")
    acc = rows[row]["accuracy"][0]
    curve = {n: rows[f"{guide}/bon_{n}/{rule}"]["accuracy"][0] for n in BON if f"{guide}/bon_{n}/{rule}" in rows}
    m = next((n for n in sorted(curve) if curve[n] >= acc - tol), None)
    got = curve.get(m) if m is not None else None
    return {"row": row, "accuracy": acc, "tolerance": tol, "best_of": m, "best_of_accuracy": got}
