"""``scripts/serve_bench_judged.py``: every server's answers judged client-side, each server's mean and SR's
differences paired over the requests every server answered."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.experiments.bench import serve_bench_judged
from rodeco.rejudge import judges_by_name


def record(i: int, text: str | None) -> dict:
    return {"i": i, "prompt_index": 10 + i, "ok": text is not None, "server": {"text": text} if text else {}}


def test_each_server_is_judged_and_sr_is_paired_with_the_others():
    sbj = serve_bench_judged
    texts = {"sr": ["aaaa", "bb", "cccccc"], "bon": ["a", "bbb", "cc"], "vllm": ["aa", None, "c"]}  # vLLM failed once
    doc = {"servers": {s: {"records": [record(i, t) for i, t in enumerate(ts)]} for s, ts in texts.items()}}
    judged = sbj.judge_servers(
        doc, {10 + i: f"prompt {i}" for i in range(3)}, judges_by_name(["custom"], "logprob"), resamples=200
    )  # custom: the length
    assert judged["paired_requests"] == 2 and judged["scores"]["custom"]["vllm"] == [2.0, None, 1.0]
    fig = judged["figures"]["custom"]
    assert fig["sr"]["mean"] == pytest.approx(np.mean([4, 6])) and fig["vllm"]["mean"] == pytest.approx(1.5)
    assert fig["sr_minus_vllm"]["mean"] == pytest.approx(np.mean([4 - 2, 6 - 1]))
    assert fig["sr_minus_bon"]["mean"] == pytest.approx(np.mean([4 - 1, 6 - 2]))
    assert fig["sr_minus_vllm"]["ci"][0] <= fig["sr_minus_vllm"]["mean"] <= fig["sr_minus_vllm"]["ci"][1]
    assert any(x.startswith("judge_custom_sr_minus_vllm: +3.5000 [") for x in judged["lines"])
    assert judged["cost"]["custom"]["calls"] == 3  # one call per prompt, every server's answer together
