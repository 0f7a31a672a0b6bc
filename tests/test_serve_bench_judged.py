"""``scripts/serve_bench_judged.py``: every server's answers judged client-side, each server's mean and SR's
differences paired over the requests every server answered."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.core.data import Prompt
from rodeco.experiments.bench import serve_bench_judged
from rodeco.rejudge import judges_by_name


def record(i: int, text: str | None) -> dict:
    return {"i": i, "prompt_index": 10 + i, "ok": text is not None, "server": {"text": text} if text else {}}


def test_each_server_is_judged_and_sr_is_paired_with_the_others():
    sbj = serve_bench_judged
    texts = {"sr": ["aaaa", "bb", "cccccc"], "bon": ["a", "bbb", "cc"], "vllm": ["aa", None, "c"]}  # vLLM failed once
    doc = {"servers": {s: {"records": [record(i, t) for i, t in enumerate(ts)]} for s, ts in texts.items()}}
    prompts = {10 + i: Prompt(10 + i, f"prompt {i}") for i in range(3)}
    judged = sbj.judge_servers(doc, prompts, judges_by_name(["custom"], "logprob"), resamples=200)  # custom: length
    assert judged["paired_requests"] == 2 and judged["scores"]["custom"]["vllm"] == [2.0, None, 1.0]
    fig = judged["figures"]["custom"]
    assert fig["sr"]["mean"] == pytest.approx(np.mean([4, 6])) and fig["vllm"]["mean"] == pytest.approx(1.5)
    assert fig["sr_minus_vllm"]["mean"] == pytest.approx(np.mean([4 - 2, 6 - 1]))
    assert fig["sr_minus_bon"]["mean"] == pytest.approx(np.mean([4 - 1, 6 - 2]))
    assert fig["sr_minus_vllm"]["ci"][0] <= fig["sr_minus_vllm"]["mean"] <= fig["sr_minus_vllm"]["ci"][1]
    assert any(x.startswith("judge_custom_sr_minus_vllm: +3.5000 [") for x in judged["lines"])
    assert judged["cost"]["custom"]["calls"] == 3  # one call per prompt, every server's answer together


def test_gold_problems_are_the_yardsticks_tasks_in_turn_and_the_gold_judge_checks_each_against_its_record():
    pytest.importorskip("reasoning_gym")
    from rodeco.experiments.bench.gold_tasks import CANDIDATES
    from rodeco.experiments.bench.serve_bench_prompts import load

    got = load("gold", 8)
    assert [p.index for p in got] == list(range(8)) and len({p.text for p in got}) == 8
    tasks = [p.meta["task"] for p in got]
    assert tasks[:4] == list(CANDIDATES) and tasks[4:] == list(CANDIDATES)  # the four tasks in turn
    assert [p.text for p in load("gold", 4)] == [p.text for p in got[:4]]  # the same problems however many
    answers = [f"The answer is {p.meta['gold_answer']}." for p in got[:3]]
    texts = {"sr": answers, "vllm": ["no idea", answers[1], "no idea"]}
    doc = {"servers": {s: {"records": [dict(record(i, t), prompt_index=i) for i, t in enumerate(ts)]}
                       for s, ts in texts.items()}}  # fmt: skip
    judged = serve_bench_judged.judge_servers(
        doc, {p.index: p for p in got[:3]}, judges_by_name(["gold"], "logprob"), resamples=100
    )
    assert judged["scores"]["gold"]["sr"] == [1.0, 1.0, 1.0] and judged["scores"]["gold"]["vllm"] == [0.0, 1.0, 0.0]
