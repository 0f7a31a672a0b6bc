"""``scripts/serve_bench.py`` at several Poisson arrival rates, from light load to past saturation: one serve_bench
run a rate (its servers started and stopped within it, never two at once), each in ``--out/rate_R``, then one table
of every server at every rate: requests/s, goodput within the latency target, p50 / p95 / p99 latency, mean queue
wait and mean reward (bootstrap 95% CIs over requests), each judge's mean, and the paired ratios against vLLM.

Resumable: a rate whose ``serve_bench.json`` is complete (it has ``wall_seconds``) is not run again, so a stopped run
goes on where it stopped. The arguments after ``--`` are serve_bench's, passed to each run as they are (checked
by serve_bench's parser first)::

    python scripts/serve_load.py --rates 0.15 0.3 0.6 --out runs/load -- --requests 64 --best-of 16 --search beam
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("serve_load")
RATIOS = (
    "sr_over_vllm_goodput",
    "search_over_vllm_goodput",
    "sr_over_vllm_requests_per_s",
    "vllm_over_sr_p95_latency",
    "vllm_over_search_p95_latency",
    "sr_minus_vllm_mean_reward",
    "search_minus_vllm_mean_reward",
)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", required=True, help="Poisson arrivals per second, one run each")
    ap.add_argument("--out", type=Path, required=True, help="directory: rate_R/ per rate and serve_load.json")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="after --: serve_bench's arguments, for every rate")
    a = ap.parse_args(argv)
    rest = a.bench
    bad = [r for r in a.rates if not (math.isfinite(r) and r > 0)]
    if bad:
        ap.error(
            f"--rates {bad[0]}: each rate must be a number of requests a second > 0 (serve_bench --rate 0 "
            "sends every request at once: run it alone)"
        )
    rest = [x for x in rest if x != "--"]
    taken = [x for x in rest if x.split("=")[0] in ("--rate", "--out")]
    if taken:
        ap.error(f"{taken[0]}: serve_load sets serve_bench's --rate and --out itself (use --rates and --out)")
    from rodeco.experiments.bench.serve_bench import parse as bench_parse

    bench_parse([*rest, "--out", str(a.out)])  # serve_bench's errors now, not after a rate has run
    return a, rest


def complete(path: Path) -> dict[str, Any] | None:
    """A finished serve_bench run's document, or None (absent, or stopped before its end)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if "wall_seconds" in doc else None


def run_rate(rate: float, out: Path, rest: list[str]) -> dict[str, Any]:
    path = out / f"rate_{rate:g}" / "serve_bench.json"
    doc = complete(path)
    if doc is not None:
        log.info("rate %g: done before (%s), not run again", rate, path)
        return doc
    cmd = [
        sys.executable,
        "-m",
        "rodeco.experiments.bench.serve_bench",
        *rest,
        "--rate",
        f"{rate:g}",
        "--out",
        str(path.parent),
    ]
    log.info("rate %g: %s", rate, " ".join(cmd))
    subprocess.run(cmd, check=True)
    doc = complete(path)
    if doc is None:
        raise SystemExit(f"rate {rate:g}: serve_bench ended without a complete {path}")
    return doc


def collect(docs: dict[float, dict[str, Any]]) -> dict[str, Any]:
    """Per rate, each server's summary and judge means, and the ratios of ``RATIOS`` that the run has."""
    out: dict[str, Any] = {"rates": {}}
    for rate, doc in sorted(docs.items()):
        judged = doc.get("judged", {}).get("figures", {})
        servers = {}
        for name, s in doc["servers"].items():
            servers[name] = {
                **s["summary"],
                "judges": {j: (f.get(name) or {}).get("mean") for j, f in judged.items()},
                "decode_tokens_per_s": s["server_side"].get("decode_tokens_per_s"),
                "metrics_means": s["server_side"].get("metrics_means", {}),
            }
        out["rates"][f"{rate:g}"] = {
            "servers": servers,
            "ratios": {k: v for k, v in doc.get("ratios", {}).items() if k in RATIOS},
            "judged": {j: {k: v for k, v in f.items() if "_minus_" in k} for j, f in judged.items()},
            "args": doc["args"],
        }
    return out


def same_answers(docs: dict[float, dict[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """Per server and pair of consecutive rates, ``[same, both]``: of the requests answered at both rates (request
    ``i`` has the same prompt and seed at every rate), how many got the same winner text. A seeded request's answer
    should not depend on the traffic it met."""
    rates = sorted(docs)
    out: dict[str, dict[str, list[int]]] = {}
    for lo, hi in zip(rates, rates[1:]):
        for name in docs[lo]["servers"].keys() & docs[hi]["servers"].keys():
            a, b = ({r["i"]: r for r in docs[x]["servers"][name]["records"] if r["ok"]} for x in (lo, hi))
            both = sorted(a.keys() & b.keys())
            same = sum(a[i]["server"].get("text") == b[i]["server"].get("text") for i in both)
            out.setdefault(name, {})[f"{lo:g}-{hi:g}"] = [same, len(both)]
    return out


def lines(table: dict[str, Any]) -> list[str]:
    from rodeco.experiments.bench.serve_bench_figures import COLUMNS as cols
    from rodeco.experiments.bench.serve_bench_figures import with_ci as f

    out = ["| rate/s | server | done | " + " | ".join(c[0] for c in cols) + " | judges (mean) |"]
    out.append("|" + "---|" * (len(cols) + 4))
    for rate, r in table["rates"].items():
        for name, x in r["servers"].items():
            judges = ", ".join(f"{j} {v:.3f}" for j, v in x["judges"].items() if v is not None)
            cells = " | ".join(f(x, k, fmt) for _, k, fmt in cols)
            out.append(f"| {rate} | {name} | {x['completed']}/{x['sent']} | {cells} | {judges} |")
    target = next((x["latency_target_s"] for r in table["rates"].values() for x in r["servers"].values()), None)
    out.append(f"goodput: requests answered within {target} s of their arrival, per second")
    for rate, r in table["rates"].items():
        for k, v in r["ratios"].items():
            val = v.get("ratio", v.get("diff"))
            out.append(f"rate {rate}: {k} {val:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]")
        for j, d in r["judged"].items():
            for k, v in d.items():
                out.append(f"rate {rate}: judge_{j}_{k} {v['mean']:+.4f} [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]")
    for name, pairs in table.get("same_answers", {}).items():
        said = ", ".join(f"{same}/{both} at {rates}" for rates, (same, both) in pairs.items())
        out.append(f"{name}: the same winner at two rates (requests answered at both): {said}")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a, rest = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    docs = {rate: run_rate(rate, a.out, rest) for rate in a.rates}
    table = {**collect(docs), "same_answers": same_answers(docs)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "serve_load.json").write_text(json.dumps(table, indent=1, default=str) + "\n", encoding="utf-8")
    print("\n".join(lines(table)))
    print(f"\nwrote {a.out / 'serve_load.json'}")
    return table


if __name__ == "__main__":
    main()
