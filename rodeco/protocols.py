"""The contracts a reward or a rejection policy implements. Plain ``Protocol``s: no base class needed.
``rodeco.contracts`` holds every call to a plugin to them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rodeco.state import RoundView, ScoreRequest


@dataclass
class RewardCost:
    """What a reward spent; the loop reads it into the run's compute accounting."""

    tokens: int = 0
    flops: float = 0.0
    calls: int = 0


@runtime_checkable
class Reward(Protocol):
    """Scores (prompt, response) pairs, partial or complete.

    Optional class attributes: ``needs_logprobs = True`` makes the loop fill ``ScoreRequest.logprobs`` with the
    generator's per-token log-probabilities; ``needs_hidden_states = True`` fills ``ScoreRequest.hidden_state`` of
    partial requests with the generator's final-layer hidden state (such a reward can only be a ``partial_reward``);
    ``cost: RewardCost`` is read for compute accounting.
    """

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        """One finite float per request, in order; higher is better."""
        ...


@runtime_checkable
class Policy(Protocol):
    """Chooses which candidates survive a decision point."""

    def select(self, view: RoundView) -> list[list[int]]:
        """For each ``view.prompts[j]``, the local row indices to keep.

        Must keep at least one row per prompt and at most ``view.max_rows_next`` rows in all; may reject more than
        each prompt's ``min_reject``, never fewer in total than ``view.min_reject_total``.
        """
        ...
