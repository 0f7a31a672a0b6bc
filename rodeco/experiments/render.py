"""How the analysis of ``experiment=efficiency`` and ``experiment=perplexity`` (``analysis.py``) is shown: the report
half's Markdown table, the cells ``scripts/results_tables.py`` renders the same way, the plot, and the headline lines
the experiments print last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rodeco.experiments import bootstrap
from rodeco.experiments.analysis import REF, is_oracle

MARK = {"lower": "≥", "upper": "≤", bootstrap.UNKNOWN: "?", None: ""}


def markdown(summary: dict[str, Any]) -> str:
    """The report half: Best-of-N's curve, then every method (CIs: bootstrap 95% over the report prompts; the
    ratio to the reference on the same resamples; all prompts for the rows nothing chose)."""
    c, n = summary["curve"]["report"], summary["n"]
    ref = summary.get("reference", REF)
    P = len(summary["halves"]["report"])
    out = [
        f"Report half: {P} prompts (selection half: {len(summary['halves']['selection'])}). Best-of-{n} = 100. "
        "≥: above Best-of-M's curve (the true figure is at least this); ≤: below Best-of-1's (at most this); "
        "?: a ratio of two figures clamped at the same end.",
        "",
        "| method | mean reward | improvement [95% CI] | TFLOPs | time (model) s | speedup FLOPs [95% CI] | "
        "speedup time (model) [95% CI] | relative compute (memory-bound model) [95% CI] | "
        f"speedup FLOPs, selection half | speedup FLOPs / {ref}'s, paired [95% CI] | "
        f"speedup FLOPs, all {P + len(summary['halves']['selection'])} prompts [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, N in enumerate(c["N"]):
        reward, improvement, tflops, relative = curve_cells(c, i, n)
        out.append(f"| Best-of-{int(N)} | {reward} | {improvement} | {tflops} | | | | {relative} | | | |")
    for key, row in summary["methods"].items():
        label, scale = key.split("@")
        if "infeasible" in row:
            out.append(
                f"| SR {label} (budget x{scale}) | infeasible: the start does not fit the budget | | | | | | | | | |"
            )
            continue
        out.append(f"| SR {label} (budget x{scale}) | " + " | ".join(cells(row, ref)) + " |")
    return "\n".join(out) + "\n"


def curve_cells(c: dict[str, list[float]], i: int, n: int) -> list[str]:
    """Best-of-N's ``i``-th point of the curve ``c``: mean reward, improvement score, TFLOPs, and its relative
    compute (N / n)."""
    return [
        f"{c['reward'][i]:.4f}",
        f"{c['improvement'][i]:.1f}",
        f"{c['flops'][i] / 1e12:.3f}",
        f"{c['N'][i] / n:.2f}",
    ]


def figure(x: float, bound: str | None) -> str:
    """A speedup-like figure, marked with its bound (``MARK``)."""
    return f"{MARK[bound]}{x:.2f}"


def with_ci(x: float, lo_hi: list[float], bound: str | None) -> str:
    """``figure`` with its 95% CI."""
    return f"{figure(x, bound)} [{lo_hi[0]:.2f}, {lo_hi[1]:.2f}]"


def improvement(r: dict[str, Any]) -> str:
    """A half's improvement score (Best-of-n = 100) with its 95% CI."""
    lo, hi = r["improvement_ci"]
    return f"{r['improvement']:.1f} [{lo:.1f}, {hi:.1f}]"


def cells(row: dict[str, Any], ref: str) -> list[str]:
    """A method's cells in ``markdown``'s table, after its name."""
    r, s, every = row["report"], row["selection"], row.get("all")
    pair = r.get(f"vs_{ref}")
    return [
        f"{r['reward']:.4f}",
        improvement(r),
        f"{r['flops'] / 1e12:.3f}",
        f"{r['seconds_model']:.1f}",
        with_ci(r["speedup_flops"], r["speedup_flops_ci"], r["bound"]),
        with_ci(r["speedup_time_model"], r["speedup_time_model_ci"], r["bound"]),
        with_ci(r["relative_compute_memory_bound_model"], r["relative_compute_memory_bound_model_ci"], r["bound"]),
        figure(s["speedup_flops"], s["bound"]),
        with_ci(pair["ratio"], pair["ci"], pair["bound"]) if pair else "",
        with_ci(every["speedup_flops"], every["speedup_flops_ci"], every["bound"]) if every else "",
    ]


def plot(
    summary: dict[str, Any],
    path: Path,
    y: str = "improvement",
    ylabel: str = "improvement score (Best-of-n = 100)",
    title: str = "",
    labels: list[str] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    c = summary["curve"]["report"]
    ax.plot(
        c["flops"], c[y], "-o", color="black", label="Best-of-N (N = " + ", ".join(str(int(N)) for N in c["N"]) + ")"
    )
    keys = [k for k, v in summary["methods"].items() if "infeasible" not in v and k.endswith("@1")]
    # the alpha sweep deciding by each partial reward (same, the oracle ceiling, learned heads)
    sweeps: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split("@")[0].split("_")
        if k.startswith("fixed_alpha_") and "start" not in parts:
            sweeps.setdefault("_".join(parts[3:]) or "same", []).append(k)
    for part, ks in sweeps.items():
        ks.sort(key=lambda k: float(k.split("_")[2].split("@")[0]))
        ax.plot(
            [summary["methods"][k]["report"]["flops"] for k in ks],
            [summary["methods"][k]["report"][y] for k in ks],
            "-s" if part == "same" else "--.",
            label=f"SR fixed, alpha sweep (x1), partial_reward={part}",
        )
    swept = {k for ks in sweeps.values() for k in ks}
    for k in keys:
        other = any(k[:-2].endswith(f"_{part}") for part in sweeps if part != "same")  # another partial reward
        if k in swept or other or is_oracle(k[:-2]) or (labels is not None and k.split("@")[0] not in labels):
            continue
        r = summary["methods"][k]["report"]
        ax.plot([r["flops"]], [r[y]], "^", label=f"SR {k.split('@')[0]} (x1)")
    ax.set_xscale("log")
    ax.set_xlabel("generator + reward FLOPs (report half, summed over prompts)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def headline_lines(head: dict[str, Any]) -> list[str]:
    """The headline as the experiments print it last, one ``key: value`` line a figure (a missing figure: nan; a
    bound of None: the figure is exact)."""
    return [f"{k}: {'nan' if v is None and not k.endswith('_bound') else fmt(v)}" for k, v in head.items()]
