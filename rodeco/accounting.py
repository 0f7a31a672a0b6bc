"""Compute accounting of one batch: generator tokens and FLOPs (from the session's counts), reward tokens, FLOPs
and calls (from the reward's own tally), wall time per phase, peak KV memory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from rodeco.contracts import Scorer
from rodeco.generator import Generator
from rodeco.session import SessionStats
from rodeco.state import Compute


class Accounting:
    def __init__(self, gen: Generator, scorer: Scorer, n_prompts: int) -> None:
        self.gen, self.scorer, self.n_prompts = gen, scorer, n_prompts
        self.times: dict[str, float] = {}
        self.reward_requests = np.zeros(n_prompts)  # requests scored per prompt
        c0 = scorer.cost()
        self.cost0, self.calls0 = (c0.tokens, c0.flops), scorer.calls  # the reward may outlive this batch

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t0

    def requested(self, prompts: list[int]) -> None:
        for p in prompts:
            self.reward_requests[p] += 1

    def prompt(self, p: int, st: SessionStats) -> Compute:
        """Prompt ``p``'s share of the batch so far: its own tokens, and time and reward cost in proportion."""
        tok_share = st.decode_tokens[p] / max(1, st.decode_tokens.sum())
        req_share = self.reward_requests[p] / max(1, self.reward_requests.sum())
        times = {k: v * (req_share if k == "score" else tok_share if k == "decode" else 1 / self.n_prompts)
                 for k, v in self.times.items()}
        return self._build(st, [p], req_share, times)

    def batch(self, st: SessionStats) -> Compute:
        """The whole batch's compute (exact totals, not shares)."""
        return self._build(st, list(range(self.n_prompts)), 1.0, dict(self.times))

    def _build(self, st: SessionStats, prompts: list[int], reward_share: float, times: dict[str, float]) -> Compute:
        c = self.scorer.cost()
        r_tokens, r_flops = c.tokens - self.cost0[0], c.flops - self.cost0[1]
        prefill_flops = sum(st.prefill_tokens[p] * self.gen.flops_per_token(st.prefill_tokens[p] // 2) for p in prompts)
        return Compute(
            gen_prefill_tokens=int(st.prefill_tokens[prompts].sum()),
            gen_decode_tokens=int(st.decode_tokens[prompts].sum()),
            gen_flops=float(prefill_flops + st.decode_flops[prompts].sum()),
            reward_tokens=int(r_tokens * reward_share), reward_flops=float(r_flops * reward_share),
            reward_calls=self.scorer.calls - self.calls0, peak_kv_bytes=st.peak_kv_bytes,
            peak_kv_tokens=st.peak_kv_tokens, decode_steps=st.steps, time_s=times)
