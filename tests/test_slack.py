"""Admission by latency slack (``rodeco.serve.slack``): the step-time model, its fit, the plan of the batch's future,
and the decision to accept a job or refuse it with the seconds until it could start."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rodeco.serve.slack import Limits, StepModel, StepTimes, Work, plan, simulate

MODEL = StepModel(a=0.01, b=0.001, c=1e-6)  # 10 ms a step, 1 ms a row, 1 us a row's cached token


def test_the_fit_recovers_the_model_from_noisy_steps_and_keeps_coefficients_at_zero_or_above():
    rng = np.random.default_rng(0)
    rows = rng.integers(1, 64, 400)
    ctx = rng.integers(10, 600, 400).astype(float)
    exact = np.array([MODEL.seconds(int(r), float(x)) for r, x in zip(rows, ctx)])
    secs = exact * (1 + 0.02 * rng.standard_normal(400))
    m = StepModel.fit(rows, ctx, secs)
    assert m.a == pytest.approx(MODEL.a, rel=0.15) and m.b == pytest.approx(MODEL.b, rel=0.05)
    assert m.c == pytest.approx(MODEL.c, rel=0.2)
    # a few steps stalled by something else (another process, the garbage collector) do not move it
    stalled = secs.copy()
    stalled[::40] += 1.0
    m = StepModel.fit(rows, ctx, stalled)
    assert m.a == pytest.approx(MODEL.a, rel=0.15) and m.b == pytest.approx(MODEL.b, rel=0.05)
    # steps that grow cheaper with rows: the negative coefficient is dropped, the rest refitted
    m = StepModel.fit([1, 2, 4, 8], [10, 10, 10, 10], [0.04, 0.03, 0.02, 0.01])
    assert min(m.a, m.b, m.c) >= 0 and m.b == 0
    with pytest.raises(ValueError, match="at least one"):
        StepModel.fit([], [], [])


def test_run_seconds_is_the_sum_of_its_steps_with_the_cache_growing():
    steps = sum(MODEL.seconds(16, 100 + k) for k in range(40))
    assert MODEL.run_seconds(16, 100, 40) == pytest.approx(steps)


def test_step_times_refit_as_steps_arrive_and_keep_a_window():
    times = StepTimes(StepModel(1.0, 0.0, 0.0), window=100, refit_every=50)
    times.add([8] * 49, [50.0] * 49, [0.02] * 49)
    assert times.model.a == 1.0  # not yet refitted
    times.add([16] * 60, [50.0] * 60, [0.03] * 60)
    assert times.model.seconds(8, 50) < 0.1 and len(times.seconds) == 100


def test_jobs_decode_together_and_a_queued_one_starts_when_its_memory_fits():
    a = Work(rows=4, context=10, steps_left=80, reserved=400, deadline=10)
    b = Work(rows=4, context=10, steps_left=40, reserved=400, deadline=10)
    q = Work(rows=4, context=10, steps_left=40, reserved=400, deadline=10, running=False)
    (sa, fa), (sb, fb), (sq, fq) = simulate([a, b, q], MODEL, Limits(kv_tokens=800))
    assert sa == sb == 0 and fb < fa  # b leaves first, and q takes its room then
    assert sq == pytest.approx(fb) and fq > sq
    alone = simulate([a], MODEL, Limits(kv_tokens=800))[0][1]
    assert alone < fa  # company makes each step slower
    # with room for all three, q starts at once
    assert simulate([a, b, q], MODEL, Limits())[2][0] == 0
    # a reservation above the pool never starts
    assert simulate([dataclass_replace(q, reserved=900)], MODEL, Limits(kv_tokens=800)) == [(math.inf, math.inf)]


def dataclass_replace(w: Work, **kw) -> Work:
    import dataclasses

    return dataclasses.replace(w, **kw)


def test_a_job_is_accepted_when_it_meets_its_deadline_and_harms_no_one():
    running = [Work(rows=8, context=20, steps_left=100, reserved=1000, deadline=5.0)]
    new = Work(rows=8, context=20, steps_left=100, reserved=1000, deadline=5.0)
    d = plan(running, new, MODEL, Limits(kv_tokens=4000))
    assert d.accept and d.start == 0 and 0 < d.finish <= 5.0 and d.retry_after == 0


def test_a_job_that_would_push_another_past_its_deadline_is_refused_with_when_it_could_start():
    alone = simulate([Work(rows=8, context=20, steps_left=100, reserved=1000, deadline=9)], MODEL, Limits())[0][1]
    tight = Work(rows=8, context=20, steps_left=100, reserved=1000, deadline=alone * 1.05)  # little slack
    new = Work(rows=32, context=20, steps_left=100, reserved=1000, deadline=100.0)
    d = plan([tight], new, MODEL, Limits(kv_tokens=4000))
    assert not d.accept and d.retry_after == pytest.approx(alone, rel=0.05)  # once the tight job has left
    # a job already late is not made later, but one the plan has late anyway may not stop others either
    late = Work(rows=8, context=20, steps_left=100, reserved=1000, deadline=alone * 0.5)
    assert not plan([late], new, MODEL, Limits(kv_tokens=4000)).accept


def test_a_job_that_cannot_meet_its_own_target_is_refused_and_one_that_never_can_waits_forever():
    running = [Work(rows=8, context=20, steps_left=400, reserved=3000, deadline=100.0)]
    new = Work(rows=8, context=20, steps_left=100, reserved=2000, deadline=2.5)  # ~1.9 s alone, but queued
    d = plan(running, new, MODEL, Limits(kv_tokens=4000))
    assert not d.accept and d.start > 0 and math.isfinite(d.retry_after) and d.retry_after >= d.start * 0.99
    never = Work(rows=8, context=20, steps_left=100, reserved=2000, deadline=1e-3)  # shorter than its own decode
    assert plan([], never, MODEL, Limits(kv_tokens=4000)).retry_after == math.inf


def test_the_start_up_fit_measures_the_engine_at_several_row_counts(tiny_gen):
    from rodeco.serve.slack import measure_steps

    m = measure_steps(tiny_gen(), rows=(1, 4, 16), steps=12)
    assert min(m.a, m.b, m.c) >= 0 and m.seconds(16, 20) > 0
    assert m.seconds(16, 20) >= m.seconds(1, 20)  # more rows never cost less


def test_the_plan_keeps_the_loops_bounds_on_jobs_and_rows_at_once():
    jobs = [Work(rows=8, context=10, steps_left=40, reserved=10, deadline=99, running=False) for _ in range(3)]
    free = simulate(jobs, MODEL, Limits())
    assert [s for s, _ in free] == [0, 0, 0]
    two = simulate(jobs, MODEL, Limits(max_jobs=2))
    assert two[0][0] == two[1][0] == 0 and two[2][0] == pytest.approx(min(two[0][1], two[1][1]))
    rows = simulate(jobs, MODEL, Limits(max_rows=16))  # room for two jobs' 8 rows
    assert [s for s, _ in rows] == [s for s, _ in two]
    assert simulate([dataclass_replace(jobs[0], rows=17)], MODEL, Limits(max_rows=16)) == [(math.inf, math.inf)]


def test_a_refusal_at_a_full_queue_is_planned_well_within_two_seconds():
    import time

    running = [
        Work(rows=16, context=100 + 30 * i, steps_left=512 - 30 * i, reserved=2000, deadline=60) for i in range(16)
    ]
    queued = [Work(rows=16, context=100, steps_left=512, reserved=2000, deadline=60, running=False) for _ in range(64)]
    new = Work(rows=16, context=100, steps_left=512, reserved=2000, deadline=60)
    t0 = time.perf_counter()
    d = plan([*running, *queued], new, MODEL, Limits(kv_tokens=32_000, max_jobs=16, max_rows=512))
    assert not d.accept and time.perf_counter() - t0 < 1.0


def test_a_job_starts_the_most_rows_that_meet_its_target_and_never_fewer_than_its_floor():
    from rodeco.serve.slack import choose_rows

    running = [Work(rows=16, context=20, steps_left=100, reserved=1000, deadline=30.0)]
    wide = Work(rows=64, context=20, steps_left=100, reserved=1000, deadline=100.0)
    assert choose_rows(running, wide, 16, MODEL, Limits(kv_tokens=4000))[0] == 64  # room: all its rows
    alone = simulate([dataclass_replace(wide, rows=24)], MODEL, Limits())[0][1]
    tight = dataclass_replace(wide, deadline=alone * 1.01)  # 24 rows just fit alone, so at most 24 beside none
    rows, d = choose_rows([], tight, 16, MODEL, Limits(kv_tokens=4000))
    assert d.accept and rows == 24 and plan([], dataclass_replace(tight, rows=rows), MODEL, Limits()).accept
    assert not plan([], dataclass_replace(tight, rows=rows + 1), MODEL, Limits()).accept
    # below the floor it is refused, with the floor's retry time
    rows, d = choose_rows([], tight, 32, MODEL, Limits(kv_tokens=4000))
    assert rows == 32 and not d.accept
