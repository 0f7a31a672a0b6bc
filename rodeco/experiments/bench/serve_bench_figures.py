"""``scripts/serve_bench.py``'s figures: requests/s, latency percentiles and mean reward with bootstrap CIs over
requests, paired ratios between servers, the server-side figures of a phase, and the printed table."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments.bench.serve_clients import RODECO_KEYS


@dataclass
class Record:
    i: int
    prompt_index: int
    seed: int
    arrival: float  # scheduled, seconds from the phase's start
    sent: float = math.nan  # when a thread sent it
    end: float = math.nan  # when its answer (and, for vLLM, its scoring) was in
    latency: float = math.nan  # end - arrival
    reward: float = math.nan
    ok: bool = False
    error: str | None = None
    server: dict[str, Any] = field(default_factory=dict)


def figures(recs: list[Record], idx: np.ndarray, target_s: float = math.inf) -> dict[str, Any]:
    """requests/s, goodput (requests/s answered within ``target_s`` of their arrival), p50/p95/p99 latency, mean
    queue wait (the server's own ``queue_seconds`` where it reports one) and mean reward over the requests, and the
    same on each resample of the requests (the rows of ``idx``, the same for every server: paired over prompts).

    requests/s is completed requests over first arrival (the phase's start) to last completion; a resample's is its
    completed requests over the phase's start to its own last completion. A resample that misses the last request
    to complete ends earlier, so these resamples lean high (the point sits near the CI's lower end with few
    requests); a ratio of two servers' on the same resamples (``ratio``) cancels part of that. (Re-attaching drawn
    latencies to the fixed arrival schedule breaks the link between when a request came and how long it waited,
    and drawing the gaps between completions explodes when a batch's requests finish together: both were worse.)"""
    ok = np.array([r.ok for r in recs])
    arr = np.array([r.arrival for r in recs])
    lat = np.where(ok, [r.latency for r in recs], np.nan)
    rew = np.where(ok, [r.reward for r in recs], np.nan)
    good = ok & (np.nan_to_num(lat, nan=math.inf) <= target_s)
    queue = np.array([_num(r.server.get("queue_seconds")) if r.ok else np.nan for r in recs], dtype=np.float64)

    def stats(ix: np.ndarray) -> dict[str, np.ndarray]:
        o = ok[ix]
        with np.errstate(all="ignore"), _quiet():
            span = np.nanmax(arr[ix] + lat[ix], axis=-1) - arr.min()
            return {
                "requests_per_s": np.where(o.any(-1), o.sum(-1) / span, np.nan),
                "goodput_per_s": np.where(o.any(-1), good[ix].sum(-1) / span, np.nan),
                "p50_latency_s": np.nanquantile(lat[ix], 0.5, axis=-1),
                "p95_latency_s": np.nanquantile(lat[ix], 0.95, axis=-1),
                "p99_latency_s": np.nanquantile(lat[ix], 0.99, axis=-1),
                "mean_queue_s": np.nanmean(queue[ix], axis=-1),
                "mean_reward": np.nanmean(rew[ix], axis=-1),
            }

    point = stats(np.arange(len(recs)))
    boot = stats(idx)
    from rodeco.experiments.bootstrap import ci

    out: dict[str, Any] = {
        "sent": len(recs),
        "completed": int(ok.sum()),
        "errors": int((~ok).sum()),
        "latency_target_s": target_s,
        # requests that waited for a client thread (more in flight than --max-in-flight): 0 in an open loop
        "client_capped": int(sum(r.sent - r.arrival > 0.5 for r in recs if math.isfinite(r.sent))),
    }
    for k in point:
        out[k] = float(point[k])
        out[k + "_ci"] = ci(boot[k])
    out["_boot"] = boot
    return out


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def ratio(num: dict[str, Any], den: dict[str, Any], key: str) -> dict[str, Any]:
    """``num[key] / den[key]`` with its 95% CI from the ratios on the same resamples (paired over requests)."""
    from rodeco.experiments.bootstrap import ci

    with np.errstate(all="ignore"):  # a zero denominator (no request within the target): inf or nan, not an error
        return {"ratio": float(np.float64(num[key]) / den[key]), "ci": ci(num["_boot"][key] / den["_boot"][key])}


def diff(a_: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, Any]:
    from rodeco.experiments.bootstrap import ci

    return {"diff": a_[key] - b[key], "ci": ci(a_["_boot"][key] - b["_boot"][key])}


def server_side(name: str, recs: list[Record], delta: dict[str, float], span: float) -> dict[str, Any]:
    """What the server says of the phase: rodeco's per-request block (means) or vLLM's client-measured split
    (generation, waiting for the scorer, scoring), and /metrics' histogram means and counters over the phase."""
    ok = [r for r in recs if r.ok]
    out: dict[str, Any] = {"span_s": span}
    if ok and name != "vllm":
        for k in RODECO_KEYS + ("completion_tokens", "prompt_tokens"):
            vals = [v for r in ok if isinstance(v := r.server.get(k), (int, float))]
            out[f"mean_{k}"] = float(np.mean(vals)) if vals else None
        # the batch's wall time per token of the winner: about a decode step's time (prefill and reward calls in it)
        out["mean_decode_seconds_per_winner_token"] = float(
            np.mean([r.server["decode_seconds"] / max(1, r.server["winner_tokens"]) for r in ok])
        )
        # where the server's time went: each phase's seconds over the answered requests (each request's own share,
        # so they add up to the server's), and as a share of the phase's span (decode, prefill and prune on the decode
        # thread; score and partial_score on the reward thread, or on the decode thread with serve.reward_thread=false;
        # held: requests' rows set aside waiting for scores, summed over requests)
        phases = sorted({k for r in ok for k in r.server.get("time_s") or {}})
        total = {k: float(sum((r.server.get("time_s") or {}).get(k, 0.0) for r in ok)) for k in phases}
        out["time_s_total"] = total
        out["time_share_of_span"] = {k: v / span for k, v in total.items()} if span > 0 else {}
        flops = sum(r.server.get("flops") or 0 for r in ok)
        bon = sum(r.server.get("bon_flops_modelled") or 0 for r in ok)
        out["flops_over_bon_modelled"] = flops / bon if bon else None
    elif ok:
        for k in (
            "generate_seconds",
            "score_wait_seconds",
            "score_seconds",
            "score_batch_requests",
            "completion_tokens",
            "prompt_tokens",
        ):
            out[f"mean_{k}"] = float(np.mean([r.server[k] for r in ok]))
    tokens = delta.get("rodeco_decode_tokens_total", delta.get("vllm:generation_tokens_total"))
    if tokens is not None and span > 0:
        out["decode_tokens_per_s"] = tokens / span
    means = {}
    for k, v in delta.items():
        if k.endswith("_sum") and delta.get(k[:-4] + "_count"):
            means[k[:-4]] = v / delta[k[:-4] + "_count"]
    out["metrics_means"] = means
    out["metrics_counters"] = {k: v for k, v in delta.items() if k.endswith("_total")}
    return out


COLUMNS = (  # a phase's figures as tables show them: (heading, summary key, format)
    ("requests/s", "requests_per_s", ".3f"),
    ("goodput/s", "goodput_per_s", ".3f"),
    ("p50 latency s", "p50_latency_s", ".1f"),
    ("p95 latency s", "p95_latency_s", ".1f"),
    ("p99 latency s", "p99_latency_s", ".1f"),
    ("mean queue s", "mean_queue_s", ".1f"),
    ("mean reward", "mean_reward", ".3f"),
)


def with_ci(x: dict[str, Any], k: str, fmt: str) -> str:
    """Summary figure ``k`` and its 95% CI as ``value [lo, hi]``."""
    lo, hi = x.get(k + "_ci", (math.nan, math.nan))
    return f"{x[k]:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def print_table(summary: dict[str, dict[str, Any]], ratios: dict[str, Any]) -> None:
    f, cols = with_ci, COLUMNS
    print(f"\n{'server':>6} {'done':>7} " + " ".join(f"{c[0] + ' [95% CI]':>26}" for c in cols))
    for name, x in summary.items():
        print(f"{name:>6} {x['completed']:>3}/{x['sent']:<3} " + " ".join(f"{f(x, k, fmt):>26}" for _, k, fmt in cols))
    if summary:
        x = next(iter(summary.values()))
        print(f"goodput: requests answered within {x['latency_target_s']:g} s of their arrival, per second")
    for k, r in ratios.items():
        v = r.get("ratio", r.get("diff"))
        print(f"{k}: {v:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]")


def print_server_side(name: str, s: dict[str, Any]) -> None:
    """The phase's server-side figures; of /metrics, the servers' own (rodeco_*, vllm:*), not the process's."""
    skip = {"metrics_means", "metrics_counters"}
    plain = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items() if k not in skip)
    print(f"{name} server-side: {plain}")
    for what in ("means", "counters"):
        own = {k: v for k, v in s[f"metrics_{what}"].items() if k.startswith(("rodeco_", "vllm:"))}
        if own:
            print(f"  /metrics {what} over the phase: " + ", ".join(f"{k} {v:.4g}" for k, v in own.items()))


def write(out: Path, obj: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".serve_bench.json.tmp"
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(out / "serve_bench.json")
