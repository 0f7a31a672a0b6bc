"""Search policies (particle_filter, beam, dvts) against Speculative Rejection and Best-of-N at Best-of-4's memory,
on an efficiency run's prompts, with the efficiency experiment's analysis (halves, bootstrap CIs, the improvement
score, the FLOPs speedup over Best-of-N at matched reward, each row paired with fixed alpha 0.5).

Two steps. First the efficiency experiment replays Best-of-N's curve and fixed alpha 0.5 (and its oracle) on the
pool; then this script runs each search policy *live* on the same prompts, each prompt at the record's Best-of-4
budget, from the same random streams (candidate ``i`` is pool candidate ``i``), charged everything the loop counts
(prefill, every row's and copy's tokens, every scorer call), adds them to the records as methods, and summarizes::

    rodeco experiment=efficiency pool=pools/af100x64 hydra.run.dir=runs/search experiment_args.candidates=64 \
        experiment_args.replicates=1 'experiment_args.scales=[1]' 'experiment_args.starts=[]' \
        'experiment_args.alphas=[0.5]' 'experiment_args.adaptive_deltas=[]' 'experiment_args.calibrated_deltas=[]' \
        'experiment_args.policies=[]' experiment_args.live_check=0
    python scripts/search_bench.py runs/search --pool pools/af100x64

Live, not replayed: a replay equals the live run for forking policies (``tests/test_replay.py``), but its first
replay decodes every copy's continuation to the end on its own, which costs several live runs. The search runs
are written per prompt as they finish (``search_prompts.jsonl`` in the run directory; resumable).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments import bootstrap

# label -> (policy node, start rows)
METHODS: dict[str, tuple[dict[str, Any], int]] = {  # in the order they run
    "beam_start_16": ({"name": "beam"}, 16),
    "dvts_start_16": ({"name": "dvts"}, 16),
    "particle_filter_start_16": ({"name": "particle_filter"}, 16),
}
ALTERNATIVES: dict[str, tuple[dict[str, Any], int]] = {  # tried on the selection half only (--alternatives)
    "particle_filter_start_4": ({"name": "particle_filter"}, 4),
    "beam_start_16_width_8": ({"name": "beam", "beam_width": 8}, 16),
}
PF = "particle_filter_start_16"
PF_GRID = [0.25, 0.5, 1.0, 2.0]  # particle_filter's temperature, chosen on the selection half by the guide's mean


def pf_label(t: float) -> str:
    return f"{PF}_temperature_{t:g}"


def live_runner(pool_path: str, overrides: list[str], compile_step: bool = False):
    """A function (prompt index, policy node, start, kv budget, first stream) -> the run record the efficiency
    analysis reads, with the winner (text, tokens, stop reason, lineage) to judge and check."""
    import rodeco
    from rodeco.common.budget import Budget
    from rodeco.common.state import PromptRef
    from rodeco.compose import option_node
    from rodeco.core.loop import decode_batch
    from rodeco.experiments.efficiency import rows_x_context
    from rodeco.experiments.replay_policy import best_score
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.replays.pool import Pool
    from rodeco.replays.pool_session import live_generator
    from rodeco.roles import RoleBuilder, Roles, choose_roles
    from rodeco.runner import loop_settings

    pool = Pool(pool_path)
    plugins = default_plugins()
    cfg = rodeco.load_config(["sampling.max_new_tokens=" + str(pool.settings["max_new_tokens"]), *overrides])
    gen = live_generator(pool, compile_step)
    builder = RoleBuilder(plugins, gen.name, BuildContext(generator=gen, device=str(gen.device), plugins=plugins))
    choices = choose_roles(cfg, plugins)
    cache: dict[str, Roles] = {}

    def run(index: int, node: dict, n: int, kv: int, first: int = 0) -> dict:
        key = json.dumps(node, sort_keys=True)
        if key not in cache:
            full = {**option_node("policy", node["name"], plugins), **node}
            cache[key] = builder.roles(choices.with_(plugins, policy=full))
        roles = cache[key]
        s = loop_settings(cfg, gen, node["name"], choices.reward.name)
        s = dataclasses.replace(s, n=n, budget=Budget(kv, s.budget.min_tokens_per_round), seed=pool.settings["seed"])
        p = pool.prompt(index)
        (res,), c = decode_batch(
            gen, roles.reward, roles.policy, [PromptRef(p.index, p.text)], s, partial=roles.partial, first=first
        )
        copies = sum(len(v) for r in res.rounds for v in r.copies.values())
        w = res.best
        return {
            "best": float(best_score(res)),
            "n_start": res.n_start,
            "gen_flops": c.gen_flops,
            "reward_flops": c.reward_flops,
            "partial_flops": c.partial_reward_flops,
            "flops": c.total_flops,
            "decode_tokens": c.gen_decode_tokens,
            "steps": c.decode_steps,
            "peak_kv_tokens": c.peak_kv_tokens,
            "rows_x_context": rows_x_context(c, gen.shape),
            "rounds": len(res.rounds),
            "copies": copies,
            "reward_s": float(c.time_s.get("score", 0.0) + c.time_s.get("partial_score", 0.0)),
            "wall_s": float(sum(c.time_s.values())),
            "budget": kv,
            "within_budget": bool(c.peak_kv_tokens <= kv),
            "first": first,
            "winner": {
                "id": w.candidate_id,
                "text": w.text,
                "token_ids": list(w.token_ids),
                "stop_reason": w.stop_reason,
                "parent": w.parent,
                "forked_round": w.forked_round,
            },
        }

    return run


PLACEHOLDER = {"best": 0.0, "flops": 1.0, "steps": 0, "decode_tokens": 0, "rows_x_context": 0.0, "reward_s": 0.0}


def report_half(records: list[dict], args: dict, tm, max_new: int, labels: list[str], summary: dict) -> dict:
    """The search rows on the report half, as ``analysis.summarize`` computes a row (the same bootstrap resamples:
    the halves drawn in its order and seed), paired with fixed alpha 0.5; their selection-half figures are left
    out where they did not run there."""
    from rodeco.experiments import analysis

    m = analysis.Measurements(records, args["n"], tm, max_new)
    sel_idx, rep_idx = analysis.split_halves(m.index)
    pos = {i: k for k, i in enumerate(m.index)}
    rng = np.random.default_rng(0)
    analysis.Half.of(m, np.array([pos[i] for i in sel_idx]), rng, 0)
    report = analysis.Half.of(m, np.array([pos[i] for i in rep_idx]), rng, args["bootstrap"])
    table: dict[str, dict[str, Any]] = {}
    boot: dict[str, np.ndarray] = {}
    for label in [analysis.REF, *labels]:
        run = m.method(label, 1)
        if run is None:
            raise ValueError(f"{label}: a replicate of a prompt was infeasible")
        table[f"{label}@1"] = {}
        table[f"{label}@1"]["report"], boot[f"{label}@1"] = report.stats(m, run, 1, analysis.REPORT_CI)
        # not run on the selection half (--report-only): its figure there is not a number
        table[f"{label}@1"]["selection"] = {"speedup_flops": float("nan"), "bound": None, "not_run": True}
    analysis.pair_with(table, boot, analysis.REF)
    ref = summary["methods"][f"{analysis.REF}@1"]["report"]
    assert abs(table[f"{analysis.REF}@1"]["report"]["speedup_flops"] - ref["speedup_flops"]) < 1e-9
    return {k: v for k, v in table.items() if not k.startswith(analysis.REF + "@")}


def run_searches(a: argparse.Namespace, records: list[dict], sel: list[int], rep: list[int]) -> dict[int, dict]:
    """Each prompt's live search runs (``search_prompts.jsonl``, rewritten after every run; resumed): method by
    method, set by set (candidate streams ``first``, ``first + 1``, ...), prompt by prompt, so that whatever is done
    when a run stops is whole methods on whole sets. Set ``first=0`` is ``methods``, the others ``sets[first]``."""
    from tqdm.auto import tqdm

    from rodeco.core.results import atomic_write

    out_f = a.run_dir / "search_prompts.jsonl"
    done = {}
    if out_f.is_file():
        done = {d["prompt_index"]: d for d in map(json.loads, out_f.read_text().splitlines()) if d}
    run = live_runner(a.pool, [], compile_step=a.compile)
    by_index = {r["prompt_index"]: r for r in records}
    targets = [i for i in by_index if not a.report_only or i in rep]

    def run_all(label: str, node: dict, n: int, first: int, indices: list[int]) -> None:
        for i in tqdm(indices, desc=f"{label} from stream {first}", unit="prompt"):
            have = done.setdefault(i, {"prompt_index": i, "methods": {}, "sets": {}})
            slot = have["methods"] if first == 0 else have.setdefault("sets", {}).setdefault(str(first), {})
            if label in slot and slot[label].get("node", node) != node:
                raise SystemExit(
                    f"{out_f}: {label} of prompt {i} ran as {slot[label]['node']}, not {node}: "
                    "start another run directory"
                )
            if label not in slot:
                slot[label] = {**run(i, node, n, int(by_index[i]["budget"]["1"]), first), "node": node}
                atomic_write(out_f, "".join(json.dumps(done[k]) + "\n" for k in sorted(done)))

    for label in a.methods:
        node, n = METHODS[label]
        if label == PF and a.pf_temperature is not None:  # chosen before, elsewhere: no grid
            node = {**node, "temperature": a.pf_temperature}
        elif label == PF and a.pf_grid:  # its temperature: the grid's best mean guide reward on the selection half
            for t in a.pf_grid:
                run_all(pf_label(t), {**node, "temperature": t}, n, 0, sel)
            means = {t: float(np.mean([done[i]["methods"][pf_label(t)]["best"] for i in sel])) for t in a.pf_grid}
            best = max(means, key=lambda t: means[t])
            print(
                f"particle_filter temperature on the selection half ({len(sel)} prompts, streams 0..): "
                + ", ".join(f"{t:g}: {m:.4f}" for t, m in means.items())
                + f" -> {best:g}"
            )
            node = {**node, "temperature": best}
        for first in a.firsts:
            run_all(label, node, n, first, targets)
    if a.alternatives:
        for label, (node, n) in ALTERNATIVES.items():
            run_all(label, node, n, 0, sel)
    return done


def paired_rewards(records: list[dict], rep: list[int], labels: list[str], resamples: int) -> dict[str, list[float]]:
    """Each method's mean final reward minus fixed alpha 0.5's on the report half, with a 95% CI over prompts."""
    pos = {r["prompt_index"]: k for k, r in enumerate(records)}
    R = np.array([pos[i] for i in rep])
    boots = R[bootstrap.draws(len(R), resamples, 0)]
    ref = np.array([r["methods"]["fixed_alpha_0.5"]["1"]["best"] for r in records])
    out = {}
    for label in labels:
        d = np.array([r["methods"][label]["1"]["best"] for r in records]) - ref
        out[label] = [float(d[R].mean()), *bootstrap.ci(d[boots].mean(1))]
    return out


def print_table(summary: dict, labels: list[str], alt: list[str], paired: dict, halves: dict[str, list[int]]) -> None:
    nan2 = [float("nan")] * 2
    print(
        f"{'method':>28} {'half':>9} {'reward':>8} {'improvement [95% CI]':>24} {'TFLOPs':>8} "
        f"{'FLOPs speedup vs BoN [95% CI]':>32} {'vs fixed 0.5':>24}"
    )
    for label in labels + alt:
        half = "selection" if label in alt else "report"
        x = summary["methods"][f"{label}@1"][half]
        ci, sci = x.get("improvement_ci", nan2), x.get("speedup_flops_ci", nan2)
        vs = x.get("vs_fixed_alpha_0.5", {})
        vs_s = (
            f"{vs.get('ratio', float('nan')):.2f} [{vs.get('ci', nan2)[0]:.2f}, {vs.get('ci', nan2)[1]:.2f}]"
            if vs
            else ""
        )
        curve = summary["curve"][half]
        at_flops = float(np.interp(np.log(x["flops"]), np.log(curve["flops"]), curve["improvement"]))
        vs_s += f"  BoN at these FLOPs: {at_flops:.1f}"
        dr = paired.get(label) if half == "report" else None
        vs_s += f"  reward - fixed: {dr[0]:+.4f} [{dr[1]:+.4f}, {dr[2]:+.4f}]" if dr else ""
        print(
            f"{label:>28} {half:>9} {x['reward']:8.4f} {x['improvement']:8.1f} [{ci[0]:6.1f}, {ci[1]:6.1f}] "
            f"{x['flops'] / 1e12 / len(halves[half]):8.3f} {x['speedup_flops']:8.2f} "
            f"[{sci[0]:6.2f}, {sci[1]:6.2f}]{'+' if x['beyond_curve'] else ' '} {vs_s:>24}"
        )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="the efficiency run's directory (efficiency_prompts.jsonl)")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts (in the records' order)")
    ap.add_argument(
        "--all-report",
        action="store_true",
        help="every prompt is reported (nothing is chosen on them; with --pf-temperature): the live "
        "methods run on all, and only the judged part (guide, judges, diagnostics) is printed",
    )
    ap.add_argument("--alternatives", action="store_true", help="also the alternatives, on the selection half")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="the search policies on the report half only (particle_filter's --pf-grid still runs on "
        "the selection half)",
    )
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument(
        "--methods", nargs="+", default=list(METHODS), choices=list(METHODS), help="the live methods, run in this order"
    )
    ap.add_argument(
        "--firsts",
        nargs="+",
        type=int,
        default=[0],
        help="candidate sets: each method runs from streams first, first + 1, ... (0 64: the two halves "
        "of a 128-candidate pool)",
    )
    ap.add_argument(
        "--pf-grid",
        nargs="*",
        type=float,
        default=PF_GRID,
        help="particle_filter's temperatures tried on the selection half (none: its default)",
    )
    ap.add_argument(
        "--pf-temperature",
        type=float,
        default=None,
        help="particle_filter's temperature, chosen before (on another run's selection half): no grid",
    )
    ap.add_argument("--compile", action="store_true", help="the generator's compiled decode step (same tokens)")
    ap.add_argument(
        "--judges",
        nargs="*",
        default=["chrf", "ref_sim", "smollm_judge"],
        help="judge options that score every method's winners (default: every offline judge that applies "
        "to AlpacaEval prompts); none: skip the judged part",
    )
    ap.add_argument("--runs-only", action="store_true", help="run the live methods and stop (no analysis)")
    return ap


def main() -> int:
    ap = parser()
    a = ap.parse_args()
    from rodeco.experiments import analysis

    records = [json.loads(x) for x in (a.run_dir / "efficiency_prompts.jsonl").read_text().splitlines() if x.strip()]
    records = records[: a.limit] if a.limit else records
    if a.all_report and PF in a.methods and a.pf_temperature is None:
        ap.error(
            "--all-report chooses nothing on these prompts: give particle_filter's --pf-temperature, chosen on "
            "another run's selection half"
        )
    sel, rep = (
        ([], [r["prompt_index"] for r in records])
        if a.all_report
        else analysis.split_halves([r["prompt_index"] for r in records])
    )
    done = run_searches(a, records, sel, rep)
    if a.runs_only:
        return 0
    if a.all_report:  # no halves: only the judged part, which reads every method's winners on every prompt
        from rodeco.experiments.bench.search_judged import judged

        judged(a, records, done, rep, all_reported=True)
        return 0
    add_runs(records, done, a.methods)
    analyse(a, records, done, sel, rep)
    if a.judges:
        from rodeco.experiments.bench.search_judged import judged

        judged(a, records, done, rep)
    return 0


def add_runs(records: list[dict], done: dict[int, dict], methods: list[str]) -> None:
    """The search runs into the records as methods: set 0 as the record's methods, the other sets as its
    replicates (by their offset)."""
    for r in records:
        d = done.get(r["prompt_index"], {"methods": {}, "sets": {}})
        for slot, runs in [
            (r["methods"], d["methods"]),
            *[(x["methods"], d.get("sets", {}).get(str(x["offset"]), {})) for x in r["replicates"]],
        ]:
            for label in methods:  # a prompt the search policies did not run on (--report-only): never read
                slot[label] = {"1": PLACEHOLDER}
            for label, run_ in runs.items():
                slot[label] = {"1": run_}


def summarize(
    a: argparse.Namespace, records: list[dict], eff: dict, args: dict, labels: list[str], alt: list[str]
) -> dict:
    """The efficiency experiment's summary of the records under ``args``: its own methods and the alternatives
    on both halves, the search rows on the report half (``eff``: the efficiency run's efficiency.json)."""
    from rodeco.experiments import analysis
    from rodeco.replays.pool import Pool

    tm = (
        analysis.TimeModel(**eff["time_model"])
        if "time_model" in eff
        else analysis.TimeModel.fit(Pool(a.pool), [r["prompt_index"] for r in records])
    )
    max_new = int(records[0]["settings"]["max_new_tokens"])
    summary = analysis.summarize(records, args, tm, max_new, labels[:2] + alt)  # what the efficiency run has
    summary["methods"].update(report_half(records, args, tm, max_new, list(a.methods), summary))
    return summary


def analyse(a: argparse.Namespace, records: list[dict], done: dict[int, dict], sel: list[int], rep: list[int]) -> None:
    """The efficiency analysis with the search rows: ``search.json`` (efficiency.json's layout, which
    scripts/results_tables.py renders, with the search rows and how they ran), ``search.md``, and the table."""
    from rodeco.core.results import atomic_write
    from rodeco.experiments import analysis, render

    labels = ["fixed_alpha_0.5", "fixed_alpha_0.5_oracle", *a.methods]
    alt = [k for k in ALTERNATIVES if all(k in r["methods"] for r in records)]
    eff = json.loads((a.run_dir / "efficiency.json").read_text())
    args = {**eff["args"], "bootstrap": a.bootstrap, "scales": [1]}
    summary = summarize(a, records, eff, args, labels, alt)
    within = all(
        m["within_budget"]
        for d in done.values()
        for runs in [d["methods"], *d.get("sets", {}).values()]
        for m in runs.values()
    )
    paired = paired_rewards(records, rep, labels, a.bootstrap)
    res = {
        **{k: v for k, v in eff.items() if k not in summary and k != "per_prompt"},
        **summary,
        "args": args,
        "headline": analysis.headline(summary),
        "per_prompt": records,
        "search": {
            "within_budget": within,
            "live": list(a.methods) + alt,
            "reward_minus_fixed_alpha_0.5": paired,
            "mean_copies": {k: float(np.mean([done[i]["methods"][k]["copies"] for i in rep])) for k in a.methods},
        },
    }
    atomic_write(a.run_dir / "search.json", json.dumps(res, indent=1, default=float) + "\n")
    (a.run_dir / "search.md").write_text(render.markdown(summary), encoding="utf-8")
    print(
        f"{len(records)} prompts ({len(rep)} report, {len(sel)} selection); budget: Best-of-4's memory per prompt; "
        f"every copy within it: {within}"
    )
    print_table(summary, labels, alt, paired, {"report": rep, "selection": sel})


if __name__ == "__main__":
    sys.exit(main())
