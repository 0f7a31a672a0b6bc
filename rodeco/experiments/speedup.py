"""The one matched speedup: the FLOPs Best-of-N's curve needs to reach a method's score, over the method's FLOPs."""

from __future__ import annotations

import numpy as np


def monotone(y: np.ndarray) -> np.ndarray:
    """The running maximum of ``y``."""
    return np.maximum.accumulate(y)


def matched_speedup(j: float, f: float, curve_j: np.ndarray, curve_f: np.ndarray) -> tuple[float, str]:
    """Best-of-N's FLOPs at score ``j`` (log-FLOPs interpolated on the running maximum of the curve ``curve_j`` at
    FLOPs ``curve_f``) over ``f``; with ``"lower"`` / ``"upper"`` when ``j`` is past the curve's top / under its
    bottom (a bound: the curve's last / first point's FLOPs)."""
    cj = monotone(np.asarray(curve_j, dtype=np.float64))
    lf = np.log(np.asarray(curve_f, dtype=np.float64))
    if j >= cj[-1]:
        return float(np.exp(lf[-1]) / f), "lower" if j > cj[-1] else ""
    if j <= cj[0]:
        return float(np.exp(lf[0]) / f), "upper" if j < cj[0] else ""
    k = int(np.searchsorted(cj, j, side="left"))  # cj[k-1] < j <= cj[k]
    w = (j - cj[k - 1]) / (cj[k] - cj[k - 1])
    return float(np.exp(lf[k - 1] + w * (lf[k] - lf[k - 1])) / f), ""
