"""The one bootstrap: resamples drawn with replacement, percentile CIs over them, and the figures built from them
(a mean's CI, a ratio of sums, a geometric mean of paired ratios, resamples of prompts and of their candidate sets,
a method's speedup paired with a reference's, the share of the gap to the oracle ceiling closed).

Every CI in rodeco's experiments and benchmarks is drawn here: ``draws`` gives the same indices whether a caller
takes them all at once or one resample at a time from the same generator.

Bounds: a speedup is ``"lower"`` where the method scored above Best-of-M's curve (the true speedup is at least the
figure), ``"upper"`` where it scored below Best-of-1's (at most the figure), ``None`` on the curve (no bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

UNKNOWN = "unknown"  # a ratio of two figures clamped at the same end: the true ratio may lie either side


def draws(n: int, resamples: int, seed: int | np.random.Generator = 0, size: int | None = None) -> np.ndarray:
    """``[resamples, size]`` indices into ``n`` items (``size``: ``n`` unless given), each row drawn with
    replacement (``seed``: a seed, or a generator to continue)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.integers(0, n, size=(resamples, n if size is None else size))


def ci(values: Sequence[float] | np.ndarray) -> list[float]:
    """The 2.5 and 97.5 percentiles of the finite values (resamples where a figure is undefined are skipped), or
    two nans where none is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return [float("nan"), float("nan")]
    return [float(np.percentile(v, q)) for q in (2.5, 97.5)]


def mean_ci(x: Sequence[float] | np.ndarray, resamples: int = 2000, seed: int | np.random.Generator = 0) -> list[float]:
    """The 95% CI of the mean of ``x`` over resamples of its entries (two nans for an empty ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    if not len(x):
        return [float("nan"), float("nan")]
    return ci(x[draws(len(x), resamples, seed)].mean(1))


def resampled(
    stat: Callable[[np.ndarray], float], n: int, resamples: int, seed: int | np.random.Generator = 0
) -> list[float]:
    """``[stat(all), lo, hi]``: a figure of ``n`` paired items (``stat`` of an index array) and its 95% CI over
    resamples of the items."""
    return [stat(np.arange(n)), *ci([stat(b) for b in draws(n, resamples, seed)])]


def ratio_of_sums(num: np.ndarray, den: np.ndarray, resamples: int, seed: int = 0) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` with a 95% CI over resamples of the paired entries."""
    idx = draws(len(num), resamples, seed)
    lo, hi = ci(num[idx].sum(1) / den[idx].sum(1))
    return float(num.sum() / den.sum()), lo, hi


def geomean_ci(
    ratios: Sequence[float] | np.ndarray, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The geometric mean of ``ratios`` and its 95% CI over resamples of them."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    lo, hi = ci(logs[draws(len(logs), resamples, seed)].mean(1))
    return math.exp(logs.mean()), math.exp(lo), math.exp(hi)


def with_data(idx: np.ndarray) -> np.ndarray:
    """``idx`` ``[B, n]`` with the data itself as draw 0: ``[B+1, n]``."""
    return np.concatenate([np.arange(idx.shape[1])[None], idx])


@dataclass
class Resamples:
    """Bootstrap draws: prompts with replacement and, within each drawn prompt, its sets with replacement (draw 0
    is the data itself)."""

    prompts: np.ndarray  # [B+1, P]
    sets: np.ndarray  # [B+1, P, S]

    @classmethod
    def draw(cls, P: int, S: int, n: int, seed: int = 0) -> Resamples:
        rng = np.random.default_rng(seed)
        prompts = with_data(draws(P, n, rng))
        sets = np.concatenate([np.broadcast_to(np.arange(S), (1, P, S)), rng.integers(0, S, (n, P, S))])
        return cls(prompts, sets)

    def means(self, x: np.ndarray) -> np.ndarray:
        """``x`` ``[P, S, ...]`` -> its mean over each draw's (prompt, set) pairs, ``[B+1, ...]`` (NaNs skipped)."""
        p = self.prompts[:, :, None]
        return np.nanmean(x[p, self.sets].reshape(len(self.prompts), -1, *x.shape[2:]), axis=1)


def ratio_bound(num: str | None, den: str | None) -> str | None:
    """Which way ``num_figure / den_figure`` is bounded, from the bounds of its two figures: a numerator that is
    at least its figure, or a denominator that is at most its figure, make the ratio a lower bound (and conversely);
    both ways at once leave it ``UNKNOWN``."""
    flip = {"lower": "upper", "upper": "lower", None: None}
    ways = {b for b in (num, flip[den]) if b is not None}
    if not ways:
        return None
    return ways.pop() if len(ways) == 1 else UNKNOWN


def paired_ratio(
    num: float, den: float, boot_num: np.ndarray, boot_den: np.ndarray, num_bound: str | None, den_bound: str | None
) -> dict[str, object]:
    """``num / den`` and its 95% CI from the ratios on the same resamples (paired: what both methods share, the
    prompts drawn, cancels), with the ratio's bound."""
    return {
        "ratio": float(num / den),
        "ci": ci(np.asarray(boot_num) / np.asarray(boot_den)),
        "bound": ratio_bound(num_bound, den_bound),
    }


def gap_closed(best: np.ndarray | float, base: np.ndarray | float, ceiling: np.ndarray | float) -> np.ndarray:
    """The log-scale share of the way from ``base``'s speedup to its oracle ``ceiling`` that ``best`` covers:
    ``log(best / base) / log(ceiling / base)``, nan where the ceiling is not above the base (elementwise)."""
    best, base, ceiling = (np.asarray(x, dtype=np.float64) for x in (best, base, ceiling))
    ok = ceiling > base
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.log(best / base) / np.log(ceiling / base)
    return np.where(ok, g, np.nan)


def gap_closed_ci(best: np.ndarray, base: np.ndarray, ceiling: np.ndarray) -> dict[str, object]:
    """The gap closed on each resample (from that resample's three speedups) and its 95% CI over the resamples
    where it is defined (``resamples``: how many)."""
    g = gap_closed(best, base, ceiling)
    return {"ci": ci(g), "resamples": int(np.isfinite(g).sum())}
