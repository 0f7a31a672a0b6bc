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

# label -> (policy node, start rows)
METHODS = {
    "particle_filter_start_16": ({"name": "particle_filter"}, 16),
    "beam_start_16": ({"name": "beam"}, 16),
    "dvts_start_16": ({"name": "dvts"}, 16),
}
ALTERNATIVES = {  # tried on the selection half only
    "particle_filter_start_4": ({"name": "particle_filter"}, 4),
    "beam_start_16_width_8": ({"name": "beam", "beam_width": 8}, 16),
}


def live_runner(pool_path: str, overrides: list[str]):
    """A function (prompt index, policy node, start, kv budget) -> the run record the efficiency analysis reads."""
    import numpy as np

    import rodeco
    from rodeco.budget import Budget
    from rodeco.compose import option_node
    from rodeco.experiments.efficiency import rows_x_context
    from rodeco.loop import decode_batch
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.pool import Pool
    from rodeco.replay import live_generator
    from rodeco.roles import RoleBuilder, choose_roles
    from rodeco.runner import loop_settings
    from rodeco.state import PromptRef

    pool = Pool(pool_path)
    plugins = default_plugins()
    cfg = rodeco.load_config(["sampling.max_new_tokens=" + str(pool.settings["max_new_tokens"]), *overrides])
    gen = live_generator(pool)
    builder = RoleBuilder(plugins, gen.name, BuildContext(generator=gen, device=str(gen.device), plugins=plugins))
    choices = choose_roles(cfg, plugins)
    cache: dict[str, object] = {}

    def run(index: int, node: dict, n: int, kv: int) -> dict:
        key = json.dumps(node, sort_keys=True)
        if key not in cache:
            full = {**option_node("policy", node["name"], plugins), **node}
            cache[key] = builder.roles(choices.with_(plugins, policy=full))
        roles = cache[key]
        s = loop_settings(cfg, gen, node["name"], choices.reward.name)
        s = dataclasses.replace(s, n=n, budget=Budget(kv, s.budget.min_tokens_per_round), seed=pool.settings["seed"])
        p = pool.prompt(index)
        (res,), c = decode_batch(gen, roles.reward, roles.policy, [PromptRef(p.index, p.text)], s,
                                 partial=roles.partial)
        copies = sum(len(v) for r in res.rounds for v in r.copies.values())
        return {"best": float(res.best.score), "n_start": res.n_start, "gen_flops": c.gen_flops,
                "reward_flops": c.reward_flops, "partial_flops": c.partial_reward_flops, "flops": c.total_flops,
                "decode_tokens": c.gen_decode_tokens, "steps": c.decode_steps, "peak_kv_tokens": c.peak_kv_tokens,
                "rows_x_context": rows_x_context(c, gen.shape), "rounds": len(res.rounds), "copies": copies,
                "reward_s": float(c.time_s.get("score", 0.0) + c.time_s.get("partial_score", 0.0)),
                "wall_s": float(sum(c.time_s.values())), "budget": kv,
                "within_budget": bool(c.peak_kv_tokens <= kv)}

    return run, np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="the efficiency run's directory (efficiency_prompts.jsonl)")
    ap.add_argument("--pool", required=True)
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts (in the records' order)")
    ap.add_argument("--alternatives", action="store_true", help="also the alternatives, on the selection half")
    ap.add_argument("--bootstrap", type=int, default=1000)
    a = ap.parse_args()
    from rodeco.experiments import analysis
    from rodeco.pool import Pool
    from rodeco.results import atomic_write

    records = [json.loads(x) for x in (a.run_dir / "efficiency_prompts.jsonl").read_text().splitlines() if x.strip()]
    records = records[: a.limit] if a.limit else records
    sel, rep = analysis.split_halves([r["prompt_index"] for r in records])
    out_f = a.run_dir / "search_prompts.jsonl"
    done = {}
    if out_f.is_file():
        done = {d["prompt_index"]: d for d in map(json.loads, out_f.read_text().splitlines()) if d}
    run, np = live_runner(a.pool, [])
    from tqdm.auto import tqdm

    for r in tqdm(records, desc="search", unit="prompt"):
        i = r["prompt_index"]
        want = {**METHODS, **(ALTERNATIVES if a.alternatives and i in sel else {})}
        have = done.setdefault(i, {"prompt_index": i, "methods": {}})
        for label, (node, n) in want.items():
            if label not in have["methods"]:
                have["methods"][label] = run(i, node, n, int(r["budget"]["1"]))
        atomic_write(out_f, "".join(json.dumps(done[k]) + "\n" for k in sorted(done)))  # as each prompt finishes
    for r in records:
        for label, run_ in done[r["prompt_index"]]["methods"].items():
            r["methods"][label] = {"1": run_}
    labels = ["fixed_alpha_0.5", "fixed_alpha_0.5_oracle", *METHODS]
    alt = [k for k in ALTERNATIVES if all(k in r["methods"] for r in records)]
    eff = json.loads((a.run_dir / "efficiency.json").read_text())
    args = {**eff["args"], "bootstrap": a.bootstrap, "scales": [1]}
    tm = analysis.TimeModel(**eff["time_model"]) if "time_model" in eff else analysis.TimeModel.fit(
        Pool(a.pool), [r["prompt_index"] for r in records])
    summary = analysis.summarize(records, args, tm, int(records[0]["settings"]["max_new_tokens"]), labels + alt)
    within = all(m["within_budget"] for d in done.values() for m in d["methods"].values())
    copies = {k: float(np.mean([done[r["prompt_index"]]["methods"][k]["copies"] for r in records])) for k in METHODS}
    summary["search"] = {"within_budget": within, "mean_copies": copies, "live": list(METHODS) + alt}
    atomic_write(a.run_dir / "search.json", json.dumps(summary, indent=1, default=float) + "\n")
    print(f"{len(records)} prompts ({len(rep)} report, {len(sel)} selection); budget: Best-of-4's memory per prompt; "
          f"every copy within it: {within}")
    print(f"{'method':>28} {'half':>9} {'reward':>8} {'improvement [95% CI]':>24} {'TFLOPs':>8} "
          f"{'FLOPs speedup vs BoN [95% CI]':>32} {'vs fixed 0.5':>24}")
    for label in labels + alt:
        row = summary["methods"][f"{label}@1"]
        for half in ("report",) if label not in alt else ("selection",):
            x = row[half]
            ci = x.get("improvement_ci", [float("nan")] * 2)
            sci = x.get("speedup_flops_ci", [float("nan")] * 2)
            vs = x.get("vs_fixed_alpha_0.5", {})
            vs_s = f"{vs.get('ratio', float('nan')):.2f} [{vs.get('ci', [float('nan')] * 2)[0]:.2f}, " \
                   f"{vs.get('ci', [float('nan')] * 2)[1]:.2f}]" if vs else ""
            print(f"{label:>28} {half:>9} {x['reward']:8.4f} {x['improvement']:8.1f} [{ci[0]:6.1f}, {ci[1]:6.1f}] "
                  f"{x['flops'] / 1e12 / len(rep if half == 'report' else sel):8.3f} {x['speedup_flops']:8.2f} "
                  f"[{sci[0]:6.2f}, {sci[1]:6.2f}]{'+' if x['beyond_curve'] else ' '} {vs_s:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
