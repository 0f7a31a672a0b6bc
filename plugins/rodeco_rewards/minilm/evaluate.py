"""Held-out pairwise accuracy of a reward on preference pairs, next to the length-only baseline and on the pairs
of similar length (where length alone says little). Used by ``rm_train``, ``rm_eval`` and the tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rodeco import Reward, ScoreRequest
from rodeco_rewards.prefs import Pair, length_baseline, pairwise_accuracy, similar_length


@dataclass(frozen=True)
class PairScores:
    chosen: np.ndarray
    rejected: np.ndarray


@dataclass(frozen=True)
class Accuracy:
    n: int
    rm: float
    length_baseline: float
    n_similar: int
    rm_similar: float
    length_similar: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def score_pairs(reward: Reward, pairs: Sequence[Pair], chunk: int = 512) -> PairScores:
    """Both sides of every pair through ``reward.score`` (complete responses), ``chunk`` requests per call."""
    reqs = [
        ScoreRequest(prompt=p.prompt, response=text, response_ids=(), partial=False, prompt_index=i)
        for i, p in enumerate(pairs)
        for text in (p.chosen, p.rejected)
    ]
    out: list[float] = []
    for i in range(0, len(reqs), chunk):
        out += [float(x) for x in reward.score(reqs[i : i + chunk])]
    s = np.asarray(out).reshape(len(pairs), 2)
    return PairScores(s[:, 0], s[:, 1])


def accuracy(pairs: Sequence[Pair], s: PairScores, tolerance: float = 0.2) -> Accuracy:
    sim = np.array([similar_length(p, tolerance) for p in pairs], dtype=bool)
    sim_pairs = [p for p, m in zip(pairs, sim) if m]
    return Accuracy(
        n=len(pairs),
        rm=pairwise_accuracy(s.chosen.tolist(), s.rejected.tolist()),
        length_baseline=length_baseline(pairs),
        n_similar=int(sim.sum()),
        rm_similar=pairwise_accuracy(s.chosen[sim].tolist(), s.rejected[sim].tolist()),
        length_similar=length_baseline(sim_pairs),
    )


def sample_pairs(pairs: Sequence[Pair], n: int, seed: int = 0, by_group: bool = False) -> list[Pair]:
    """A fixed random sample of ``n`` pairs (in file order). ``by_group``: all pairs of randomly drawn instructions
    until there are ``n`` (fewer distinct texts to encode: every AlpacaEval pair of an instruction shares its
    reference answer)."""
    rng = np.random.default_rng(seed)
    if not by_group:
        idx = np.sort(rng.choice(len(pairs), size=min(n, len(pairs)), replace=False))
        return [pairs[i] for i in idx]
    chosen: set[str] = set()
    total = 0
    for g in rng.permutation(sorted({p.group for p in pairs})).tolist():
        if total >= n:
            break
        chosen.add(g)
        total += sum(p.group == g for p in pairs)
    return [p for p in pairs if p.group in chosen][:n]
