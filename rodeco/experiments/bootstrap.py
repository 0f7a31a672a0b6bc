"""Bootstrap figures of the efficiency analysis built from several methods' per-resample speedups: percentile CIs
that skip undefined resamples, a method's speedup paired with a reference's on the same resamples, and the share of
the gap to the oracle ceiling closed.

Bounds: a speedup is ``"lower"`` where the method scored above Best-of-M's curve (the true speedup is at least the
figure), ``"upper"`` where it scored below Best-of-1's (at most the figure), ``None`` on the curve (no bound).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

UNKNOWN = "unknown"  # a ratio of two figures clamped at the same end: the true ratio may lie either side


def ci(values: Sequence[float] | np.ndarray) -> list[float]:
    """The 2.5 and 97.5 percentiles of the finite values (resamples where a figure is undefined are skipped), or
    two nans where none is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return [float("nan"), float("nan")]
    return [float(np.percentile(v, q)) for q in (2.5, 97.5)]


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
