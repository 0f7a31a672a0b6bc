"""A decode step that waits for nothing on the host (off the CPU): the random numbers drawn on the device
(``rodeco.common.sampling.device_uniforms``, the same as numpy's ``uniforms`` bit for bit) and, on CUDA, the finished
rows counted one step late (``TorchSession.lag_finished``). On CPU both are forced on here; the GPU check runs a decode
under ``torch.cuda.set_sync_debug_mode("error")`` where a device is lent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rodeco
from rodeco.common.sampling import SamplingParams, device_uniforms, row_keys, uniforms
from rodeco.common.state import OpenPrompt, SessionSpec
from rodeco.core.session import TorchSession

# the ops that make the host wait for a device: a scalar read, a data-dependent shape
SYNCING = {"aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.item"}


class SyncOps(TorchDispatchMode):
    """Records the syncing ops dispatched while active (on CPU they wait for nothing, but on CUDA each would)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket._qualified_op_name).replace("::", ".")
        if name in SYNCING:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("trial", range(20))
def test_device_uniforms_are_numpys_bit_for_bit(trial):
    rng = np.random.default_rng(trial)
    B = int(rng.integers(1, 200))
    keys = row_keys(rng.integers(0, 2**40, size=B, dtype=np.uint64), rng.integers(0, 2**24, size=B, dtype=np.uint64))
    keys[::3] |= np.uint64(1 << 63)  # a copy's key has its top bit set: negative as int64
    step = int(rng.integers(0, 2**31))
    kt = torch.from_numpy(keys.view(np.int64))
    for seed in (0, 7, -3, 2**63 - 1, int(rng.integers(0, 2**62))):
        assert np.array_equal(device_uniforms(seed, kt, step).numpy(), uniforms(seed, keys, step))
    seeds = rng.integers(-(2**63), 2**63 - 1, size=B, dtype=np.int64)  # one per row (a server's requests)
    assert np.array_equal(device_uniforms(torch.from_numpy(seeds), kt, step).numpy(), uniforms(seeds, keys, step))


def _session(gen, on_device: bool, n: int = 4, max_new: int = 24, ignore_eos: bool = False) -> TorchSession:
    s = gen.open_session(SessionSpec(ignore_eos=ignore_eos, needs_logprobs=True))
    s.device_uniforms = s.lag_finished = on_device
    if not ignore_eos:  # one token in 16 ends a row: rows finish, at different steps
        s.eos = torch.arange(0, gen.model.config.vocab_size, 16)
    return s


def _prompts(n: int, max_new: int) -> list[OpenPrompt]:
    return [OpenPrompt(n, max_new, SamplingParams(1.0, 50, 1.0), 5, k) for k in (0, 1)]


def _rows(rows):
    return sorted((r.prompt, r.candidate_id, tuple(r.token_ids), r.reason, r.stop, tuple(r.logprobs)) for r in rows)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_lagged_count_and_device_draws_give_the_same_rows(tiny_gen, engine):
    gen = tiny_gen(engine)
    out = {}
    for on in (False, True):
        s = _session(gen, on)
        s.admit([gen.encode("hello there"), gen.encode("a longer prompt than that")], _prompts(n=4, max_new=24))
        rows = s.decode(8)
        rows += s.retire_finished()
        assert s.rows >= 2
        rows += s.reject([0, s.rows - 1])  # a selection midway: the lagged count and the drawn keys start again
        rows += s.decode(24)
        out[on] = (_rows(rows), s.stats.decode_tokens.copy())
    if engine == "fast":  # its linears' rows do not depend on the batch: the same rows, bit for bit
        assert out[True][0] == out[False][0]
    else:  # transformers' linears may round a row otherwise when a finished row stays a step: same tokens, logprobs
        assert [r[:5] for r in out[True][0]] == [r[:5] for r in out[False][0]]  # to round-off
        assert all(a[5] == pytest.approx(b[5], abs=1e-5) for a, b in zip(out[True][0], out[False][0]))
    assert any(r[3] == "eos" for r in out[True][0]) and any(r[3] == "rejected" for r in out[True][0])
    # a finished row leaves a step later: it is charged that step's token, no more than one per row and decode
    extra = out[True][1] - out[False][1]
    assert (extra >= 0).all() and extra.sum() <= 2 * 8


def test_speculative_rejection_is_the_same_with_device_draws_and_the_lagged_count(tiny_gen, monkeypatch):
    gen = tiny_gen("fast")
    args = dict(
        generator=gen,
        n=8,
        policy="fixed",
        seed=4,
        overrides=[
            "reward=logprob",
            "sampling.max_new_tokens=20",
            "output.all_candidates=true",
            "policy.alpha=0.5",
            "budget.kv_tokens=300",
        ],
    )
    ref = rodeco.decode(["write a haiku", "give three tips"], **args)
    init = TorchSession.__init__

    def on_device(self, *a, **kw):
        init(self, *a, **kw)
        self.device_uniforms = self.lag_finished = True

    monkeypatch.setattr(TorchSession, "__init__", on_device)
    got = rodeco.decode(["write a haiku", "give three tips"], **args)
    assert any(r.rounds for r in ref.results)
    assert [x.to_dict()["candidates"] for x in got.results] == [x.to_dict()["candidates"] for x in ref.results]


def test_a_steady_step_reads_nothing_back(tiny_gen):
    """Between selections, a fast engine's step with the device draws and the lagged count dispatches no op that
    waits for the device; the exact count (CPU's) reads one scalar a step, which the detector sees. (The hf engine's
    step reads one of its own: transformers' mask checks its padding with ``all()``.)"""
    gen = tiny_gen("fast")
    seen = {}
    for on in (False, True):
        s = _session(gen, on, ignore_eos=True)
        s.admit([gen.encode("hello there"), gen.encode("a longer prompt than that")], _prompts(n=4, max_new=24))
        s.decode(16, pause=4)  # the cache sized and the draw keys uploaded
        with SyncOps() as ops:
            s.decode(16, pause=12)
        seen[on] = ops.seen
    assert seen[True] == []
    assert len(seen[False]) >= 8 and set(seen[False]) <= SYNCING
