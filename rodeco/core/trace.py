"""What happened to one batch, recorded as it decodes: each candidate's partial scores by round, final scores,
every decision point, the rows that left (finished or rejected), and the lineage of copies (parent, round of the
fork, the starting row each descends from). From these records it builds each prompt's ``PromptResult``; it computes
nothing of its own but the next free candidate id of a prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rodeco.common.state import Candidate, Compute, Counts, PromptRef, PromptResult, Round, RoundView, Row
from rodeco.common.winner import WinnerRule

LEFT_UNFINISHED = ("rejected", "settled")  # a row a policy rejected, or one stopped because its prompt's vote settled


@dataclass(frozen=True)
class _Own:
    """What a prompt brings to the trace: its policy's and reward's names, its winner rule, whether its result lists
    every candidate, and its text of a response (cut at its stop strings)."""

    policy: str
    reward: str
    winner: WinnerRule
    all_candidates: bool
    text: Callable[[list[int]], str]


class Trace:
    """Keyed by batch key (the prompt's position in the batch, in the order prompts were admitted) and candidate
    id."""

    def __init__(self) -> None:
        self.prompts: list[PromptRef] = []
        self.n_of: list[int] = []  # per prompt: its rows at the start
        self.own: list[_Own] = []
        self.partial: list[dict[int, list[float]]] = []  # per prompt: candidate -> score per round
        self.final: list[dict[int, float]] = []
        self.rounds: list[list[Round]] = []
        self.left: list[Row] = []  # rows that left the batch, in the order they left
        self.parent: list[dict[int, tuple[int, int]]] = []  # per prompt: copy -> (parent, round of the fork)
        self.origin: list[dict[int, int]] = []  # per prompt: candidate -> position of its starting row
        self.next_id: list[int] = []
        self.stopped_at: dict[int, int] = {}  # prompt -> the tokens at which its vote was settled (winner.stop)

    def admit(
        self,
        ref: PromptRef,
        n: int,
        policy: str,
        reward: str,
        winner: WinnerRule,
        all_candidates: bool,
        decode_text: Callable[[list[int]], str],
    ) -> int:
        """A prompt that joined the batch with its rows at the start and what it brings (``_Own``); returns its batch
        key (after the others')."""
        p = len(self.prompts)
        self.prompts.append(ref)
        self.n_of.append(n)
        self.own.append(_Own(policy, reward, winner, all_candidates, decode_text))
        self.partial.append({})
        self.final.append({})
        self.rounds.append([])
        self.parent.append({})
        self.origin.append({})
        self.next_id.append(0)
        return p

    def forget(self, p: int) -> None:
        """Prompt ``p``'s result was given: its rows are no longer kept (an open source's prompts come and go)."""
        self.left = [r for r in self.left if r.prompt != p]
        self.partial[p], self.final[p], self.parent[p], self.origin[p] = {}, {}, {}, {}
        self.stopped_at.pop(p, None)

    def start(self, prompt_of: Sequence[int] | np.ndarray, cands: Sequence[int] | np.ndarray) -> None:
        """The starting rows (after prefill): each is its own origin; copies take ids above them."""
        for p, c in zip(prompt_of, cands):
            p, c = int(p), int(c)
            self.origin[p][c] = len(self.origin[p])
            self.next_id[p] = max(self.next_id[p], c + 1)

    def copy(self, p: int, parent: int, rnd: int) -> int:
        """A new candidate of prompt ``p`` copied from ``parent`` at decision point ``rnd``: its id. It inherits its
        parent's origin and partial-score history."""
        c = self.next_id[p]
        self.next_id[p] += 1
        self.parent[p][c] = (parent, rnd)
        self.origin[p][c] = self.origin[p][parent]
        self.partial[p][c] = list(self.partial[p].get(parent, []))
        return c

    def parents(self, p: int, cands: list[int]) -> list[int | None]:
        return [self.parent[p][c][0] if c in self.parent[p] else None for c in cands]

    def origins(self, p: int, cands: list[int]) -> list[int]:
        return [self.origin[p][c] for c in cands]

    def finished(self, rows: Sequence[Row], scores: np.ndarray) -> None:
        """Rows that reached EOS or max_new_tokens, with their final rewards."""
        self.left += rows
        for f, sc in zip(rows, scores):
            self.final[f.prompt][f.candidate_id] = float(sc)

    def scored(
        self, prompt_of: Sequence[int] | np.ndarray, cands: Sequence[int] | np.ndarray, scores: np.ndarray
    ) -> None:
        """This decision point's partial rewards of the active rows."""
        for p, c, sc in zip(prompt_of, cands, scores):
            self.partial[p].setdefault(int(c), []).append(float(sc))

    def rejected(self, rows: Sequence[Row]) -> None:
        self.left += rows

    def answers(self, p: int) -> list[str | None]:
        """Prompt ``p``'s finished candidates' answers so far, as its winner rule extracts them (its vote)."""
        own = self.own[p]
        done = [f for f in self.left if f.prompt == p and f.reason not in LEFT_UNFINISHED]
        return [own.winner.extract(own.text(f.token_ids)) for f in done]

    def stopped(self, p: int, rows: Sequence[Row], tokens: int) -> None:
        """Prompt ``p``'s vote was settled at ``tokens``: its active ``rows`` stopped (they leave unfinished, with
        reason ``settled``)."""
        for r in rows:
            r.reason = "settled"
        self.left += rows
        self.stopped_at[p] = tokens

    def cancel(self, rows: Sequence[Row]) -> None:
        """The rows that left with a prompt whose request went away (it gets no result)."""
        self.left += rows

    def round(
        self, view: RoundView, counts: list[Counts], keys: Sequence[int], copies: Sequence[dict[int, list[int]]]
    ) -> None:
        """A decision point: ``keys[j]`` is the batch key of ``view.prompts[j]``, ``copies[j]`` its copies' ids by
        parent. ``rows_kept`` counts the rows that go on, copies included."""
        for pv, c, p, cp in zip(view.prompts, counts, keys, copies):
            ids = pv.candidate_ids
            kept_ids = [ids[i] for i in c.kept]
            self.rounds[p].append(
                Round(
                    round=view.round,
                    tokens_generated=pv.tokens_generated,
                    rows_before=pv.k,
                    rows_kept=c.total,
                    kept_ids=kept_ids,
                    rejected_ids=[x for x in ids if x not in set(kept_ids)],
                    scores={x: float(sc) for x, sc in zip(ids, pv.scores)},
                    min_reject=pv.min_reject,
                    copies=dict(cp),
                )
            )

    def history(self, p: int, cands: list[int]) -> np.ndarray:
        """[k, r] earlier partial scores of these candidates (this round's score excluded)."""
        hist = [self.partial[p][c][:-1] for c in cands]
        r = max((len(h) for h in hist), default=0)
        out = np.full((len(cands), r), np.nan)
        for i, h in enumerate(hist):
            out[i, r - len(h) :] = h
        return out

    def finished_scores(self, p: int) -> list[float]:
        return list(self.final[p].values())

    def finished_ids(self, p: int) -> list[int]:
        return list(self.final[p])

    def _last_partial(self, p: int, c: int) -> float | None:
        """Candidate ``c``'s latest partial score (None: it left before any decision point scored it)."""
        scores = self.partial[p].get(c)
        return scores[-1] if scores else None

    def result(self, p: int, compute: Compute) -> PromptResult:
        own = self.own[p]
        cands = []
        for f in (f for f in self.left if f.prompt == p):
            rejected = f.reason in LEFT_UNFINISHED
            parent, rnd = self.parent[p].get(f.candidate_id, (None, None))
            cands.append(
                Candidate(
                    candidate_id=f.candidate_id,
                    token_ids=f.token_ids,
                    text=own.text(f.token_ids),
                    score=self._last_partial(p, f.candidate_id) if rejected else self.final[p].get(f.candidate_id),
                    finished=not rejected,
                    stop_reason=f.reason,
                    rejected_at_round=len(self.partial[p][f.candidate_id]) - 1 if f.reason == "rejected" else None,
                    parent=parent,
                    forked_round=rnd,
                    confidence=own.winner.confidence(f.top_logprobs)
                    if own.winner.top_logprobs and not rejected
                    else None,
                )
            )
        choice = own.winner.choose([c for c in cands if c.finished])
        return PromptResult(
            prompt_index=self.prompts[p].index,
            prompt=self.prompts[p].text,
            best=choice.best,
            n_start=self.n_of[p],
            rounds=self.rounds[p],
            candidates=cands if own.all_candidates else None,
            compute=compute,
            policy=own.policy,
            reward=own.reward,
            winner=choice.rule,
            answer=choice.answer,
            gold_answer=self.prompts[p].gold_answer,
            meta=self.prompts[p].meta,
            stopped_at=self.stopped_at.get(p),
        )
