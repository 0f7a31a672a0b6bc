"""Search policies: decisions that copy promising rows as well as reject (``rodeco.Counts``).

- ``particle_filter`` (Puri et al. 2025, arXiv 2502.01618; its_hub's ``ParticleFiltering``): the particles are
  resampled in proportion to ``softmax(score / temperature)``, multinomially or systematically. Finished particles
  keep their weight: each finished candidate stays in the population with its final reward, and the draws that land
  on it are spent on it (the prompt's active particles shrink as candidates finish; when every draw lands on a
  finished one, the prompt ends).
- ``beam`` (reward-guided beam search, search-and-learn): the top ``beam_width`` rows, each expanded into
  ``n / beam_width`` rows (itself and copies).
- ``dvts`` (diverse verifier tree search, search-and-learn): the prompt's starting rows split into
  ``n / beam_width`` subtrees (by ``PromptView.origins``); each subtree keeps its best row and expands it into
  ``beam_width`` rows, independently of the others.

Each decides every ``decision_tokens`` tokens (``PolicyInfo.decision_tokens``) and at every decision point the budget
forces. ``n`` is the start (``RoundView.n_start``); the population is ``n`` rows, never more than the prompt's share
of what the budget fits next (``PromptView.max_rows``): under a tight budget the population shrinks as responses
grow, as Speculative Rejection's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rodeco import (
    BuildContext,
    ConfigError,
    Counts,
    PolicyInfo,
    PromptView,
    RoundView,
    best_first,
    check_number,
    check_positive_int,
    take_params,
)

RESAMPLING = ("multinomial", "systematic")
EVERY_HELP = "a decision point every this many tokens (besides those the budget forces)"


@dataclass
class ParticleFilterParams:
    temperature: float = field(default=1.0, metadata={"help": "weights are softmax(score / temperature); > 0"})
    resampling: str = field(default="multinomial", metadata={"help": "multinomial or systematic"})
    decision_tokens: int = field(default=16, metadata={"help": EVERY_HELP})
    finished_weight: bool = field(
        default=True, metadata={"help": "finished candidates stay in the population with their final reward's weight"}
    )


@dataclass
class BeamParams:
    beam_width: int = field(
        default=4, metadata={"help": "rows kept at a decision point; each is expanded into n / beam_width rows"}
    )
    decision_tokens: int = field(default=16, metadata={"help": EVERY_HELP})


@dataclass
class DVTSParams:
    beam_width: int = field(default=4, metadata={"help": "rows per subtree; n / beam_width subtrees"})
    decision_tokens: int = field(default=16, metadata={"help": EVERY_HELP})


def every(decision_tokens: int) -> int:
    check_positive_int("policy.decision_tokens", decision_tokens, 16)
    return decision_tokens


def softmax_weights(scores: np.ndarray, temperature: float) -> np.ndarray:
    z = np.asarray(scores, dtype=np.float64) / temperature
    w = np.exp(z - z.max())
    return w / w.sum()


def resample(weights: np.ndarray, draws: int, rng: np.random.Generator, how: str) -> np.ndarray:
    """How many of ``draws`` particles each weight gets: multinomial, or systematic (one uniform, evenly spaced)."""
    if how == "multinomial":
        return rng.multinomial(draws, weights)
    positions = (rng.random() + np.arange(draws)) / draws
    cdf = np.cumsum(weights)
    cdf[-1] = 1.0
    return np.bincount(np.searchsorted(cdf, positions, side="right"), minlength=len(weights))


def trim(counts: np.ndarray, limit: int, scores: np.ndarray, keep_one: bool) -> np.ndarray:
    """``counts`` cut to ``limit`` rows in all: a copy of the most-copied row goes first (ties: the lower score).
    ``keep_one``: never below one row (a prompt with no finished candidate must go on)."""
    counts = counts.copy()
    limit = max(limit, 1 if keep_one else 0)
    while counts.sum() > limit:
        i = max(range(len(counts)), key=lambda j: (counts[j], -scores[j]))
        counts[i] -= 1
    if keep_one and counts.sum() == 0:
        counts[int(np.argmax(scores))] = 1
    return counts


def population(view: RoundView, pv: PromptView) -> int:
    return max(1, min(view.n_start or pv.k, pv.max_rows or pv.k))


class ParticleFilterPolicy:
    def __init__(self, temperature: float, resampling: str, decision_tokens: int, finished_weight: bool) -> None:
        self.temperature = check_number(
            "policy.temperature",
            temperature,
            0.0,
            float("inf"),
            lo_open=True,
            fix="set policy.temperature above 0, e.g. 1.0",
        )
        if resampling not in RESAMPLING:
            raise ConfigError(
                "policy.resampling", resampling, "unknown resampling", f"use one of {', '.join(RESAMPLING)}"
            )
        self.resampling, self.finished_weight = resampling, bool(finished_weight)
        self.info = PolicyInfo(decision_tokens=every(decision_tokens))

    def select(self, view: RoundView) -> list[Counts]:
        out = []
        for pv in view.prompts:
            assert pv.rng is not None  # the loop seeds every prompt's view
            finals = np.asarray(pv.finished_scores if self.finished_weight else [], dtype=np.float64)
            scores = np.concatenate([np.asarray(pv.scores, dtype=np.float64), finals])
            drawn = resample(softmax_weights(scores, self.temperature), population(view, pv), pv.rng, self.resampling)
            active = drawn[: pv.k]  # the draws on finished candidates are spent on them
            out.append(Counts(trim(active, pv.max_rows or pv.k, pv.scores, keep_one=not pv.finished_scores)))
        return out


class _Beams:
    """What ``beam`` and ``dvts`` are built from: a width and how often to decide."""

    def __init__(self, beam_width: int, decision_tokens: int) -> None:
        check_positive_int("policy.beam_width", beam_width, 4)
        self.beam_width = beam_width
        self.info = PolicyInfo(decision_tokens=every(decision_tokens))


class BeamPolicy(_Beams):
    def select(self, view: RoundView) -> list[Counts]:
        out = []
        for pv in view.prompts:
            out.append(Counts(expand_best(pv, np.arange(pv.k), self.beam_width, population(view, pv))))
        return out


def expand_best(pv: PromptView, rows: np.ndarray, width: int, total: int) -> np.ndarray:
    """Counts over the prompt's ``k`` rows: the best ``width`` of ``rows`` share ``total`` rows evenly (the
    remainder to the best), every other row 0."""
    counts = np.zeros(pv.k, dtype=np.int64)
    top = best_first(pv, rows)[: max(1, min(width, len(rows), total))]
    counts[top] = total // len(top)
    counts[top[: total % len(top)]] += 1
    return counts


class DVTSPolicy(_Beams):
    def select(self, view: RoundView) -> list[Counts]:
        out = []
        for pv in view.prompts:
            n = view.n_start or pv.k
            trees = max(1, n // self.beam_width)
            tree = np.minimum(np.asarray(pv.origins if pv.origins else range(pv.k)) // self.beam_width, trees - 1)
            live = np.unique(tree)
            counts = np.zeros(pv.k, dtype=np.int64)
            for t in live:  # each subtree: its best row, expanded into beam_width rows
                counts += expand_best(pv, np.nonzero(tree == t)[0], 1, self.beam_width)
            out.append(Counts(trim(counts, population(view, pv), np.asarray(pv.scores), keep_one=True)))
        return out


def build_particle_filter(params: dict[str, Any], ctx: BuildContext) -> ParticleFilterPolicy:
    return ParticleFilterPolicy(**take_params("policy", params, ParticleFilterParams))


def build_beam(params: dict[str, Any], ctx: BuildContext) -> BeamPolicy:
    return BeamPolicy(**take_params("policy", params, BeamParams))


def build_dvts(params: dict[str, Any], ctx: BuildContext) -> DVTSPolicy:
    return DVTSPolicy(**take_params("policy", params, DVTSParams))
