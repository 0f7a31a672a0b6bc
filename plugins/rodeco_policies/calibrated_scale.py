"""The scale on which ``calibrated`` reads one prompt's scores: the calibration's (``rodeco.core.calibration``), where
partial scores are standardized over *every* candidate still active at a length, none selected.

- **Spread**: the standard deviation of the partial scores of every row active at the prompt's first decision point
  (no row rejected yet: the calibration's population), kept for every later decision point. It is never measured
  on survivors: earlier rounds kept the top rows, whose spread is smaller than the population's, so standardizing
  among them inflates every gap (the fault of re-standardizing each round). What it assumes: the partial scorer's
  within-prompt spread does not drift with length (on the embedded reward it held within a few percent from 8 to
  64 tokens).
- **Location** (the population's mean at this length; it only matters against finished candidates' finals, since
  among active rows only differences count): the first decision point's mean, then carried from one decision point
  to the next along the calibration's own model read as a chain (partial at ``L'`` -> partial at ``L`` -> final,
  so the standardized partials at ``L' < L`` correlate ``b = rho(L') / rho(L)``): ``m_L = mean(y) - b * (mean(x) -
  m_L')`` over the rows active at both, ``x`` and ``y`` their scores there. Survivors were selected on ``x`` (and
  before), and selection on the regressor does not bias a regression, so this corrects their regression to the mean
  instead of taking their mean for the population's (which a plain mean of survivors, or of their moves, does not).

A policy keeps one reference per prompt from its first decision point on, so a prompt's views must reach it in
order (the loop's). A view whose earlier decision points it did not see (built by hand) is read on its own rows'
mean and spread, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rodeco import PromptView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    """One decision point of a prompt, as the reference saw it."""

    tokens: int  # tokens generated there
    location: float  # the population's mean partial score there (estimated)
    scores: dict[int, float]  # candidate id -> partial score, for the rows active there


@dataclass
class Reference:
    spread: float  # fixed at the first decision point (0 until the scores there differ)
    points: list[Point]  # the latest two decision points


@dataclass(frozen=True)
class Scale:
    location: float
    spread: float

    def z(self, values: np.ndarray) -> np.ndarray:
        """``(values - location) / spread``; with no spread, 0 at the location and +-inf away from it."""
        v = np.asarray(values, dtype=np.float64) - self.location
        if self.spread > 0:
            return v / self.spread
        return np.where(v > 0, math.inf, np.where(v < 0, -math.inf, 0.0))


def chain_slope(rho_before: float, rho_now: float) -> float:
    """The correlation of standardized partial scores at two lengths ``L' < L``, ``rho(L') / rho(L)``, that the
    calibration implies when partial scores reach the final through each other (at most 1; 1 where ``rho(L)`` is 0,
    the limit when both vanish alike)."""
    return min(1.0, max(0.0, rho_before) / rho_now) if rho_now > 0 else 1.0


class References:
    """Each prompt's reference, keyed by ``prompt_index`` (the most recent ``capacity`` prompts)."""

    def __init__(self, rho: Callable[[int], float], capacity: int = 4096) -> None:
        self.rho, self.capacity = rho, capacity
        self._refs: OrderedDict[int, Reference] = OrderedDict()
        self._warned = False

    def scale(self, pv: PromptView) -> Scale:
        """The prompt's population location and spread at this decision point; records it for the next one."""
        scores = np.asarray(pv.scores, dtype=np.float64)
        ref = self._refs.get(pv.prompt_index)
        prev = self._previous(ref, pv) if ref is not None and pv.history.shape[1] > 0 else None
        if prev is None:
            if pv.history.shape[1] > 0:
                self._warn(pv)
            ref = Reference(spread=float(scores.std()), points=[])
            location = float(scores.mean())
        else:
            assert ref is not None  # prev is one of its points
            x = np.array([prev.scores[c] for c in pv.candidate_ids])
            b = chain_slope(self.rho(prev.tokens), self.rho(pv.tokens_generated))
            location = float(scores.mean() - b * (x.mean() - prev.location))
            if ref.spread <= 0:  # every score was equal so far: the first decision point where they differ
                ref.spread = float(scores.std())
        if ref.spread <= 0:  # the active rows' scores are all equal: read them as the population's mean
            location = float(scores.mean())
        point = Point(pv.tokens_generated, location, dict(zip(pv.candidate_ids, scores.tolist())))
        ref.points = [p for p in ref.points if p.tokens < pv.tokens_generated][-1:] + [point]
        self._remember(pv.prompt_index, ref)
        return Scale(location, ref.spread)

    @staticmethod
    def _previous(ref: Reference, pv: PromptView) -> Point | None:
        """The latest earlier point whose scores are this view's rows' last ones (the same decode, in order)."""
        last = pv.history[:, -1]
        for p in reversed(ref.points):
            if p.tokens < pv.tokens_generated:
                same = all(
                    c in p.scores and math.isclose(p.scores[c], float(s), rel_tol=1e-12, abs_tol=1e-12)
                    for c, s in zip(pv.candidate_ids, last)
                )
                return p if same else None
        return None

    def _remember(self, key: int, ref: Reference) -> None:
        self._refs[key] = ref
        self._refs.move_to_end(key)
        while len(self._refs) > self.capacity:
            self._refs.popitem(last=False)

    def _warn(self, pv: PromptView) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "calibrated: prompt %d is at a later decision point (%d tokens) whose first this policy did "
                "not see; its scores are read on its active rows' own mean and spread",
                pv.prompt_index,
                pv.tokens_generated,
            )
