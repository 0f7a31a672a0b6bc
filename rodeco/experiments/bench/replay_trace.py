"""Replay serve_bench's recorded arrivals over a pool, without a model: the open batch's scheduling studied offline.

    python scripts/replay_trace.py --pool DIR --trace runs/load/rate_0.2/serve_bench.json [--trace ...] \
        [--phase sr] [--check-tokens 16] [--batch-requests 16] [--out FILE] [-- <rodeco overrides>]

Each ``--trace`` is a ``serve_bench.py`` snapshot: its ``--phase`` requests arrive at their recorded times, each with
the budget the server gave it (its ``kv_tokens``), and decode through the open loop (``rodeco.replays.replay_open``)
over the pool's candidates under the phase's policy (``sr``: ``fixed`` with the run's ``--alpha``; ``bon``: ``none``),
the running requests' budgets within the server's ``--kv-tokens``. The clock is modelled (``TimeModel`` fitted to the
pool's measured step times, the pool's prefills, rewards as computed), so its latencies are modelled latencies; they are
printed beside the server's measured ones for the same requests. The pool must hold the trace's prompts (record it with
``rodeco experiment=pool`` on the same data, candidates at least the phase's ``best_of``); its seed is one for all
requests, where the server's requests had their own, so the candidates are other samples of the same model.
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

log = logging.getLogger("replay_trace")

POLICIES = {"sr": lambda args: ["policy=fixed", f"policy.alpha={args['alpha']}"], "bon": lambda args: ["policy=none"]}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", type=Path, required=True, help="a pool recorded on the trace's prompts")
    ap.add_argument("--trace", type=Path, action="append", required=True, help="a serve_bench.json (repeatable)")
    ap.add_argument("--phase", default="sr", choices=sorted(POLICIES), help="the trace's phase to replay")
    ap.add_argument("--check-tokens", type=int, default=16, help="serve.check_tokens: tokens between admissions")
    ap.add_argument(
        "--batch-requests", type=int, default=16, help="serve.batch_requests: the most requests in the open batch"
    )
    ap.add_argument("--out", type=Path, default=None, help="write every request's modelled times here (JSON)")
    ap.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then rodeco overrides")
    a = ap.parse_args(argv)
    a.overrides = [o for o in a.overrides if o != "--"]
    for t in a.trace:
        if not t.is_file():
            ap.error(f"--trace {t}: no such file (a serve_bench.py snapshot)")
    return a


def replay_one(a: argparse.Namespace, doc: dict[str, Any], trace: str) -> dict[str, Any]:
    """One snapshot's phase replayed over the pool: its figures measured (the snapshot's) and modelled."""
    from rodeco.experiments.analysis import TimeModel
    from rodeco.plugins import BuildContext, default_plugins
    from rodeco.replays.replay import open_pool, pool_served
    from rodeco.replays.replay_open import Arrival, replay_arrivals

    args, recs = doc["args"], doc["servers"][a.phase]["records"]
    plugins = default_plugins()
    pool, gen = open_pool(a.pool)
    cfg, roles, s = _settings(a, args, plugins, pool, gen)
    missing = sorted({r["prompt_index"] for r in recs} - set(pool.indices()))
    if missing:
        raise SystemExit(
            f"--pool {a.pool} lacks {len(missing)} of the trace's prompts (e.g. {missing[:3]}): record them"
        )
    arrivals = [Arrival(float(r["arrival"]), int(r["prompt_index"]), int(r["server"]["kv_tokens"])) for r in recs]
    tm = TimeModel.fit(pool, sorted({x.index for x in arrivals}))
    out, stats, _ = replay_arrivals(
        pool,
        gen,
        roles.reward,
        lambda: plugins.build_policy(cfg.policy, BuildContext(plugins=plugins)),
        arrivals,
        s,
        step=tm.step,
        kv_tokens=int(args["kv_tokens"]),
        partial=roles.partial,
        check_tokens=a.check_tokens,
        max_prompts=a.batch_requests,
    )
    for served in pool_served(roles.reward, roles.partial):
        served.save()
    return {
        "trace": trace,
        "rate": args["rate"],
        "requests": len(recs),
        "check_tokens": a.check_tokens,
        "batch_requests": a.batch_requests,
        "time_model": dataclasses.asdict(tm),
        **_figures(doc["servers"][a.phase], out, float(args.get("latency_target", 60.0))),
        "mean_rows_per_step_modelled": float(np.mean(stats.step_rows)) if stats.step_rows else 0.0,
        "mean_requests_per_step_modelled": float(np.mean(stats.step_prompts)) if stats.step_prompts else 0.0,
        "mean_best_reward_replayed": float(np.mean([x.result.best.score for x in out if x.result is not None])),
        "requests_replayed": [
            {
                "prompt_index": x.arrival.index,
                "arrival": x.arrival.at,
                "kv_tokens": x.arrival.kv_tokens,
                "modelled_queue_s": x.modelled_queue_s,
                "modelled_latency_s": x.modelled_latency_s,
                "best_score": x.result.best.score if x.result is not None else None,
            }
            for x in out
        ],
    }


def _settings(a: argparse.Namespace, args: dict[str, Any], plugins: Any, pool: Any, gen: Any) -> tuple[Any, Any, Any]:
    """The run's config, roles (rewards served from the pool) and loop settings: the snapshot's server settings."""
    import rodeco
    from rodeco.experiments.record import pool_roles
    from rodeco.roles import choose_roles
    from rodeco.runner import loop_settings

    cfg = rodeco.load_config(
        [
            *POLICIES[a.phase](args),
            f"pool={a.pool}",
            f"n={args['best_of']}",
            f"reward={args['reward']}",
            f"sampling.max_new_tokens={args['max_tokens']}",
            f"sampling.top_k={args['top_k']}",
            f"sampling.temperature={args['temperature']}",
            *a.overrides,
        ]
    )
    roles = pool_roles(cfg, plugins, pool, gen).roles(choose_roles(cfg, plugins, live=False))
    return cfg, roles, loop_settings(cfg, gen, roles.choices.policy.name, roles.choices.reward.name)


def _figures(phase: dict[str, Any], out: list[Any], target: float) -> dict[str, Any]:
    """The phase's figures as the server measured them, and as the replay modelled them (goodput within
    ``target`` seconds)."""
    recs = [r for r in phase["records"] if r["ok"]]
    measured = {
        "requests_per_s": phase["summary"]["requests_per_s"],
        "goodput_per_s": phase["summary"]["goodput_per_s"],
        **_summary([float(r["latency"]) for r in recs], [float(r["server"]["queue_seconds"]) for r in recs]),
    }
    lat = np.asarray([x.modelled_latency_s for x in out])
    span = max(x.done_s for x in out) - min(x.arrival.at for x in out)
    modelled = {
        "requests_per_s": len(out) / span,
        "goodput_per_s": float((lat <= target).sum()) / span,
        **_summary(lat.tolist(), [x.modelled_queue_s for x in out]),
    }
    return {"latency_target_s": target, "measured": measured, "modelled": modelled}


def _summary(latency: list[float], queue: list[float]) -> dict[str, float]:
    x = np.asarray(latency)
    return {
        "p50_latency_s": float(np.percentile(x, 50)),
        "p95_latency_s": float(np.percentile(x, 95)),
        "mean_queue_s": float(np.mean(queue)),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    a = parse(argv)
    rows = []
    for t in a.trace:
        rows.append(replay_one(a, json.loads(t.read_text()), f"{t.parent.name}/{t.name}"))
        log.info("replayed %s", t)
    print(
        "| rate (req/s) | requests | batch requests | requests/s | goodput/s | p50 latency s | p95 latency s |"
        " mean queue s | rows a step (modelled) |"
    )
    print("|---:|---:|---:|---|---|---|---|---|---:|")
    for r in rows:  # each figure: measured (the snapshot's server, at serve.batch_requests 16) / modelled

        def pair(k: str, f: str, r: dict[str, Any] = r) -> str:
            return f"{r['measured'][k]:{f}} / {r['modelled'][k]:{f}}"

        print(
            f"| {r['rate']:g} | {r['requests']} | {r['batch_requests']} | {pair('requests_per_s', '.3f')} | "
            f"{pair('goodput_per_s', '.3f')} | {pair('p50_latency_s', '.1f')} | {pair('p95_latency_s', '.1f')} | "
            f"{pair('mean_queue_s', '.1f')} | {r['mean_rows_per_step_modelled']:.1f} |"
        )
    if a.out is not None:  # no path of this machine: the pool and traces by their names
        a.out.write_text(json.dumps({"pool": a.pool.name, "replays": rows}, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
