"""The verifier's held-out figures (``rodeco experiment=verifier_train``): the examples it is measured on, the AUC
within problems (right-wrong pairs of a problem at the same point) and pooled over problems per task and prefix with
bootstrap CIs, the calibration error, and the pick among a problem's candidates against ``logprob``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

END = "end"


@dataclass
class Examples:
    """Examples of some problems stacked: one row per (candidate, prefix or end)."""

    x: np.ndarray  # [E, F] float32 features of the richest set (hidden states first, then the statistics)
    y: np.ndarray  # [E] 1.0: the candidate's final answer is right
    task: np.ndarray  # [E] task name
    problem: np.ndarray  # [E] a problem's key, unique across pools
    length: np.ndarray  # [E] tokens read
    at: np.ndarray  # [E] the prefix, or END

    def take(self, m: np.ndarray) -> Examples:
        return Examples(self.x[m], self.y[m], self.task[m], self.problem[m], self.length[m], self.at[m])


def auc(score: np.ndarray, y: np.ndarray) -> float:
    """The area under the ROC curve (Mann-Whitney, ties halved); nan without both classes."""
    pos, neg = int(y.sum()), int(len(y) - y.sum())
    if not pos or not neg:
        return float("nan")
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    s = score[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: the examples' share-weighted gap between mean prediction and rate, per bin."""
    k = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[k == b].mean() - y[k == b].mean()) * (k == b).mean() for b in range(bins) if (k == b).any()))


def groups(ex: Examples) -> dict[tuple[str, str], np.ndarray]:
    """The examples of each (problem, prefix or end): rows a decision point (or the winner's pick) compares."""
    out: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(ex.problem.tolist(), ex.at.tolist())):
        out.setdefault(key, []).append(i)
    return {k: np.asarray(v) for k, v in out.items()}


def within_auc(s: np.ndarray, ex: Examples, prefixes: Sequence[int]) -> dict[str, dict[str, float]]:
    """Per task and prefix (and pooled): the share of right-wrong pairs of the same problem at the same point that
    the scores order right (ties halved): how well the head ranks the rows a decision point compares."""
    cells: dict[tuple[str, str], list[float]] = {}
    for (_, at), idx in groups(ex).items():
        right, wrong = s[idx][ex.y[idx] == 1], s[idx][ex.y[idx] == 0]
        if len(right) and len(wrong):
            cmp = np.sign(right[:, None] - wrong[None, :])
            won = float((cmp > 0).sum() + 0.5 * (cmp == 0).sum())
            task = str(ex.task[idx[0]])
            for t in (task, "pooled"):
                c = cells.setdefault((t, at), [0.0, 0.0])
                c[0] += won
                c[1] += cmp.size
    out: dict[str, dict[str, float]] = {}
    for task in [*sorted(set(ex.task.tolist())), "pooled"]:
        out[task] = {}
        for at in [*map(str, prefixes), END]:
            won, n = cells.get((task, at), (0.0, 0.0))
            out[task][at] = won / n if n else float("nan")
    return out


def by_cell(s: np.ndarray, ex: Examples, prefixes: Sequence[int]) -> dict[str, dict[str, float]]:
    """AUC per task and prefix (and END), and pooled over tasks."""
    out: dict[str, dict[str, float]] = {}
    for task in [*sorted(set(ex.task.tolist())), "pooled"]:
        mt = np.ones(len(ex.y), bool) if task == "pooled" else ex.task == task
        out[task] = {str(at): auc(s[mt & (ex.at == str(at))], ex.y[mt & (ex.at == str(at))]) for at in [*prefixes, END]}
    return out


def mean_auc(cells: dict[str, dict[str, float]]) -> float:
    vals = [v for t, row in cells.items() if t != "pooled" for v in row.values() if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def auc_cis(s: np.ndarray, ex: Examples, prefixes: Sequence[int], resamples: int, seed: int) -> dict[str, Any]:
    """Per task and prefix: the AUC with a 95% bootstrap CI over problems."""
    out: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    for task in [*sorted(set(ex.task.tolist())), "pooled"]:
        mt = np.ones(len(ex.y), bool) if task == "pooled" else ex.task == task
        out[task] = {}
        for at in [*prefixes, END]:
            m = mt & (ex.at == str(at))
            probs = np.unique(ex.problem[m])
            rows = {q: np.flatnonzero(m & (ex.problem == q)) for q in probs}
            boot = []
            for _ in range(resamples if len(probs) else 0):
                idx = np.concatenate([rows[q] for q in rng.choice(probs, len(probs))])
                a = auc(s[idx], ex.y[idx])
                if np.isfinite(a):
                    boot.append(a)
            point = auc(s[m], ex.y[m])
            lo, hi = (np.percentile(boot, [2.5, 97.5]).tolist()) if boot else (float("nan"), float("nan"))
            out[task][str(at)] = {"auc": point, "ci": [lo, hi], "problems": len(probs), "right": float(ex.y[m].mean())}
    return out


def calibration(s: np.ndarray, ex: Examples, prefixes: Sequence[int]) -> dict[str, dict[str, float]]:
    """Per task and prefix: expected calibration error of the predicted probability."""
    p = 1 / (1 + np.exp(-s))
    out: dict[str, dict[str, float]] = {}
    for task in [*sorted(set(ex.task.tolist())), "pooled"]:
        mt = np.ones(len(ex.y), bool) if task == "pooled" else ex.task == task
        out[task] = {}
        for at in [*prefixes, END]:
            m = mt & (ex.at == str(at))
            out[task][str(at)] = ece(p[m], ex.y[m]) if m.any() else float("nan")
    return out


def best_of_pool(s: np.ndarray, ex: Examples, hidden: int, resamples: int, seed: int) -> dict[str, Any]:
    """Per task and pooled, over the problems of ``ex``: the gold accuracy of the candidate each picks among a
    problem's finished responses (all its candidates: Best-of-16 on 16-candidate pools), with 95% bootstrap CIs over
    problems: the head's argmax, the mean token log-prob's argmax (``logprob``), a random pick (the mean), and any
    (the ceiling)."""
    end = ex.at == END
    mean_lp = ex.x[:, hidden].astype(np.float64)  # the first statistic, STATS[0]
    rows: dict[str, list[float]] = {}
    tasks: list[str] = []
    for q in np.unique(ex.problem[end]):
        m = end & (ex.problem == q)
        y = ex.y[m]
        tasks.append(str(ex.task[m][0]))
        for name, pick in (("verifier", float(y[np.argmax(s[m])])), ("logprob", float(y[np.argmax(mean_lp[m])]))):
            rows.setdefault(name, []).append(pick)
        rows.setdefault("random", []).append(float(y.mean()))
        rows.setdefault("any", []).append(float(y.max()))
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    t = np.array(tasks)
    for task in [*sorted(set(tasks)), "pooled"]:
        idx = np.flatnonzero(t == task) if task != "pooled" else np.arange(len(t))
        boots = [rng.choice(idx, len(idx)) for _ in range(resamples)] if len(idx) else []
        out[task] = {"problems": len(idx)}
        for name, picks in rows.items():
            a = np.asarray(picks)
            lo, hi = np.percentile([a[b].mean() for b in boots], [2.5, 97.5]).tolist() if boots else [np.nan] * 2
            out[task][name] = [float(a[idx].mean()) if len(idx) else float("nan"), lo, hi]
    return out
