"""Rewards served from a pool (``rodeco.replays.pool``) for a replay (``rodeco.replays.replay``).

- ``PoolReward`` serves rewards from the pool's cache, computing what is missing on first use, and charges every
  request the tokens, FLOPs and seconds it cost when it was computed, as a live run would pay them.
- ``OracleReward`` (``partial_reward=oracle``) scores a partial response with its candidate's final reward: the
  ceiling a perfect decision-time scorer would reach with the same schedule and samples.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from rodeco.common.protocols import Reward, RewardCost
from rodeco.common.sampling import COPY_BIT
from rodeco.common.state import ScoreRequest
from rodeco.core.contracts import reward_cost, reward_info
from rodeco.replays.pool import Pool, check_top_k


class PoolReward:
    """A reward served from the pool's cache (``scores/<key>/``): each (prompt, candidate, length, partial) is
    computed once by ``reward``, on first use, and charged to every run that asks for it with the tokens, FLOPs and
    seconds it cost then (a call's cost is shared among its requests in proportion to their lengths)."""

    def __init__(self, pool: Pool, reward: Reward, key: str) -> None:
        self.pool, self.reward, self.key = pool, reward, key
        self.info = reward_info(reward)
        self.needs_logprobs, self.needs_hidden_states = self.info.needs_logprobs, self.info.needs_hidden_states
        self.needs_top_logprobs = self.info.needs_top_logprobs
        check_top_k(pool, self.needs_top_logprobs)
        self.cost = RewardCost()
        self.seconds = 0.0  # charged: what the requests served took when they were computed
        self.computed = 0  # requests computed (cache misses)
        self._entries: dict[int, dict[str, list[float]]] = {}
        self._dirty: set[int] = set()

    @property
    def identity(self) -> str | None:
        return self.info.identity

    def entries(self, index: int) -> dict[str, list[float]]:
        if index not in self._entries:
            self._entries[index] = self.pool.scores(self.key, index)
        return self._entries[index]

    @staticmethod
    def _key(r: ScoreRequest) -> str:
        """A starting candidate by its id (as before copies existed), a copy by its stream, which names its
        lineage under any policy (its id is only the next free one of its run)."""
        who = f"s{r.stream}" if r.stream is not None and r.stream & COPY_BIT else str(r.candidate_id)
        return f"{who}:{len(r.response_ids)}:{int(r.partial)}"

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        miss = [r for r in requests if self._key(r) not in self.entries(r.prompt_index)]
        if miss:
            self._compute(list({(r.prompt_index, self._key(r)): r for r in miss}.values()))
        out = []
        for r in requests:
            score, tokens, flops, seconds = self.entries(r.prompt_index)[self._key(r)]
            self.cost.tokens += tokens
            self.cost.flops += flops
            self.seconds += seconds
            out.append(score)
        self.cost.calls += 1
        return out

    def final_score(self, index: int, candidate: int, stream: int | None = None) -> float:
        """Candidate ``candidate``'s final reward (a copy's, by its ``stream``: its stored continuation's), computed
        on first use, charged to no one."""
        p = self.pool.prompt(index)
        if stream is not None and stream & COPY_BIT:
            c = self.pool.continuations(index)[str(stream)]
            req = ScoreRequest(
                p.text,
                c["text"],
                tuple(c["tokens"]),
                partial=False,
                prompt_index=index,
                candidate_id=candidate,
                logprobs=tuple(c["logprobs"]),
                stream=stream,
                top_logprobs=tuple(map(tuple, c["top_logprobs"])) if c.get("top_logprobs") else None,
                meta=p.meta,
            )
        else:
            req = p.request(candidate)
        if self._key(req) not in self.entries(index):
            self._compute([req])
        return self.entries(index)[self._key(req)][0]

    def _compute(self, reqs: list[ScoreRequest]) -> None:
        cost = reward_cost(self.reward)
        t0, f0 = (cost.tokens, cost.flops) if cost is not None else (0, 0.0)
        start = time.perf_counter()
        scores = list(self.reward.score(reqs))
        seconds = time.perf_counter() - start
        t1, f1 = (cost.tokens, cost.flops) if cost is not None else (0, 0.0)
        weights = np.array([len(r.response_ids) + 1 for r in reqs], dtype=np.float64)
        share = weights / weights.sum()
        for r, sc, w in zip(reqs, scores, share):
            self.entries(r.prompt_index)[self._key(r)] = [float(sc), (t1 - t0) * w, (f1 - f0) * w, seconds * w]
            self._dirty.add(r.prompt_index)
        self.computed += len(reqs)

    def save(self) -> None:
        for index in sorted(self._dirty):
            self.pool.write_scores(self.key, index, self._entries[index])
        self._dirty.clear()


class OracleReward:
    """``partial_reward=oracle``: each partial response scored with its candidate's final reward under ``final``,
    and charged what ``final`` costs on the partial response (what ``partial_reward=same`` pays), so that oracle
    rows differ from ``same`` rows only in what they decide."""

    identity = None

    def __init__(self, final: PoolReward) -> None:
        self.final = final
        self.cost = final.cost  # one tally: charging a partial request goes through the final reward's cache

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.final.score(requests)  # the charge
        return [self.final.final_score(r.prompt_index, r.candidate_id, r.stream) for r in requests]
