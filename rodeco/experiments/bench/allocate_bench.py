"""Cross-prompt allocation measured on a recorded pool: ``allocate`` against ``fixed``, ``adaptive`` and
``calibrated`` on the same batches of prompts, each batch at the same total memory as the per-prompt budget times
the batch (the KV memory Best-of-n fills at full length, summed over its prompts).

    python scripts/allocate_bench.py pools/af100 --batches 1,4,8 --out runs/allocate100

The pool's prompts in index order are cut into consecutive batches of each size (the rest left out). Every method
is replayed by the real loop on every batch (``rodeco.replays.replay.replay_batch``; rewards served from the pool's
cache) from ``n=auto``. Per method and batch size: the mean final reward of the chosen responses, the improvement score
(Best-of-n = 100, from the pool's candidates), the FLOPs, and each method's mean reward minus ``allocate``'s, paired
on the same batches, with a bootstrap 95% CI over batches. Nothing is chosen here: every method runs with its
option's parameters, so all prompts are reported. Extra arguments are config overrides (e.g. ``reward=...``,
``budget.min_tokens_per_round=...``). Writes ``allocate.json`` and ``allocate.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

import rodeco
from rodeco.common.budget import Budget, full_length_tokens
from rodeco.compose import option_node
from rodeco.experiments.bootstrap import ci as bootstrap_ci
from rodeco.experiments.bootstrap import draws
from rodeco.experiments.metrics import expected_best_of, improvement_score
from rodeco.experiments.record import pool_roles
from rodeco.experiments.replay_policy import best_score
from rodeco.plugins import default_plugins
from rodeco.replays.replay import open_pool, replay_batch
from rodeco.roles import SAME, choose_roles
from rodeco.runner import loop_settings

log = logging.getLogger("allocate_bench")
METHODS = {
    "fixed_alpha_0.5": ("fixed", {"alpha": 0.5}),
    "adaptive_delta_0.05": ("adaptive", {"delta": 0.05}),
    "calibrated_delta_0.05": ("calibrated", {"delta": 0.05}),
    "allocate_delta_0.05": ("allocate", {"delta": 0.05}),
}
REF = "allocate_delta_0.05"


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pool", type=Path)
    ap.add_argument("--batches", default="1,4,8", help="batch sizes (prompts decoded together)")
    ap.add_argument("--n", type=int, default=4, help="the per-prompt budget: the memory Best-of-n fills")
    ap.add_argument("--prompts", type=int, default=None, help="the pool's first this many prompts (default: all)")
    ap.add_argument(
        "--calibration",
        default=None,
        help="the calibrated methods' calibration file (default: the committed one of the pool's generator and reward)",
    )
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_known_args(argv)


def build(cfg, plugins, builder, policy: str, params: dict[str, Any], overrides: dict[str, Any]):
    """The roles of one method, from the one ``builder`` every method shares (one reward object: a partial score
    computed for one method is served to the others, and saved with the rest)."""
    choices = choose_roles(cfg, plugins, live=False)
    node = {**option_node("policy", policy, plugins), **params, **overrides.get(policy, {})}  # its file's name
    return builder.roles(choices.with_(plugins, partial={"name": SAME}, policy=node))


def measure(a: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    plugins = default_plugins()
    pool, rgen = open_pool(a.pool)
    indices = sorted(pool.indices())[: a.prompts]
    cfg = rodeco.load_config(
        [
            f"sampling.max_new_tokens={pool.settings['max_new_tokens']}",
            f"seed={pool.settings['seed']}",
            *[f"sampling.{k}={v}" for k, v in pool.settings["sampling"].items()],
            *overrides,
        ],
        plugins,
    )
    cal = {"calibration": a.calibration} if a.calibration else {}
    per_policy = {"calibrated": cal, "allocate": cal}
    new = cfg.sampling.max_new_tokens
    builder = pool_roles(cfg, plugins, pool, rgen)
    final_reward = build(cfg, plugins, builder, "fixed", {}, {}).reward.reward
    finals = {i: np.asarray(final_reward.score(pool.prompt(i).final_requests()), dtype=np.float64) for i in indices}
    out: dict[str, Any] = {"pool": str(a.pool), "n": a.n, "prompts": len(indices), "batches": {}}
    for B in [int(x) for x in a.batches.split(",")]:
        groups = [indices[k : k + B] for k in range(0, len(indices) - B + 1, B)]
        res: dict[str, Any] = {}
        for label, (policy, params) in METHODS.items():
            roles = build(cfg, plugins, builder, policy, params, per_policy)
            assert roles.reward.reward is final_reward  # one builder: one reward object, one score cache
            rows: list[dict[str, Any]] = []
            for g in groups:  # Best-of-n's memory for the batch, as Budget.for_batch splits it
                kv = full_length_tokens(a.n, [len(pool.prompt(i).prompt_ids) for i in g], new, rgen.kv)
                s = loop_settings(cfg, rgen, label, roles.choices.reward.name)
                s = dataclasses.replace(
                    s, n="auto", all_candidates=False, budget=Budget(kv, s.budget.min_tokens_per_round)
                )
                results, comp, _ = replay_batch(pool, rgen, roles.reward, roles.policy, g, s)
                rows.append(
                    {
                        "prompts": g,
                        "best": [float(best_score(r)) for r in results],
                        "flops": comp.total_flops,
                        "n_start": results[0].n_start,
                    }
                )
            res[label] = rows
            log.info("batch %d, %s: mean reward %.4f", B, label, np.mean([x for r in rows for x in r["best"]]))
        final_reward.save()  # every method's partial scores (one reward object) stay in the pool's cache
        out["batches"][str(B)] = {
            "groups": len(groups),
            "runs": res,
            "summary": summarize(res, finals, a.n, a.bootstrap),
        }
    return out


def summarize(
    res: dict[str, list[dict[str, Any]]], finals: dict[int, np.ndarray], n: int, resamples: int
) -> dict[str, Any]:
    """Per method: mean reward, improvement score, FLOPs; its mean reward minus the reference's on the same
    batches with a bootstrap 95% CI over batches."""
    boots = draws(len(res[REF]), resamples, 0)
    ref = np.array([np.mean(r["best"]) for r in res[REF]])
    out = {}
    for label, rows in res.items():
        idx = [i for r in rows for i in r["prompts"]]
        best = np.array([x for r in rows for x in r["best"]])
        hi = [expected_best_of(finals[i], n) for i in idx]
        lo = [-expected_best_of(-finals[i], n) for i in idx]
        per = np.array([np.mean(r["best"]) for r in rows])
        d = per - ref
        ci = bootstrap_ci(d[boots].mean(1))
        out[label] = {
            "mean_reward": float(best.mean()),
            "improvement": improvement_score(best, hi, lo),
            "tflops": sum(r["flops"] for r in rows) / 1e12,
            f"minus_{REF}": float(d.mean()),
            f"minus_{REF}_ci": ci,
        }
    return out


def markdown(out: dict[str, Any]) -> str:
    lines = [
        f"{out['prompts']} prompts; budget per batch: Best-of-{out['n']}'s memory times the prompts in it. "
        f"Mean final reward minus {REF}'s on the same batches [95% CI over batches].",
        "",
        "| batch | method | mean reward | improvement | TFLOPs | minus allocate [95% CI] |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for B, b in out["batches"].items():
        for label in sorted(b["summary"], key=lambda x: list(METHODS).index(x) if x in METHODS else len(METHODS)):
            s = b["summary"][label]
            ci = s[f"minus_{REF}_ci"]
            lines.append(
                f"| {B} | {label} | {s['mean_reward']:.4f} | {s['improvement']:.1f} | {s['tflops']:.3f} | "
                f"{s[f'minus_{REF}']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    a, overrides = parse(argv)
    out = measure(a, overrides)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "allocate.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
    md = markdown(out)
    (a.out / "allocate.md").write_text(md, encoding="utf-8")
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
