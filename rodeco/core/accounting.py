"""Compute accounting of one batch: generator tokens and FLOPs (from the session's counts), each scoring role's
tokens, FLOPs, calls and time (the ``reward`` that scores finished rows, the ``partial_reward`` that scores active
rows at decision points; one scorer may play both), wall time per phase, peak KV memory.

On CUDA, kernels run asynchronously: a phase's clock is read only after ``torch.cuda.synchronize`` on every CUDA
device that holds the generator's layers, at both ends, so the phase is charged the GPU work it queued. On CPU no
``torch.cuda`` function is called."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from rodeco.common.hardware import cuda_devices, synchronize
from rodeco.common.protocols import LanguageModel
from rodeco.common.state import Compute, SessionStats

ROLES = ("reward", "partial_reward")
PHASE = {"reward": "score", "partial_reward": "partial_score"}  # the time_s key of each role's scoring


class Accounting:
    """A batch's tallies. A prompt's share (``prompt``) is, by default, the batch's totals in proportion to its
    tokens and requests; with ``per_call`` (an open batch, whose prompts come and go) each phase and scoring call is
    charged to the prompts in it as it happens: a call's tokens, FLOPs and time by their requests in it, a decode
    stretch's time by their rows, so a prompt's figures are its own whatever ran before or beside it."""

    def __init__(self, gen: LanguageModel, n_prompts: int, per_call: bool = False) -> None:
        self.gen, self.n_prompts, self.per_call = gen, n_prompts, per_call
        self.sync = cuda_devices(gen.device, gen.layer_devices)  # [] on CPU
        self.times: dict[str, float] = {}
        self.requests = {r: np.zeros(n_prompts) for r in ROLES}  # requests scored per prompt, per role
        self.cost = {r: np.zeros(3) for r in ROLES}  # tokens, FLOPs, calls spent in each role
        self.own_cost = {r: np.zeros((n_prompts, 3)) for r in ROLES}  # per_call: each prompt's, per role
        self.own_time: dict[str, np.ndarray] = {}  # per_call: each prompt's seconds, per phase

    def admit(self, prompts: int) -> None:
        """Prompts that joined the batch (an open source's): their tallies start at zero."""
        self.n_prompts += prompts
        self.requests = {r: np.append(v, np.zeros(prompts)) for r, v in self.requests.items()}
        self.own_cost = {r: np.concatenate([v, np.zeros((prompts, 3))]) for r, v in self.own_cost.items()}
        self.own_time = {k: np.append(v, np.zeros(prompts)) for k, v in self.own_time.items()}

    @contextmanager
    def timed(self, phase: str, weights: np.ndarray | None = None) -> Iterator[None]:
        """Time a phase; ``weights`` (per prompt, ``per_call``): how its time is split among the prompts."""
        synchronize(self.sync)  # work queued before the phase is not the phase's
        t0 = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.sync)  # the phase's own GPU work is done before the clock is read
            self.add_time(phase, time.perf_counter() - t0, weights)

    def add_time(self, phase: str, dt: float, weights: np.ndarray | None = None) -> None:
        """``dt`` seconds more of ``phase``, split among the prompts by ``weights`` (``per_call``; None: the batch's
        total only)."""
        self.times[phase] = self.times.get(phase, 0.0) + dt
        if self.per_call and weights is not None and weights.sum() > 0:
            own = self.own_time.setdefault(phase, np.zeros(self.n_prompts))
            own[: len(weights)] += dt * weights / weights.sum()

    def charge(self, role: str, prompts: list[int], cost: np.ndarray, seconds: float) -> None:
        """Charge one scorer call to ``role`` (``rodeco.core.scoring``): what its scorer's tally grew by (tokens,
        FLOPs, calls), its seconds, and its requests, by prompt (``prompts``: each request's batch key)."""
        w = np.bincount(np.asarray(prompts, dtype=np.int64), minlength=self.n_prompts).astype(float)
        self.add_time(PHASE[role], seconds, w)
        self.cost[role] += cost
        np.add.at(self.requests[role], prompts, 1)
        if self.per_call and w.sum() > 0:  # tokens and FLOPs by requests; a call counts once for each prompt in it
            self.own_cost[role][:, :2] += np.outer(w / w.sum(), cost[:2])
            self.own_cost[role][:, 2] += (w > 0) * cost[2]

    def prompt(self, p: int, st: SessionStats) -> Compute:
        """Prompt ``p``'s share of the batch so far: its own tokens, and time and reward cost in proportion (with
        ``per_call``, what was charged to it)."""
        if self.per_call:
            times = {k: float(v[p]) for k, v in self.own_time.items()}
            cost = {r: self.own_cost[r][p] for r in ROLES}
            return self._build(st, [p], {"all": 1.0, "partial_reward": 1.0}, times, cost)
        tok_share = st.decode_tokens[p] / max(1, st.decode_tokens.sum())
        req = sum(self.requests.values(), np.zeros(self.n_prompts))
        share = {r: self.requests[r][p] / max(1, self.requests[r].sum()) for r in ROLES}
        share["all"] = req[p] / max(1, req.sum())
        times = {
            k: v
            * (
                share["reward"]
                if k == "score"
                else share["partial_reward"]
                if k == "partial_score"
                else tok_share
                if k == "decode"
                else 1 / self.n_prompts
            )
            for k, v in self.times.items()
        }
        return self._build(st, [p], share, times)

    def batch(self, st: SessionStats) -> Compute:
        """The whole batch's compute (exact totals, not shares)."""
        return self._build(st, list(range(self.n_prompts)), {"all": 1.0, "partial_reward": 1.0}, dict(self.times))

    def _build(
        self,
        st: SessionStats,
        prompts: list[int],
        share: dict[str, float],
        times: dict[str, float],
        cost: dict[str, np.ndarray] | None = None,
    ) -> Compute:
        cost = self.cost if cost is None else cost
        total, part = sum(cost.values(), np.zeros(3)), cost["partial_reward"]
        prefill_flops = sum(st.prefill_tokens[p] * self.gen.flops_per_token(st.prefill_tokens[p] // 2) for p in prompts)
        return Compute(
            gen_prefill_tokens=int(st.prefill_tokens[prompts].sum()),
            gen_decode_tokens=int(st.decode_tokens[prompts].sum()),
            gen_flops=float(prefill_flops + st.decode_flops[prompts].sum()),
            reward_tokens=int(total[0] * share["all"]),
            reward_flops=float(total[1] * share["all"]),
            reward_calls=int(total[2]),
            partial_reward_tokens=int(part[0] * share["partial_reward"]),
            partial_reward_flops=float(part[1] * share["partial_reward"]),
            partial_reward_calls=int(part[2]),
            peak_kv_bytes=st.peak_kv_bytes,
            peak_kv_tokens=st.peak_kv_tokens,
            decode_steps=st.steps,
            preemptions=st.preemptions,
            time_s=times,
        )
