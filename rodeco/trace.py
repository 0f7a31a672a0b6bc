"""Per-prompt bookkeeping of one batch: scores by round, finished candidates, results and their compute."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rodeco.state import Candidate, Compute, PromptResult, Round, RoundView, ScoreRequest

if TYPE_CHECKING:
    from rodeco.generator import Generator, Session
    from rodeco.loop import LoopSettings
    from rodeco.scoring import Scorer


class Tracker:
    def __init__(self, gen: Generator, scorer: Scorer, prompts: list[tuple[int, str]], sess: Session,
                 s: LoopSettings, n: int, on_done: Callable | None) -> None:
        self.gen, self.scorer, self.prompts, self.sess, self.s, self.n = gen, scorer, prompts, sess, s, n
        self.on_done = on_done
        P = len(prompts)
        self.partial: list[dict[int, list[float]]] = [{} for _ in range(P)]  # cand -> score per round
        self.final: list[dict[int, float]] = [{} for _ in range(P)]
        self.rounds: list[list[Round]] = [[] for _ in range(P)]
        self.scored_done = 0  # how many of sess.done have been handled
        self.emitted: set[int] = set()
        self.out: dict[int, PromptResult] = {}
        self.times: dict[str, float] = {}
        self.reward_requests = np.zeros(P)
        c0 = scorer.cost()
        self.cost0, self.calls0 = (c0.tokens, c0.flops), scorer.calls  # the reward may outlive this batch

    def time(self, phase: str, t0: float) -> None:
        self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t0

    def _score(self, items: list[tuple[int, int, list[int], list[float] | None]], partial: bool) -> np.ndarray:
        t0 = time.perf_counter()
        reqs = [ScoreRequest(prompt=self.prompts[p][1], response=self.gen.decode_text(ids), response_ids=tuple(ids),
                             partial=partial, prompt_index=self.prompts[p][0], candidate_id=c,
                             logprobs=tuple(lp) if lp is not None else None) for p, c, ids, lp in items]
        scores = self.scorer(reqs)
        for p, *_ in items:
            self.reward_requests[p] += 1
        self.time("score", t0)
        return scores

    def score_finished(self) -> None:
        new = [f for f in self.sess.done[self.scored_done:] if f.reason != "rejected"]
        self.scored_done = len(self.sess.done)
        scores = self._score([(f.prompt, f.candidate_id, f.token_ids, f.logprobs) for f in new], partial=False)
        for f, sc in zip(new, scores):
            self.final[f.prompt][f.candidate_id] = float(sc)
        self.emit_done()

    def score_active(self) -> np.ndarray:
        scores = self._score(self.sess.active(), partial=True)
        for p, c, sc in zip(self.sess.prompt_of, self.sess.cand, scores):
            self.partial[p].setdefault(int(c), []).append(float(sc))
        return scores

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

    def local(self, prompt_index: int) -> int:
        return next(i for i, (idx, _) in enumerate(self.prompts) if idx == prompt_index)

    def record_round(self, view: RoundView, keep: list[list[int]]) -> None:
        for pv, kept in zip(view.prompts, keep):
            ids = pv.candidate_ids
            kept_ids = [ids[i] for i in kept]
            self.rounds[self.local(pv.prompt_index)].append(Round(
                round=view.round, tokens_generated=pv.tokens_generated, rows_before=pv.k, rows_kept=len(kept),
                kept_ids=kept_ids, rejected_ids=[c for c in ids if c not in set(kept_ids)],
                scores={c: float(sc) for c, sc in zip(ids, pv.scores)}, min_reject=pv.min_reject))

    def emit_done(self) -> None:
        """Build and hand out the result of every prompt that has no active row left."""
        active = set(self.sess.prompt_of.tolist())
        for p in range(len(self.prompts)):
            if p not in active and p not in self.emitted and p not in self._pending_scores():
                self.emitted.add(p)
                self.out[p] = self._result(p)
                if self.on_done is not None:
                    self.on_done(self.out[p])

    def _pending_scores(self) -> set[int]:
        return {f.prompt for f in self.sess.done[self.scored_done:]}

    def _result(self, p: int) -> PromptResult:
        cands = []
        for f in (f for f in self.sess.done if f.prompt == p):
            score = self.final[p].get(f.candidate_id) if f.reason != "rejected" else self.partial[p][f.candidate_id][-1]
            cands.append(Candidate(candidate_id=f.candidate_id, token_ids=f.token_ids,
                                   text=self.gen.decode_text(f.token_ids), score=score, finished=f.reason != "rejected",
                                   rejected_at_round=len(self.partial[p][f.candidate_id]) - 1
                                   if f.reason == "rejected" else None, stop_reason=f.reason))
        best = max((c for c in cands if c.finished), key=lambda c: c.score)
        return PromptResult(prompt_index=self.prompts[p][0], prompt=self.prompts[p][1], best=best, n_start=self.n,
                            rounds=self.rounds[p], candidates=cands if self.s.all_candidates else None,
                            compute=self._compute(p), policy=self.s.policy_name, reward=self.s.reward_name)

    def _compute(self, p: int) -> Compute:
        """Prompt ``p``'s share of the batch: its own tokens, and time and reward cost in proportion."""
        st = self.sess.stats
        tok_share = st.decode_tokens[p] / max(1, st.decode_tokens.sum())
        req_share = self.reward_requests[p] / max(1, self.reward_requests.sum())
        times = {k: v * (req_share if k == "score" else tok_share if k == "decode" else 1 / len(self.prompts))
                 for k, v in self.times.items()}
        return self._build([p], req_share, times)

    def batch_compute(self) -> Compute:
        """The whole batch's compute (exact totals, not shares)."""
        return self._build(list(range(len(self.prompts))), 1.0, dict(self.times))

    def _build(self, prompts: list[int], reward_share: float, times: dict[str, float]) -> Compute:
        st = self.sess.stats
        c = self.scorer.cost()
        r_tokens, r_flops = c.tokens - self.cost0[0], c.flops - self.cost0[1]  # the reward may outlive this batch
        prefill_flops = sum(st.prefill_tokens[p] * self.gen.flops_per_token(st.prefill_tokens[p] // 2) for p in prompts)
        return Compute(
            gen_prefill_tokens=int(st.prefill_tokens[prompts].sum()),
            gen_decode_tokens=int(st.decode_tokens[prompts].sum()),
            gen_flops=float(prefill_flops + st.decode_flops[prompts].sum()),
            reward_tokens=int(r_tokens * reward_share), reward_flops=float(r_flops * reward_share),
            reward_calls=self.scorer.calls - self.calls0, peak_kv_bytes=st.peak_kv_bytes,
            peak_kv_tokens=st.peak_kv_tokens, decode_steps=st.steps, time_s=times)

    def results(self) -> list[PromptResult]:
        self.emit_done()
        return [self.out[p] for p in range(len(self.prompts))]
