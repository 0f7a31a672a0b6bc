"""What happened to one batch, recorded as it decodes: each candidate's partial scores by round, final scores,
every decision point, and the rows that left (finished or rejected). From these records it builds each
prompt's ``PromptResult``; it computes nothing of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rodeco.state import Candidate, Compute, PromptRef, PromptResult, Round, RoundView, Row


class Trace:
    """Keyed by batch key (the prompt's position in the batch) and candidate id."""

    def __init__(self, prompts: Sequence[PromptRef], n: int, decode_text: Callable[[list[int]], str], *,
                 all_candidates: bool = False, policy: str = "", reward: str = "") -> None:
        self.prompts, self.n, self.decode_text = prompts, n, decode_text
        self.all_candidates, self.policy, self.reward = all_candidates, policy, reward
        P = len(prompts)
        self.partial: list[dict[int, list[float]]] = [{} for _ in range(P)]  # candidate -> score per round
        self.final: list[dict[int, float]] = [{} for _ in range(P)]
        self.rounds: list[list[Round]] = [[] for _ in range(P)]
        self.left: list[Row] = []  # rows that left the batch, in the order they left
        self.emitted: set[int] = set()

    def finished(self, rows: Sequence[Row], scores: np.ndarray) -> None:
        """Rows that reached EOS or max_new_tokens, with their final rewards."""
        self.left += rows
        for f, sc in zip(rows, scores):
            self.final[f.prompt][f.candidate_id] = float(sc)

    def scored(self, prompt_of: Sequence[int], cands: Sequence[int], scores: np.ndarray) -> None:
        """This decision point's partial rewards of the active rows."""
        for p, c, sc in zip(prompt_of, cands, scores):
            self.partial[p].setdefault(int(c), []).append(float(sc))

    def rejected(self, rows: Sequence[Row]) -> None:
        self.left += rows

    def round(self, view: RoundView, keep: list[list[int]], keys: Sequence[int]) -> None:
        """A decision point: ``keys[j]`` is the batch key of ``view.prompts[j]``."""
        for pv, kept, p in zip(view.prompts, keep, keys):
            ids = pv.candidate_ids
            kept_ids = [ids[i] for i in kept]
            self.rounds[p].append(Round(
                round=view.round, tokens_generated=pv.tokens_generated, rows_before=pv.k, rows_kept=len(kept),
                kept_ids=kept_ids, rejected_ids=[c for c in ids if c not in set(kept_ids)],
                scores={c: float(sc) for c, sc in zip(ids, pv.scores)}, min_reject=pv.min_reject))

    def history(self, p: int, cands: list[int]) -> np.ndarray:
        """[k, r] earlier partial scores of these candidates (this round's score excluded)."""
        hist = [self.partial[p][c][:-1] for c in cands]
        r = max((len(h) for h in hist), default=0)
        out = np.full((len(cands), r), np.nan)
        for i, h in enumerate(hist):
            out[i, r - len(h):] = h
        return out

    def finished_scores(self, p: int) -> list[float]:
        return list(self.final[p].values())

    def newly_done(self, active: set[int]) -> list[int]:
        """Prompts with no active row left that were not reported yet (now marked reported)."""
        done = [p for p in range(len(self.prompts)) if p not in active and p not in self.emitted]
        self.emitted.update(done)
        return done

    def result(self, p: int, compute: Compute) -> PromptResult:
        cands = []
        for f in (f for f in self.left if f.prompt == p):
            rejected = f.reason == "rejected"
            cands.append(Candidate(
                candidate_id=f.candidate_id, token_ids=f.token_ids, text=self.decode_text(f.token_ids),
                score=self.partial[p][f.candidate_id][-1] if rejected else self.final[p].get(f.candidate_id),
                finished=not rejected, stop_reason=f.reason,
                rejected_at_round=len(self.partial[p][f.candidate_id]) - 1 if rejected else None))
        best = max((c for c in cands if c.finished), key=lambda c: c.score)
        return PromptResult(prompt_index=self.prompts[p].index, prompt=self.prompts[p].text, best=best, n_start=self.n,
                            rounds=self.rounds[p], candidates=cands if self.all_candidates else None,
                            compute=compute, policy=self.policy, reward=self.reward)
