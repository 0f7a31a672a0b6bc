"""A trace's token confidence, DeepConf's (arXiv 2508.15260), from the generator's top-k log-probs.

A token's confidence is the mean negative log-probability of the ``k`` most likely tokens at its position,
``C_i = -(1/k) sum_j log P_i(j)``: high where the distribution is peaked, low where it is flat. A *group* is
``window`` consecutive tokens; a trace's lowest group confidence is the lowest of its groups' means (its mean when it
is shorter than a window). The ``confidence`` reward, the ``deepconf`` policy and the confidence-weighted vote
(``winner.weight=confidence``) all read it from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def token_confidence(top: Sequence[Sequence[float]] | np.ndarray, k: int) -> np.ndarray:
    """[tokens] ``-mean`` of each position's ``k`` most likely tokens' log-probs."""
    a = np.asarray(top, dtype=np.float64).reshape(len(top), -1)[:, :k]
    return -a.mean(axis=1)


def group_confidences(c: np.ndarray, window: int) -> np.ndarray:
    """Means over every ``window`` consecutive tokens (one group, the whole trace, when it is shorter)."""
    if len(c) <= window:
        return np.array([c.mean()])
    s = np.concatenate([[0.0], np.cumsum(c)])
    return (s[window:] - s[:-window]) / window


def lowest_group_confidence(top: Sequence[Sequence[float]] | np.ndarray, k: int, window: int) -> float:
    """A trace's lowest group confidence from its positions' top-k log-probs (at least one position)."""
    return float(group_confidences(token_confidence(top, k), window).min())
