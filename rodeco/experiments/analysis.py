"""The analysis behind ``experiment=efficiency`` and ``experiment=perplexity``: from each prompt's measurements
(``efficiency.collect``), Best-of-N's curve, each method's improvement score, speedups and relative compute
(definitions in ``rodeco/experiments/efficiency.py``), the Markdown table, the plot and the headline figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments.metrics import compute_to_match, expected_best_of, improvement_score


def bon_curve(prompts: list[dict[str, Any]], n: int, pool_factor: int,
              anchors: tuple[list[float], list[float]]) -> dict[str, list[float]]:
    """Best-of-N for N = 1, 2, 4, ..., pool_factor * n (and n itself): mean expected reward, improvement score
    (``anchors``: from ``_anchors``), FLOPs, wall time and device time, summed over prompts."""
    M = pool_factor * n
    Ns = sorted({2**j for j in range(int(math.log2(M)) + 1)}
                | {n * 2**j for j in range(int(math.log2(pool_factor)) + 1)})
    curve: dict[str, list[float]] = {k: [] for k in ("N", "reward", "improvement", "flops", "seconds", "device_s")}
    for N in Ns:
        best = [expected_best_of(p["pool"]["scores"], N) for p in prompts]
        curve["N"].append(N)
        curve["reward"].append(float(np.mean(best)))
        curve["improvement"].append(improvement_score(best, *anchors))
        curve["flops"].append(sum(N / len(p["pool"]["scores"]) * _flops(p["pool"]) for p in prompts))
        curve["seconds"].append(sum(N / p["n"] * p["bon_n"]["seconds"] for p in prompts))
        curve["device_s"].append(sum(N / p["n"] * _device_s(p["bon_n"], p["bon_n"]) for p in prompts))
    return curve


def _flops(r: dict[str, Any]) -> float:
    return r["gen_flops"] + r["reward_flops"]


def _device_s(r: dict[str, Any], bon: dict[str, Any]) -> float:
    """Memory-bound device time: decode steps at Best-of-n's seconds per step on this prompt, plus reward time."""
    per_step = bon["decode_s"] / max(bon["steps"], 1)
    return r["steps"] * per_step + r["score_s"]


def _anchors(prompts: list[dict[str, Any]], n: int) -> tuple[list[float], list[float]]:
    """Each prompt's expected best and worst reward among ``n`` pool samples (Best-of-n's max and min)."""
    hi = [expected_best_of(p["pool"]["scores"], n) for p in prompts]
    lo = [-expected_best_of([-x for x in p["pool"]["scores"]], n) for p in prompts]
    return hi, lo


def summarize(prompts: list[dict[str, Any]], a: dict[str, Any]) -> dict[str, Any]:
    ns = {p["n"] for p in prompts}
    if len(ns) != 1:  # collect() uses one n for all prompts; a hand-edited JSON may not
        raise ValueError(f"the prompts have different Best-of-n sizes {sorted(ns)}: the curve needs one n")
    n = ns.pop()
    anchors = _anchors(prompts, n)
    curve = bon_curve(prompts, n, a["pool_factor"], anchors)
    table: dict[str, dict[str, Any]] = {}
    for label in prompts[0]["methods"]:
        for scale in map(str, a["scales"]):
            runs = [(p["methods"][label][scale], p["bon_n"]) for p in prompts]
            best = [r["best"] for r, _ in runs]
            score = improvement_score(best, *anchors)
            flops = sum(_flops(r) for r, _ in runs)
            seconds = sum(r["seconds"] for r, _ in runs)
            dev = sum(_device_s(r, b) for r, b in runs)
            row: dict[str, Any] = {"reward": float(np.mean(best)), "improvement": score, "flops": flops,
                                   "seconds": seconds, "device_s": dev, "beyond_curve": False}
            for key, curve_x, cost in (("speedup_flops", curve["flops"], flops),
                                       ("speedup_time", curve["seconds"], seconds),
                                       ("n_match", curve["N"], None)):
                x = compute_to_match(score, curve_x, curve["improvement"])
                if x is None:  # better than Best-of-(pool_factor * n): a lower bound
                    x, row["beyond_curve"] = curve_x[-1], True
                row[key] = x / cost if cost else x
            # the reference is Best-of-(scale * n), which fills the same memory: as many decode steps as
            # Best-of-n at the same cost per step (memory-bound), and scale times its reward-model time
            s = int(scale)
            ref = sum(p["bon_n"]["decode_s"] + s * p["bon_n"]["score_s"] for p in prompts)
            row["relative_compute"] = row["n_match"] / (s * n) * ref / dev
            table[f"{label}@{scale}"] = row
    return {"n": n, "curve": curve, "methods": table}


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The last printed lines: fixed alpha 0.5 and the best method, at the budget of Best-of-n (scale 1)."""
    at1 = {k[:-2]: v for k, v in summary["methods"].items() if k.endswith("@1")}
    best = max(at1, key=lambda k: at1[k]["speedup_flops"])
    out: dict[str, Any] = {}
    if "fixed_alpha_0.5" in at1:
        out["speedup_fixed_alpha_0.5"] = at1["fixed_alpha_0.5"]["speedup_flops"]
    out["speedup_best_policy"] = at1[best]["speedup_flops"]
    out["best_policy"] = best
    if "fixed_alpha_0.5" in at1:
        out["relative_compute_fixed_alpha_0.5"] = at1["fixed_alpha_0.5"]["relative_compute"]
    return out


def plot(summary: dict[str, Any], path: Path, y: str = "improvement", ylabel: str = "improvement score "
         "(Best-of-n = 100)", title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    c = summary["curve"]
    ax.plot(c["flops"], c[y], "-o", color="black", label="Best-of-N (N = " + ", ".join(map(str, c["N"])) + ")")
    labels = sorted({k.split("@")[0] for k in summary["methods"]})
    for label in labels:
        rows = sorted(((int(k.split("@")[1]), v) for k, v in summary["methods"].items()
                       if k.split("@")[0] == label))
        ax.plot([v["flops"] for _, v in rows], [v[y] for _, v in rows], "-s", label=f"SR {label}")
    ax.set_xscale("log")
    ax.set_xlabel("generator + reward FLOPs (all prompts)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: dict[str, Any]) -> str:
    """The curve and every method as one table (FLOPs and times summed over prompts)."""
    c, n = summary["curve"], summary["n"]
    out = ["| method | mean reward | improvement | TFLOPs | wall s | device s | speedup FLOPs | speedup time | "
           "relative compute |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, N in enumerate(c["N"]):
        out.append(f"| Best-of-{N} | {c['reward'][i]:.4f} | {c['improvement'][i]:.1f} | {c['flops'][i] / 1e12:.3f} | "
                   f"{c['seconds'][i]:.1f} | {c['device_s'][i]:.1f} | | | {N / n:.2f} |")
    for key, m in summary["methods"].items():
        label, scale = key.split("@")
        lb = "≥" if m["beyond_curve"] else ""
        out.append(f"| SR {label} (budget x{scale}) | {m['reward']:.4f} | {m['improvement']:.1f} | "
                   f"{m['flops'] / 1e12:.3f} | {m['seconds']:.1f} | {m['device_s']:.1f} | "
                   f"{lb}{m['speedup_flops']:.2f} | "
                   f"{lb}{m['speedup_time']:.2f} | {lb}{m['relative_compute']:.2f} |")
    return "\n".join(out) + "\n"


def fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)
