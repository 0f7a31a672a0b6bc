"""Methods measured on judges the search never saw, against Best-of-N's curve on the same judge.

The data are winners: per prompt ``p`` and candidate set ``s`` (the pool's candidates ``s*M/S ...``, which the live
methods also decode from, as their random streams), each method's winner has a guide reward (the reward that chose
it), one score per judge and the FLOPs its method spent. Best-of-N's winner at every N is the guide's best of the
set's first N candidates, so its judge score is the judge's view of what the guide picks: the judge's Best-of-N
curve.

``analyze`` reports, for one judge, on the prompts it is given, with bootstrap CIs over prompts and, within each
drawn prompt, over its candidate sets:

- the curve (mean judge score of Best-of-N's winners at each N) and its gain Best-of-N_max - Best-of-1;
- per method: its mean judge score, paired against each reference method (differences on the same prompts and sets);
- its FLOPs speedup at matched *judge* score on the judge's curve (log-FLOPs interpolated): ``None`` when the CI of
  the curve's gain contains 0 (the judge cannot see what the guide rewards), flagged as a bound past the curve's ends;
- the residual of its judge gain from what its guide gain predicts on the Best-of-N relation (judge gain against
  guide gain along the curve, interpolated linearly), with a CI; ``below`` when the CI lies under 0, and
  ``beyond_curve`` when its guide gain is past Best-of-N_max's (the prediction is then the curve's last point).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rodeco.experiments.bootstrap import Resamples, ci
from rodeco.experiments.speedup import matched_speedup, monotone


@dataclass
class Winners:
    """One method's winners: ``guide`` and each judge's ``judge[name]`` as ``[P, S]`` arrays (NaN: not scored),
    ``flops`` ``[P, S]`` (everything the method spent), and ``texts`` etc. kept beside them by the caller."""

    guide: np.ndarray
    judge: dict[str, np.ndarray]
    flops: np.ndarray


@dataclass
class Curve:
    """Best-of-N at ``sizes``: ``guide`` and ``judge[name]`` ``[P, S, K]``, ``flops`` ``[P, K]``."""

    sizes: list[int]
    guide: np.ndarray
    judge: dict[str, np.ndarray]
    flops: np.ndarray

    def method(self, n: int) -> Winners:
        """Best-of-``n`` as a method (a reference to pair with)."""
        k = self.sizes.index(n)
        S = self.guide.shape[1]
        return Winners(
            self.guide[:, :, k],
            {j: v[:, :, k] for j, v in self.judge.items()},
            np.repeat(self.flops[:, k : k + 1], S, axis=1),
        )


def best_of_prefix(guide: np.ndarray, sizes: list[int]) -> np.ndarray:
    """The index of the guide's best among the first N entries of ``guide`` for each N of ``sizes`` (ties: the
    first)."""
    if max(sizes) > len(guide):
        raise ValueError(f"Best-of-{max(sizes)} from a set of {len(guide)} candidates")
    return np.array([int(np.argmax(guide[:n])) for n in sizes])


@dataclass
class Stat:
    """A mean over prompts and sets and its bootstrap CI."""

    value: float
    ci: list[float]

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci": self.ci}


def predicted_judge_gain(g: float, curve_g: np.ndarray, curve_j: np.ndarray) -> tuple[float, bool]:
    """The judge gain Best-of-N's relation predicts at guide gain ``g`` (gains over Best-of-1; linear in the guide
    gain, on the guide's running maximum), and whether ``g`` is past the curve's last point."""
    gg = monotone(curve_g - curve_g[0])
    jg = curve_j - curve_j[0]
    return float(np.interp(g, gg, jg)), bool(g > gg[-1])


def analyze(
    curve: Curve, methods: dict[str, Winners], judge: str, refs: list[str], resamples: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """One judge's figures (see the module docstring). ``refs`` name the methods every method is paired with
    (``best_of_4`` etc. are Best-of-N's points, named ``best_of_<n>``)."""
    P, S, _ = curve.guide.shape
    rs = Resamples.draw(P, S, resamples, seed)
    cj, cg = rs.means(curve.judge[judge]), rs.means(curve.guide)  # [B+1, K]
    cf = np.stack([curve.flops[p].mean(0) for p in rs.prompts])  # [B+1, K]
    gain = cj[:, -1] - cj[:, 0]
    gain_ci = ci(gain[1:])
    visible = not (gain_ci[0] <= 0.0 <= gain_ci[1])
    all_methods = {**{f"best_of_{n}": curve.method(n) for n in curve.sizes}, **methods}
    out: dict[str, Any] = {
        "judge": judge,
        "prompts": P,
        "sets": S,
        "resamples": resamples,
        "curve": {
            "sizes": curve.sizes,
            "judge": cj[0].tolist(),
            "judge_ci": [ci(cj[1:, k]) for k in range(len(curve.sizes))],
            "guide": cg[0].tolist(),
            "flops": cf[0].tolist(),
        },
        "gain": {"value": float(gain[0]), "ci": gain_ci, "visible": visible},
        "methods": {},
    }
    for label, m in methods.items():
        J, G, F = rs.means(m.judge[judge]), rs.means(m.guide), rs.means(m.flops)
        row: dict[str, Any] = {
            "judge": Stat(float(J[0]), ci(J[1:])).as_dict(),
            "guide": Stat(float(G[0]), ci(G[1:])).as_dict(),
            "flops": float(F[0]),
        }
        for ref in refs:
            d = rs.means(m.judge[judge] - all_methods[ref].judge[judge])
            row[f"vs_{ref}"] = Stat(float(d[0]), ci(d[1:])).as_dict()
        sp = [matched_speedup(float(J[b]), float(F[b]), cj[b], cf[b]) for b in range(len(J))]
        row["speedup_flops_at_matched_judge"] = (
            {"value": sp[0][0], "ci": ci(np.array([s for s, _ in sp[1:]])), "bound": sp[0][1] or None}
            if visible
            else None
        )
        pred = [predicted_judge_gain(float(G[b] - cg[b, 0]), cg[b], cj[b]) for b in range(len(J))]
        res = np.array([J[b] - cj[b, 0] - pred[b][0] for b in range(len(J))])
        res_ci = ci(res[1:])
        row["residual"] = {
            "value": float(res[0]),
            "ci": res_ci,
            "below": bool(res_ci[1] < 0),
            "beyond_curve": pred[0][1],
        }
        out["methods"][label] = row
    return out


def paired_difference(x: np.ndarray, base: np.ndarray, resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The mean of ``x - base`` (both ``[P, S]``, the same prompts and sets) with ``analyze``'s bootstrap CI."""
    P, S = x.shape
    rs = Resamples.draw(P, S, resamples, seed)
    d = rs.means(np.asarray(x, dtype=np.float64) - np.asarray(base, dtype=np.float64))
    return Stat(float(d[0]), ci(d[1:])).as_dict()


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rank = lambda v: np.argsort(np.argsort(v)).astype(np.float64)  # noqa: E731 (scores are continuous: no ties)
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


def correlations(prompt: np.ndarray, judge: np.ndarray, length: np.ndarray, guide: np.ndarray) -> dict[str, Any]:
    """Over texts (one entry per distinct text): the judge's Pearson r with the log length in characters and its
    Spearman rho with the guide, pooled, and rho within a prompt averaged over prompts with at least 3 texts (what
    a decision compares)."""
    ok = np.isfinite(judge) & np.isfinite(guide)
    prompt, judge, length, guide = prompt[ok], judge[ok], length[ok], guide[ok]
    within = [_spearman(judge[prompt == i], guide[prompt == i]) for i in np.unique(prompt) if (prompt == i).sum() >= 3]
    return {
        "texts": int(ok.sum()),
        "pearson_log_chars": float(np.corrcoef(judge, np.log(length))[0, 1]),
        "spearman_guide": _spearman(judge, guide),
        "spearman_guide_within_prompt": float(np.mean(within)) if within else float("nan"),
        "prompts_within": len(within),
    }


def diagnostics_table(
    per_method: dict[str, dict[str, np.ndarray]], resamples: int = 1000, seed: int = 0
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{method: {field: [P, S] values (NaN: undefined)}}`` -> ``{method: {field: {value, ci}}}``: means over
    prompts and sets with the same bootstrap as ``analyze``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, fields in per_method.items():
        P, S = next(iter(fields.values())).shape
        rs = Resamples.draw(P, S, resamples, seed)
        out[label] = {}
        for name, x in fields.items():
            m = rs.means(np.asarray(x, dtype=np.float64))
            out[label][name] = Stat(float(m[0]), ci(m[1:])).as_dict()
    return out


def ci_text(x: dict[str, Any] | None, fmt: str = "+.4f") -> str:
    """``value [lo, hi]`` of a ``Stat`` dict; ``undefined`` for None."""
    if x is None:
        return "undefined"
    return f"{x['value']:{fmt}} [{x['ci'][0]:{fmt}}, {x['ci'][1]:{fmt}}]"


def _ref_name(ref: str) -> str:
    return ref.replace("best_of_", "Best-of-").replace("fixed_alpha_0.5", "fixed 0.5")


def analysis_lines(analyses: dict[str, dict[str, Any]], refs: list[str]) -> list[str]:
    """``analyze``'s figures as the ``guide_*`` / ``judge_<name>_*`` lines the experiments print: each scorer's
    Best-of-N curve and its gain, then per method its score, paired differences with ``refs``, the FLOPs speedup at
    matched score and the residual from the Best-of-N relation."""
    out = []
    for sc, an in analyses.items():
        tag = "guide" if sc == "guide" else f"judge_{sc}"
        cur = an["curve"]
        out.append(f"{tag}_bon_curve: " + "  ".join(f"N={n}: {j:.4f}" for n, j in zip(cur["sizes"], cur["judge"])))
        g = an["gain"]
        seen = "visible" if g["visible"] else "CI contains 0: this scorer cannot see what the guide rewards"
        out.append(f"{tag}_bon_gain_{cur['sizes'][-1]}_vs_1: {ci_text(g)} ({seen})")
        for label, row in an["methods"].items():
            sp = row["speedup_flops_at_matched_judge"]
            bound = f" ({sp['bound']} bound)" if sp is not None and sp["bound"] else ""
            sp_s = "undefined" if sp is None else ci_text(sp, ".2f") + bound
            res = row["residual"]
            flag = ("  BELOW the Best-of-N relation" if res["below"] else "") + (
                "  beyond the curve" if res["beyond_curve"] else ""
            )
            pairs = "; ".join(f"vs {_ref_name(r)} {ci_text(row['vs_' + r])}" for r in refs)
            out.append(
                f"{tag}_{label}: {ci_text(row['judge'], '.4f')}; {pairs}; FLOPs speedup at matched score "
                f"{sp_s}; residual from guide gain {ci_text(res)}{flag}"
            )
    return out
