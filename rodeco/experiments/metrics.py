"""Estimators for comparing decoding methods (the Speculative Rejection paper's metrics).

- ``expected_best_of(scores, N)``: unbiased estimate of Best-of-N's expected final reward from one pool of
  ``M >= N`` samples: the expected maximum over a uniformly random subset of size ``N`` (without replacement).
- ``improvement_score``: ``100 * (1 + mean_p (best_p - max_p) / (max_p - min_p))`` where ``max_p``/``min_p`` are the
  highest and lowest rewards among prompt ``p``'s Best-of-n samples: 100 means as good as Best-of-n.
- ``compute_to_match``: the compute Best-of-N needs to reach a score, log-interpolated on its (compute, score)
  curve; ``None`` beyond the curve's range (no extrapolation is claimed). ``curve_end`` says which end of the
  curve a score falls off, and so which way a figure clamped there is bounded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln

Floats = Sequence[float] | np.ndarray  # a list of figures, or an array of them


def expected_best_of(scores: Floats, n: int) -> float:
    """E[max of a random size-``n`` subset of ``scores``]. The i-th smallest of M values (1-based) is the maximum
    of a random n-subset with probability C(i-1, n-1) / C(M, n)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    m = s.size
    if not 1 <= n <= m:
        raise ValueError(f"n={n} must be between 1 and the pool size {m}")
    i = np.arange(1, m + 1)
    valid = i >= n
    logw = np.full(m, -np.inf)
    logw[valid] = (gammaln(i[valid]) - gammaln(n) - gammaln(i[valid] - n + 1)) - (
        gammaln(m + 1) - gammaln(n + 1) - gammaln(m - n + 1)
    )
    return float(np.sum(np.exp(logw) * s))


def improvement_score(best: Floats, bon_max: Floats, bon_min: Floats) -> float:
    """The paper's relative improvement over Best-of-n (prompts whose Best-of-n samples all tie are skipped)."""
    b, hi, lo = (np.asarray(x, dtype=np.float64) for x in (best, bon_max, bon_min))
    span = hi - lo
    ok = span > 0
    if not ok.any():
        raise ValueError("every prompt's Best-of-n samples have the same reward: the score is undefined")
    return float(100.0 * (1.0 + np.mean((b[ok] - hi[ok]) / span[ok])))


def compute_to_match(score: float, bon_compute: Floats, bon_scores: Floats) -> float | None:
    """Compute Best-of-N needs to reach ``score``: linear in log-compute between the two points of the curve that
    bracket it (the curve is made monotone by a running maximum). ``None`` if ``score`` is above the curve."""
    c = np.asarray(bon_compute, dtype=np.float64)
    y = np.maximum.accumulate(np.asarray(bon_scores, dtype=np.float64)[np.argsort(c)])
    c = np.sort(c)
    if score > y[-1]:
        return None
    if score <= y[0]:
        return float(c[0])
    j = int(np.searchsorted(y, score, side="left"))  # y[j-1] < score <= y[j]
    if y[j] == y[j - 1]:
        return float(c[j - 1])
    t = (score - y[j - 1]) / (y[j] - y[j - 1])
    return float(np.exp(np.log(c[j - 1]) + t * (np.log(c[j]) - np.log(c[j - 1]))))


def curve_end(score: float, bon_compute: Floats, bon_scores: Floats) -> str | None:
    """Where ``score`` falls off Best-of-N's curve (made monotone as in ``compute_to_match``): ``"lower"`` above its
    best score (a speedup charged the curve's largest compute is a lower bound: the true one is at least that),
    ``"upper"`` below the score of its cheapest point (charged that point's compute, which matches a worse score
    only at a cost of at most that: an upper bound), ``None`` on the curve (interpolated, no bound)."""
    c = np.asarray(bon_compute, dtype=np.float64)
    y = np.maximum.accumulate(np.asarray(bon_scores, dtype=np.float64)[np.argsort(c)])
    if score > y[-1]:
        return "lower"
    return "upper" if score < y[0] else None


def bon_sizes(M: int) -> list[int]:
    """Best-of-N's sizes on a pool of M candidates per prompt: 1, 2, 4, ... and M itself."""
    return [2**j for j in range(int(np.log2(M)) + 1)] + ([M] if M & (M - 1) else [])
