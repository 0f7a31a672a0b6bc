"""The analysis behind ``experiment=efficiency`` and ``experiment=perplexity``: from each prompt's measurements
(``efficiency.collect``) and the pool's measured step times, Best-of-N's curve, each method's improvement score,
speedups and relative compute, chosen on the selection half of the prompts and reported on the report half with
bootstrap confidence intervals over prompts (every method also paired with fixed alpha 0.5 on the same resamples,
``bootstrap.py``), speedups clamped at an end of the curve flagged as bounds, the rows nothing chooses also over all
prompts; the headline figures. How they are shown (the Markdown table, the plot, the printed lines): ``render.py``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from rodeco.experiments import bootstrap
from rodeco.experiments.metrics import compute_to_match, curve_end, expected_best_of, improvement_score
from rodeco.replays.pool import Pool


def split_halves(indices: list[int]) -> tuple[list[int], list[int]]:
    """(selection, report): the prompts ordered by a hash of their index, the first half selects. Deterministic,
    and unrelated to the prompts' order or content."""
    order = sorted(indices, key=lambda i: hashlib.sha256(str(i).encode()).hexdigest())
    half = len(order) // 2
    return sorted(order[:half]), sorted(order[half:])


@dataclass(frozen=True)
class TimeModel:
    """Seconds of one decode step on the machine that recorded the pool, fitted to its measured steps:
    ``a + b * rows + c * rows * context`` (context: cached tokens per row)."""

    a: float
    b: float
    c: float
    r2: float
    steps: int

    @classmethod
    def fit(cls, pool: Pool, indices: list[int]) -> TimeModel:
        """Fitted to the pool's step costs (step times at 1 to M rows, measured after recording), else to the
        steps measured while recording ``indices``."""
        costs = pool.step_costs
        steps = [costs] if costs is not None else [pool.prompt(i).steps for i in indices]
        rows, ctx, sec = [], [], []
        for st in steps:
            rows += st["rows"]
            ctx += st["context"]
            sec += st["seconds"]
        r, c, y = (np.asarray(v, dtype=np.float64) for v in (rows, ctx, sec))
        from scipy.optimize import nnls

        X = np.stack([np.ones_like(r), r, r * c], axis=1)
        coef, _ = nnls(X, y)  # no step gets cheaper with more rows or context
        resid = y - X @ coef
        r2 = 1.0 - float(resid @ resid) / max(float(((y - y.mean()) ** 2).sum()), 1e-30)
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), r2=r2, steps=len(y))

    def step(self, rows: float, context: float) -> float:
        return self.a + self.b * rows + self.c * rows * context

    def seconds(self, run: dict[str, float], prefill_s: float) -> float:
        """A run's wall time: measured prefill, modelled decode steps, reward seconds as measured when computed."""
        return (
            prefill_s
            + self.a * run["steps"]
            + self.b * run["decode_tokens"]
            + self.c * run["rows_x_context"]
            + run["reward_s"]
        )


class Measurements:
    """Per-prompt arrays of one set of prompt records, so that statistics over any multiset of prompts (a half, a
    bootstrap resample) are sums and means of rows."""

    def __init__(self, prompts: list[dict[str, Any]], n: int, tm: TimeModel, max_new: int) -> None:
        self.prompts, self.n, self.tm = prompts, n, tm
        self.index = [p["prompt_index"] for p in prompts]
        final = [np.asarray(p["final"], dtype=np.float64) for p in prompts]
        M = len(final[0])
        self.Ns = [int(k) for k in prompts[0]["bon"]]
        self.hi = np.array([expected_best_of(f, n) for f in final])
        self.lo = np.array([-expected_best_of(-f, n) for f in final])
        self.bon_best = np.array([[expected_best_of(f, N) for N in self.Ns] for f in final])  # [P, N]
        pre = np.array([p["prefill_s"] for p in prompts])
        self.bon_flops = np.array([[p["bon"][str(N)]["flops"] for N in self.Ns] for p in prompts])
        self.bon_secs = np.array([[tm.seconds(p["bon"][str(N)], p["prefill_s"]) for N in self.Ns] for p in prompts])
        self.mid = np.array([p["L0"] + max_new / 2 for p in prompts])  # mean context, for the memory-bound model
        self.pre, self.M = pre, M

    def bon_time(self, scale: int) -> np.ndarray:
        """[P, N] Best-of-N's time when memory holds Best-of-n' (n' = scale * n): batches of n' one after another."""
        k = self.Ns.index(scale * self.n)
        ratio = np.maximum(1.0, np.asarray(self.Ns, dtype=np.float64) / (scale * self.n))
        small = np.asarray(self.Ns) <= scale * self.n
        return np.where(small[None, :], self.bon_secs, ratio[None, :] * self.bon_secs[:, [k]])

    @property
    def replicates(self) -> int:
        """Sets of pool candidates every method was replayed from (``efficiency.Measurer.measure``)."""
        return 1 + len(self.prompts[0].get("replicates", []))

    def method(self, label: str, scale: int) -> dict[str, np.ndarray] | None:
        """A method's per-prompt figures, ``[replicates, P]`` (Best-of-n's memory-bound time ``mb_bon``: ``[P]``);
        None where a replicate of a prompt was infeasible."""
        reps = [[p["methods"], *(r["methods"] for r in p.get("replicates", []))] for p in self.prompts]
        runs = [[ms[label][str(scale)] for ms in rs] for rs in reps]  # [P][R]
        if any("infeasible" in r for rs in runs for r in rs):
            return None
        n1 = scale * self.n
        s_ref = np.array([self.tm.step(n1, m) for m in self.mid])  # per step at the batch that fills the memory
        bon = [p["bon"][str(n1)] for p in self.prompts]

        def arr(f) -> np.ndarray:
            return np.array([[f(r, p) for r, p in zip(rs, self.prompts)] for rs in zip(*runs)])  # [R, P]

        return {
            "best": arr(lambda r, p: r["best"]),
            "flops": arr(lambda r, p: r["flops"]),
            "secs": arr(lambda r, p: self.tm.seconds(r, p["prefill_s"])),
            "mb": arr(lambda r, p: r["steps"]) * s_ref + arr(lambda r, p: r["reward_s"]),
            "mb_bon": np.array([b["steps"] for b in bon]) * s_ref + np.array([b["reward_s"] for b in bon]),
        }


def pick(run: dict[str, np.ndarray], S: np.ndarray, rep: np.ndarray | None) -> dict[str, np.ndarray]:
    """A method's figures on the prompts ``S``: of replicate ``rep[i]`` for prompt ``S[i]``, or (``rep`` None) the
    mean over the replicates (the expected figure over candidate draws)."""
    out = {}
    for k, v in run.items():
        if v.ndim == 1:
            out[k] = v[S]
        else:
            out[k] = v.mean(0)[S] if rep is None else v[rep, S]
    return out


def curve_of(m: Measurements, S: np.ndarray) -> dict[str, list[float]]:
    imp = [improvement_score(m.bon_best[S, j], m.hi[S], m.lo[S]) for j in range(len(m.Ns))]
    return {
        "N": list(map(float, m.Ns)),
        "improvement": imp,
        "flops": m.bon_flops[S].sum(0).tolist(),
        "reward": m.bon_best[S].mean(0).tolist(),
    }


def stats(
    m: Measurements,
    S: np.ndarray,
    run: dict[str, np.ndarray],
    scale: int,
    curve: dict[str, list[float]],
    rep: np.ndarray | None = None,
) -> dict[str, Any]:
    """A method's figures over the prompts ``S`` (indices into ``m``, repeats allowed; ``rep``: the replicate of
    each, None for the mean over replicates). ``bound``: ``"lower"`` above Best-of-M's curve (the speedups are
    charged Best-of-M's cost: the true ones are at least these; ``beyond_curve`` says the same), ``"upper"`` below
    Best-of-1's score (charged Best-of-1's cost: at most these), else None."""
    sel = pick(run, S, rep)
    imp = improvement_score(sel["best"], m.hi[S], m.lo[S])
    flops, secs = float(sel["flops"].sum()), float(sel["secs"].sum())
    out: dict[str, Any] = {
        "improvement": imp,
        "flops": flops,
        "seconds_model": secs,
        "beyond_curve": False,
        "reward": float(sel["best"].mean()),
    }
    bon_t = m.bon_time(scale)[S].sum(0).tolist()
    ends = set()
    for key, xs, cost in (
        ("speedup_flops", curve["flops"], flops),
        ("speedup_time_model", bon_t, secs),
        ("n_match", curve["N"], None),
    ):
        ends.add(curve_end(imp, xs, curve["improvement"]))
        x = compute_to_match(imp, xs, curve["improvement"])
        if x is None:  # better than Best-of-M: a lower bound
            x, out["beyond_curve"] = xs[-1], True
        out[key] = x / cost if cost else x
    out["bound"] = "lower" if "lower" in ends else "upper" if "upper" in ends else None
    n1 = scale * m.n
    out["relative_compute_memory_bound_model"] = (
        out["n_match"] / n1 * float(sel["mb_bon"].sum()) / float(sel["mb"].sum())
    )
    return out


@dataclass(frozen=True)
class Half:
    """Prompts (indices into ``Measurements``, in ``S``), Best-of-N's curve on them, and bootstrap resamples of
    them with their curves. Where methods were replayed from several sets of candidates, each resample also draws
    one replicate per prompt drawn (``reps``; the same for every method, so paired figures stay paired): the CIs
    then carry the candidates' sampling variance as well as the prompts'."""

    S: np.ndarray
    curve: dict[str, list[float]]
    boots: list[np.ndarray]
    boot_curves: list[dict[str, list[float]]]
    reps: list[np.ndarray | None]

    @classmethod
    def of(cls, m: Measurements, S: np.ndarray, rng: np.random.Generator, resamples: int) -> Half:
        boots, reps = [], []
        for _ in range(resamples):
            boots.append(S[bootstrap.draws(len(S), 1, rng)[0]])
            reps.append(bootstrap.draws(m.replicates, 1, rng, size=len(S))[0] if m.replicates > 1 else None)
        return cls(S, curve_of(m, S), boots, [curve_of(m, b) for b in boots], reps)

    def stats(
        self, m: Measurements, run: dict[str, np.ndarray], scale: int, keys: tuple[str, ...]
    ) -> tuple[dict[str, Any], np.ndarray]:
        """``stats`` on ``S`` (the mean over replicates) with a 95% CI (``{key}_ci``) of each of ``keys`` over the
        resamples, and the per-resample speedups in FLOPs."""
        out = stats(m, self.S, run, scale, self.curve)
        b = [stats(m, S, run, scale, c, r) for S, c, r in zip(self.boots, self.boot_curves, self.reps)]
        for key in keys:
            out[f"{key}_ci"] = bootstrap.ci([x[key] for x in b])
        return out, np.array([x["speedup_flops"] for x in b])


REF = "fixed_alpha_0.5"  # the reference every method is paired with, and the gap to its oracle ceiling
REPORT_CI = ("improvement", "speedup_flops", "speedup_time_model", "relative_compute_memory_bound_model")


def summarize(
    prompts: list[dict[str, Any]],
    a: dict[str, Any],
    tm: TimeModel,
    max_new: int,
    labels: list[str],
    seed: int = 0,
    ref: str = REF,
) -> dict[str, Any]:
    """Both halves' figures of every method at every scale, bootstrap CIs on the report half (paired with ``ref``
    on the same resamples), the best method chosen on the selection half. ``ref`` and the oracle rows, which
    nothing chooses, also get their figures over all prompts (``all``, with CIs from resamples of all prompts)."""
    m = Measurements(prompts, a["n"], tm, max_new)
    sel_idx, rep_idx = split_halves(m.index)
    pos = {i: k for k, i in enumerate(m.index)}
    rng = np.random.default_rng(seed)
    halves = {
        "selection": Half.of(m, np.array([pos[i] for i in sel_idx]), rng, 0),
        "report": Half.of(m, np.array([pos[i] for i in rep_idx]), rng, a["bootstrap"]),
    }
    every = Half.of(m, np.arange(len(m.index)), rng, a["bootstrap"])  # drawn after the report's: those unchanged
    table: dict[str, dict[str, Any]] = {}
    boot: dict[str, np.ndarray] = {}  # per-resample speedups in FLOPs on the report half
    for label in labels:
        for scale in a["scales"]:
            run, key = m.method(label, scale), f"{label}@{scale}"
            if run is None:
                table[key] = {"infeasible": True}
                continue
            table[key] = {"selection": halves["selection"].stats(m, run, scale, ())[0]}
            table[key]["report"], boot[key] = halves["report"].stats(m, run, scale, REPORT_CI)
            if label == ref or is_oracle(label):  # chosen by nothing: all prompts are fair to report on
                table[key]["all"] = every.stats(m, run, scale, ("speedup_flops",))[0]
    pair_with(table, boot, ref)
    at1 = {
        k[:-2]: v for k, v in table.items() if k.endswith("@1") and "infeasible" not in v and not is_oracle(k[:-2])
    }  # the oracle is a ceiling, not a method one can run
    best = max(at1, key=lambda k: at1[k]["selection"]["speedup_flops"])
    cal = [k for k in at1 if k.startswith("calibrated_")]
    gap = [g for x in (best, ref, f"{ref}_oracle") if (g := boot.get(f"{x}@1")) is not None]
    gap_boot = bootstrap.gap_closed_ci(*gap) if len(gap) == 3 else None  # per resample: the gap closed's CI
    return {
        "n": a["n"],
        "M": m.M,
        "halves": {"selection": sel_idx, "report": rep_idx},
        "curve": {**{h: v.curve for h, v in halves.items()}, "all": every.curve},
        "methods": table,
        "best_policy": best,
        "time_model": tm.__dict__,
        "bootstrap": a["bootstrap"],
        "best_calibrated": max(cal, key=lambda k: at1[k]["selection"]["speedup_flops"]) if cal else None,
        "reference": ref,
        "gap_closed_bootstrap": gap_boot,
        "replicates": m.replicates,
    }


def pair_with(table: dict[str, dict[str, Any]], boot: dict[str, np.ndarray], ref: str) -> None:
    """Adds ``vs_{ref}`` to every report row: its speedup in FLOPs over ``ref``'s at the same scale, with a CI from
    the ratios on the same resamples (``bootstrap.paired_ratio``)."""
    for key, row in table.items():
        base = f"{ref}@{key.split('@')[1]}"
        if base not in boot or key not in boot:
            continue
        r, b = row["report"], table[base]["report"]
        pair = bootstrap.paired_ratio(
            r["speedup_flops"], b["speedup_flops"], boot[key], boot[base], r["bound"], b["bound"]
        )
        r[f"vs_{ref}"] = {**pair, "bound": None} if key == base else pair  # a figure over itself: exactly 1


def is_oracle(label: str) -> bool:
    return label.endswith("_oracle")


def oracle_row(label: str, methods: dict[str, Any]) -> str | None:
    """The oracle row of a method (its policy and schedule deciding by perfect partial scores), whatever partial
    reward the method decides by: ``fixed_alpha_0.3_text_value`` -> ``fixed_alpha_0.3_oracle``; None without one."""
    bases = [k[: -len("_oracle@1")] for k in methods if k.endswith("_oracle@1")]
    fits = [b for b in bases if label == b or label.startswith(b + "_")]
    return f"{max(fits, key=len)}_oracle" if fits else None


def headline(summary: dict[str, Any], ref: str | None = None) -> dict[str, Any]:
    """The last printed lines, on the report half at the budget of Best-of-n; the best policy chosen on the
    selection half. ``ref`` defaults to the summary's reference (fixed alpha 0.5). Every printed speedup ``X`` has
    ``X_bound``: ``"lower"`` (the method scored above Best-of-M's curve: the true speedup is at least X),
    ``"upper"`` (below Best-of-1's: at most X) or None (on the curve); the relative compute figures share their
    method's bound. ``speedup_best_policy_vs_{ref}`` is the best policy's speedup over ref's, CI paired on the same
    resamples; ``speedup_{ref}_all`` ref's speedup over all prompts (nothing chose it); ``gap_closed_ci_*`` the
    gap closed on each resample, over those where it is defined."""
    ref = ref or summary.get("reference", REF)
    t, best = summary["methods"], summary["best_policy"]
    r, b = t[f"{ref}@1"]["report"], t[f"{best}@1"]["report"]
    out: dict[str, Any] = {
        f"speedup_{ref}": r["speedup_flops"],
        f"relative_compute_{ref}": r["relative_compute_memory_bound_model"],
        f"speedup_{ref}_ci_low": r["speedup_flops_ci"][0],
        f"speedup_{ref}_ci_high": r["speedup_flops_ci"][1],
        "relative_compute_best_policy": b["relative_compute_memory_bound_model"],
        "speedup_best_policy_ci_low": b["speedup_flops_ci"][0],
        "speedup_best_policy_ci_high": b["speedup_flops_ci"][1],
    }
    rows = {f"speedup_{ref}": r, "speedup_best_policy": b}  # every printed speedup's row, for its bound
    for label in (oracle_row(best, t), oracle_row(ref, t)):  # the ceilings: the same policy and schedule, perfect
        if label and "infeasible" not in t[f"{label}@1"]:  # scores
            out[f"speedup_{label}"] = t[f"{label}@1"]["report"]["speedup_flops"]
            rows[f"speedup_{label}"] = t[f"{label}@1"]["report"]
    cal = summary.get("best_calibrated")
    if cal:
        out["calibrated_choice"] = cal
        rows["speedup_calibrated"] = t[f"{cal}@1"]["report"]
    last = {"speedup_best_policy": b["speedup_flops"], "best_policy": best}  # printed last, in this order
    if cal:
        last["speedup_calibrated"] = t[f"{cal}@1"]["report"]["speedup_flops"]
    ceiling = out.pop(f"speedup_{ref}_oracle", None)
    if ceiling:
        last[f"speedup_{ref}_oracle"] = ceiling
        # the log-scale share of the way from fixed alpha 0.5 to its oracle ceiling that the best policy covers
        last["gap_closed"] = float(bootstrap.gap_closed(b["speedup_flops"], r["speedup_flops"], ceiling))
    return {**out, **checks(summary, ref, rows, "gap_closed" in last), **last}


def checks(summary: dict[str, Any], ref: str, rows: dict[str, dict[str, Any]], gap: bool) -> dict[str, Any]:
    """The headline's keys that say how far its figures can be trusted (see ``headline``)."""
    t, best = summary["methods"], summary["best_policy"]
    out: dict[str, Any] = {f"{k}_bound": row["bound"] for k, row in rows.items()}
    pair = t[f"{best}@1"]["report"].get(f"vs_{ref}")
    if pair:
        out.update(
            {
                f"speedup_best_policy_vs_{ref}": pair["ratio"],
                f"speedup_best_policy_vs_{ref}_ci_low": pair["ci"][0],
                f"speedup_best_policy_vs_{ref}_ci_high": pair["ci"][1],
                f"speedup_best_policy_vs_{ref}_bound": pair["bound"],
            }
        )
    every = t[f"{ref}@1"].get("all")
    if every:
        out.update(
            {
                f"speedup_{ref}_all": every["speedup_flops"],
                f"speedup_{ref}_all_ci_low": every["speedup_flops_ci"][0],
                f"speedup_{ref}_all_ci_high": every["speedup_flops_ci"][1],
                f"speedup_{ref}_all_bound": every["bound"],
            }
        )
    if gap:
        g = summary.get("gap_closed_bootstrap") if summary.get("reference", REF) == ref else None
        lo, hi = g["ci"] if g else (float("nan"), float("nan"))
        out.update({"gap_closed_ci_low": lo, "gap_closed_ci_high": hi})
    return out
