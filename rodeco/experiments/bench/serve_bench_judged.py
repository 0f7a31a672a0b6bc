"""Judges of ``scripts/serve_bench.py``'s answers, client-side and outside every latency: each server's winners
(rodeco's Speculative Rejection, Best-of-N and search policy, vLLM's Best-of-N) scored by judges the servers never
saw, with each server's mean and the differences ``PAIRS`` (SR − vLLM, SR − Best-of-N, search − vLLM, SR − search)
paired over the requests all of them answered (bootstrap 95% CIs over those requests), as ``judge_*`` lines.
serve_bench runs it after its phases; a run
written before (its ``serve_bench.json``, or a snapshot of one) is judged again from its texts::

    python scripts/serve_bench_judged.py docs/data/serve_bench_af32_bo8.json --out runs/sb8_judged
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

JUDGES = ["chrf", "ref_sim", "smollm_judge"]  # every offline judge of AlpacaEval prompts (gold problems: gold)
SERVERS = ("sr", "bon", "search", "vllm")
PAIRS = (("sr", "vllm"), ("sr", "bon"), ("search", "vllm"), ("sr", "search"))  # differences reported, paired


def judge_servers(
    doc: dict[str, Any], prompts: dict[int, Any], judges: Any, resamples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Each server's winners scored by each judge (``scores[judge][server][i]``, None where the request failed),
    the means and paired differences with CIs, the judges' cost, and ``lines`` to print. ``prompts``: the run's
    prompts by index (their text, and their record as ``meta``: the ``gold`` judge's answer)."""
    from rodeco.core.judging import Item
    from rodeco.experiments.bootstrap import ci, draws

    servers = [s for s in SERVERS if s in doc["servers"]]
    recs = {s: doc["servers"][s]["records"] for s in servers}
    k = len(recs[servers[0]])
    scores: dict[str, dict[str, list[float | None]]] = {j.name: {s: [None] * k for s in servers} for j in judges.judges}
    for i in range(k):
        index = recs[servers[0]][i]["prompt_index"]
        items = [Item(n, recs[s][i]["server"]["text"], ()) for n, s in enumerate(servers) if recs[s][i]["ok"]]
        got = judges.score(prompts[index].text, index, items, meta=prompts[index].meta)
        for item in items:
            for e in got[item.candidate_id]:
                scores[e.name][servers[item.candidate_id]][i] = e.score
    both = [i for i in range(k) if all(recs[s][i]["ok"] for s in servers)]
    idx = draws(len(both), resamples, seed) if both else None
    out: dict[str, Any] = {
        "requests": k,
        "paired_requests": len(both),
        "scores": scores,
        "figures": {},
        "cost": judges.costs(),
    }
    lines = [
        f"judge_requests: {len(both)} of {k} requests answered by every server ({', '.join(servers)}); 95% "
        "bootstrap CIs over those requests"
    ]
    lines += [
        f"judge_cost_{name}: {c['calls']} calls, {c['tokens']} tokens, {c['flops'] / 1e12:.3f} TFLOPs, "
        f"{c['seconds']:.1f} s (client-side, after the phases: in no server's latency)"
        for name, c in out["cost"].items()
    ]
    for name, by in scores.items():
        x = {s: np.array([np.nan if by[s][i] is None else by[s][i] for i in both], dtype=np.float64) for s in servers}
        fig: dict[str, Any] = {}
        for s in servers:
            fig[s] = {"mean": float(np.nanmean(x[s])), "ci": ci(np.nanmean(x[s][idx], 1))} if both else None
        for one, other in PAIRS:
            if one in servers and other in servers and both:
                d = x[one] - x[other]
                fig[f"{one}_minus_{other}"] = {"mean": float(np.nanmean(d)), "ci": ci(np.nanmean(d[idx], 1))}
        out["figures"][name] = fig
        lines += [
            f"judge_{name}_{key}: {v['mean']:+.4f} [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]"
            for key, v in fig.items()
            if v is not None
        ]
    out["lines"] = lines
    return out


def prompts_of_run(doc: dict[str, Any]) -> dict[int, Any]:
    """The run's prompts by index, from its ``--data`` (as serve_bench loaded them)."""
    from rodeco.experiments.bench.serve_bench_prompts import load

    wanted = set(doc["prompt_indices"])
    limit = max(len(wanted) + int(doc["args"].get("warmup", 1)), 1)
    return {p.index: p for p in load(doc["args"]["data"], limit) if p.index in wanted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a serve_bench.json (or its directory)")
    ap.add_argument("--out", type=Path, required=True, help="where serve_bench_judged.json is written")
    ap.add_argument(
        "--judges", nargs="*", default=JUDGES, help="judge options (default: every offline judge of AlpacaEval prompts)"
    )
    ap.add_argument("--bootstrap", type=int, default=1000)
    a = ap.parse_args(argv)
    path = a.run / "serve_bench.json" if a.run.is_dir() else a.run
    doc = json.loads(path.read_text(encoding="utf-8"))
    from rodeco.rejudge import judges_by_name

    judged = judge_servers(
        doc,
        prompts_of_run(doc),
        judges_by_name(a.judges, doc["args"]["reward"]),
        a.bootstrap,
        int(doc["args"].get("seed", 0)),
    )
    print("\n".join(judged["lines"]))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "serve_bench_judged.json").write_text(json.dumps({"run": str(path), **judged}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
