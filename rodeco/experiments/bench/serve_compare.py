"""Server settings side by side: finished ``scripts/serve_bench.py`` runs of rodeco's server (one directory each,
the same requests under different ``--rodeco-arg`` settings), their requests a second, decode tokens a second, p50
and p95 latency, mean reward, and where the server's time went (``time_share_of_span``: each phase's seconds over the
phase's span, summed over the requests' own shares; ``held`` is request-seconds, rows set aside waiting for scores),
each run's requests a second as a ratio of the first run's::

    python scripts/serve_compare.py on-thread=runs/prof/off off-thread=runs/prof/on_2_1 --server sr
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PHASES = ("decode", "prefill", "prune", "score", "partial_score", "held")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="NAME=DIR: a serve_bench output directory, the first the baseline")
    ap.add_argument("--server", default="sr", help="the phase of each run to compare (sr, bon)")
    a = ap.parse_args(argv)
    for r in a.runs:
        if "=" not in r:
            ap.error(f"{r}: give each run as NAME=DIR (e.g. off-thread=runs/prof/on_2_1)")
    return a


def load(path: Path, server: str) -> dict[str, Any]:
    doc = json.loads((path / "serve_bench.json").read_text(encoding="utf-8"))
    if server not in doc.get("servers", {}):
        have = sorted(doc.get("servers", {}))
        raise SystemExit(f"{path}: no {server!r} phase (it has {have}); pick one with --server")
    return doc["servers"][server]


def rows(runs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row a run: its figures and its requests a second over the first run's."""
    base = runs[0][1]["summary"]["requests_per_s"]
    out = []
    for name, d in runs:
        s, ss = d["summary"], d["server_side"]
        share = ss.get("time_share_of_span", {})
        out.append(
            {
                "run": name,
                "requests_per_s": s["requests_per_s"],
                "ratio": s["requests_per_s"] / base if base else float("nan"),
                "decode_tokens_per_s": ss.get("decode_tokens_per_s"),
                "p50_latency_s": s["p50_latency_s"],
                "p95_latency_s": s["p95_latency_s"],
                "mean_reward": s["mean_reward"],
                **{f"share_{k}": share.get(k, 0.0) for k in PHASES},
            }
        )
    return out


def table(out: list[dict[str, Any]]) -> str:
    head = f"{'run':>14} {'req/s':>7} {'ratio':>6} {'tok/s':>7} {'p50 s':>7} {'p95 s':>7} {'reward':>7}"
    head += "".join(f" {k:>13}" for k in PHASES)
    lines = [head]
    for r in out:
        line = f"{r['run']:>14} {r['requests_per_s']:7.3f} {r['ratio']:6.2f} {r['decode_tokens_per_s'] or 0:7.1f}"
        line += f" {r['p50_latency_s']:7.1f} {r['p95_latency_s']:7.1f} {r['mean_reward']:7.3f}"
        line += "".join(f" {r['share_' + k]:13.3f}" for k in PHASES)
        lines.append(line)
    lines.append("ratio: requests/s over the first run's; phases: seconds over the span (held: request-seconds)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    runs = [(n, load(Path(p), a.server)) for n, p in (r.split("=", 1) for r in a.runs)]
    sys.stdout.write(table(rows(runs)) + "\n")


if __name__ == "__main__":
    main()
