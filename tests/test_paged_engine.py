"""The paged engine (``generator.engine=paged``): the fast engine's logits on a cache of shared, copy-on-write
blocks, each row's independent of the others, and rejection, fan-out and admission without cache copies."""

from __future__ import annotations

import pytest
import torch

from rodeco.engines.fast import FastLlamaEngine
from rodeco.engines.paged import BLOCK, PagedLlamaEngine


def left_padded(lens: list[int], vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    L = max(lens)
    ids = torch.randint(2, vocab, (len(lens), L), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lens):
        mask[i, L - n :] = 1
        ids[i, : L - n] = 0
    return ids, mask


def tokens(rows: int, vocab: int, step: int) -> torch.Tensor:
    return torch.randint(2, vocab, (rows,), generator=torch.Generator().manual_seed(100 + step))


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_the_paged_engine_gives_the_fast_engines_logits_through_fan_out_rejection_admission_and_copies(
    tiny_model, kernel
):
    V = tiny_model.config.vocab_size
    fast, paged = FastLlamaEngine(tiny_model), PagedLlamaEngine(tiny_model)
    if kernel and not paged.kernel:
        pytest.skip("rodeco's native kernels are not built here")
    paged.kernel = kernel
    ids, mask = left_padded([21, 7], V, 0)
    ops: list[tuple[str, object]] = [
        ("prefill", (ids, mask)),
        ("select", torch.tensor([0, 0, 0, 1, 1, 1])),
        *[("step", None)] * 12,
        ("select", torch.tensor([0, 2, 3, 5])),  # rejection
        *[("step", None)] * 6,
        ("admit", left_padded([37], V, 1)),
        ("select", torch.tensor([0, 1, 2, 3, 4, 4, 4])),
        *[("step", None)] * 5,
        ("select", torch.tensor([0, 0, 1, 4, 5, 5, 6])),  # copies mid-block (beam, particle filter)
        *[("step", None)] * 20,
    ]
    for i, (op, arg) in enumerate(ops):
        if op == "step":
            t = tokens(fast.rows, V, i)
            a, b = fast.step(t), paged.step(t)
        elif op == "select":
            assert isinstance(arg, torch.Tensor)
            fast.select(arg)
            paged.select(arg)
            continue
        else:
            a, b = getattr(fast, op)(*arg), getattr(paged, op)(*arg)  # type: ignore[misc]
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=f"op {i} ({op})")
    assert paged.rows == fast.rows == 7


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(tiny_model):
    """Bit for bit: one prompt's rows decoded alone and in a batch with another prompt's rows, more of them and
    longer (Speculative Rejection's survivors are Best-of-N's samples). The prompts are prefilled at one padded
    length, as a batch's are."""
    V = tiny_model.config.vocab_size
    alone, together = PagedLlamaEngine(tiny_model), PagedLlamaEngine(tiny_model)
    ids, mask = left_padded([9, 30], V, 2)
    alone.prefill(ids[:1], mask[:1])
    together.prefill(ids, mask)
    alone.select(torch.tensor([0, 0]))
    together.select(torch.tensor([0, 0, 1, 1, 1]))
    for s in range(20):
        t = tokens(together.rows, V, s)
        a, b = alone.step(t[:2]), together.step(t)
        assert torch.equal(a, b[:2]), f"step {s}"
        if s == 8:  # the other prompt's rows leave
            together.select(torch.tensor([0, 1, 3]))
            alone.select(torch.tensor([0, 1]))


def test_rejection_and_fan_out_copy_no_cache_and_free_blocks(tiny_model):
    V = tiny_model.config.vocab_size
    e = PagedLlamaEngine(tiny_model)
    e.prefill(*left_padded([3 * BLOCK, 5], V, 3))
    assert e.allocated_tokens == 4 * BLOCK  # each prompt its own length in blocks, unpadded
    e.select(torch.arange(2).repeat_interleave(8))  # fan-out: the prompts' blocks shared
    assert e.allocated_tokens == 4 * BLOCK
    for s in range(BLOCK):
        e.step(tokens(e.rows, V, s))
    held, pool = e.allocated_tokens, e.kpool[0].data_ptr()
    e.select(torch.tensor([0, 8]))  # rejection: one row a prompt
    assert e.kpool[0].data_ptr() == pool  # no copy
    # before: the first prompt's 3 blocks and 8 rows' one each; the second's rows 2 each (a copied tail, then one)
    assert held == (3 + 8 + 16) * BLOCK
    assert e.allocated_tokens == (3 + 1 + 2) * BLOCK
    e.select(torch.tensor([1]))  # the first prompt's last row gone: its prompt blocks freed too
    assert e.allocated_tokens == 2 * BLOCK


def test_the_paged_engine_counts_its_memory_in_blocks(tiny_gen):
    gen = tiny_gen("paged")
    assert gen.kv.block == BLOCK and gen.kv.shares_prefix and gen.info.name == "paged"
    assert not gen.compile  # eager: generator.compile does not apply to it
