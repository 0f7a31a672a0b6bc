"""Phase times on CUDA wait for the GPU: ``torch.cuda.synchronize`` before the clock is read, at both ends of each
phase, on every CUDA device holding the generator's layers; a CPU run calls no ``torch.cuda`` function. The device
is faked: ``torch.cuda.synchronize`` is replaced by a recorder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import run_tiny

from rodeco.core import accounting
from rodeco.core.accounting import Accounting


@pytest.fixture()
def events(monkeypatch) -> list[str]:
    """What happened, in order: ``sync:<device>`` for each synchronize, ``clock`` for each clock read."""
    seen: list[str] = []
    ticks = iter(range(100))

    def clock() -> float:
        seen.append("clock")
        return float(next(ticks))

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(f"sync:{device}"))
    monkeypatch.setattr(accounting.time, "perf_counter", clock)
    return seen


def fake_gen(device: str, layers: dict[str, int]) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device), layer_devices=lambda: layers)


def test_a_phase_on_cuda_synchronizes_before_each_clock_read(events):
    acct = Accounting(fake_gen("cuda:0", {"cuda:0": 30}), 1)
    with acct.timed("decode"):
        events.append("work")
    assert events == ["sync:cuda:0", "clock", "work", "sync:cuda:0", "clock"]
    assert acct.times["decode"] == 1.0  # the two clock reads, 0 and 1


def test_a_model_spread_over_devices_synchronizes_each_of_them(events):
    acct = Accounting(fake_gen("cuda:0", {"cuda:0": 15, "cuda:1": 15, "cpu": 0}), 1)
    with acct.timed("prefill"):
        pass
    assert events == ["sync:cuda:0", "sync:cuda:1", "clock", "sync:cuda:0", "sync:cuda:1", "clock"]


def test_a_phase_on_cpu_calls_no_cuda_function(events):
    acct = Accounting(fake_gen("cpu", {"cpu": 30}), 1)
    with acct.timed("decode"):
        pass
    assert events == ["clock", "clock"]


def test_a_cpu_decode_never_synchronizes(tiny_gen, monkeypatch):
    def no_cuda(*a, **k):
        raise AssertionError("torch.cuda.synchronize called on a CPU run")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    out = run_tiny(tiny_gen(), ["write a haiku"], n=4, overrides=["budget.kv_tokens=50", "sampling.max_new_tokens=16"])
    assert out.results[0].rounds and out.compute.time_s["decode"] > 0
