"""``generator.compile`` on the paged engine: the step as one graph over the paged cache (``CompiledStep`` with
``paged``) gives the eager paged step's tokens in fp32, keeps Speculative Rejection's survivors Best-of-N's samples,
and compiles a bounded handful of graphs over rejections, admissions and copies."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import compare_survivors, run_tiny

from rodeco.core.generator import TorchGenerator
from rodeco.engines import native

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inductor_cache")]  # torch.compile

PROMPTS = ["Write a haiku about autumn.", "Name three primary colors.", "Say hi."]
MOST_GRAPHS = 6  # dynamo's 0/1 specializations, as for the fast engine's step


@pytest.fixture(scope="module")
def pair(tiny_model, tiny_tokenizer) -> tuple[TorchGenerator, TorchGenerator]:
    m = copy.deepcopy(tiny_model)
    return (
        TorchGenerator(m, tiny_tokenizer, engine="paged", name="tiny", compile="false"),
        TorchGenerator(m, tiny_tokenizer, engine="paged", name="tiny", compile="true"),
    )


def texts(out) -> list[list[list[int]]]:
    return [[c.token_ids for c in r.candidates] for r in out.results]


def test_the_compiled_paged_step_gives_the_eager_tokens_and_keeps_the_survivors(pair):
    eager, comp = pair
    assert comp.info.compiled and comp.compiled is not None and comp.compiled.paged and not comp.compiled.graphs
    assert comp.compiled.kernel == native.available("paged_attention")
    kw = dict(n=4, policy="none", overrides=["sampling.max_new_tokens=40", "budget=unlimited"])
    assert texts(run_tiny(eager, PROMPTS, **kw)) == texts(run_tiny(comp, PROMPTS, **kw))
    ov = ["sampling.max_new_tokens=40", "budget=cpu", "budget.kv_tokens=1100"]
    bon = run_tiny(comp, PROMPTS, n=8, policy="none", overrides=["sampling.max_new_tokens=40", "budget=unlimited"])
    sr = run_tiny(comp, PROMPTS, n=8, policy="fixed", overrides=ov)
    rejected, broken = compare_survivors(bon, sr)
    assert rejected > 0 and broken == 0
    assert 1 <= comp.compiled.compiles <= MOST_GRAPHS


def test_the_compiled_paged_step_writes_the_pools_in_place_through_admission_and_copies(pair):
    """Logits a step, compiled against eager, over a prefill, fan-out, rejection, an admission and copies mid-block:
    round-off apart; the same blocks; and what the compiled step wrote is in the engine's own pools."""
    eager, comp = pair
    engines = [g.new_engine() for g in (eager, comp)]
    ids = [eager.encode(p) for p in PROMPTS]
    L = max(map(len, ids))
    inp = torch.tensor([[0] * (L - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in ids])
    late = torch.tensor([eager.encode("Tell me a joke about cats.")])
    for e in engines:
        e.prefill(inp, mask)
        e.select(torch.arange(3).repeat_interleave(3))
    for s in range(30):
        if s == 8:
            for e in engines:
                e.select(torch.tensor([0, 2, 4, 5, 8]))
        if s == 12:
            for e in engines:
                e.admit(late, torch.ones_like(late))
                e.select(torch.tensor([0, 1, 2, 3, 4, 5, 5]))
        if s == 20:
            for e in engines:
                e.select(torch.tensor([0, 0, 3, 6, 6]))
        t = (torch.arange(engines[0].rows) * 7 + s) % 200 + 2
        a, b = (e.step(t) for e in engines)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"step {s}")
    used = torch.from_numpy(engines[0].blocks.tables[:, 0])  # every row's first block, written at prefill and on
    assert engines[1].blocks.tables.tolist() == engines[0].blocks.tables.tolist()
    last = engines[0].blocks.tables[range(engines[0].rows), (engines[0].blocks.lens - 1) // 16]  # this step's
    for li in range(len(engines[0].kpool)):  # what the compiled step wrote is in the engine's own pools
        for idx in (used, torch.from_numpy(last)):
            torch.testing.assert_close(engines[1].kpool[li][idx], engines[0].kpool[li][idx], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(engines[1].vpool[li][idx], engines[0].vpool[li][idx], rtol=1e-4, atol=1e-4)
