"""The Llama engine: a fresh forward's logits on a cache of shared, copy-on-write blocks, each row's independent of
the others, rejection, fan-out and admission without cache copies, and a pool fixed by the budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rodeco.engines import native
from rodeco.engines.blocks import PoolFull
from rodeco.engines.fast import BLOCK, LlamaEngine


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


def fresh_logits(model, seq: list[int]) -> torch.Tensor:
    """The model's own forward over a whole sequence: its last position's logits."""
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1]


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_the_engine_gives_a_fresh_forwards_logits_through_fan_out_rejection_admission_and_copies(tiny_model, kernel):
    """Every row's logits are the model's own forward over its prompt and tokens (to 1e-4), through a prefill of
    left-padded prompts, fan-out, steps across block boundaries, rejection, an admission, and copies mid-block."""
    V = tiny_model.config.vocab_size
    e = LlamaEngine(tiny_model)
    if kernel and not e.kernel:
        pytest.skip("rodeco's native kernels are not built here")
    e.attention = native.paged_attention if kernel else native.paged_reference
    ids, mask = left_padded([21, 7], V, 0)
    seqs = [ids[i][mask[i].bool()].tolist() for i in range(2)]
    ops: list[tuple[str, object]] = [
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
    out = e.admit(ids, mask)
    for i, seq in enumerate(seqs):
        torch.testing.assert_close(out[i], fresh_logits(tiny_model, seq), rtol=1e-4, atol=1e-4)
    for i, (op, arg) in enumerate(ops):
        if op == "select":
            assert isinstance(arg, torch.Tensor)
            e.select(arg)
            seqs = [list(seqs[j]) for j in arg.tolist()]
            continue
        if op == "admit":
            new_ids, new_mask = arg  # type: ignore[misc]
            out = e.admit(new_ids, new_mask)
            seqs.append(new_ids[0][new_mask[0].bool()].tolist())
            torch.testing.assert_close(out[0], fresh_logits(tiny_model, seqs[-1]), rtol=1e-4, atol=1e-4)
            continue
        t = tokens(e.rows, V, i)
        out = e.step(t)
        seqs = [seq + [int(x)] for seq, x in zip(seqs, t)]
        for r, seq in enumerate(seqs):
            torch.testing.assert_close(
                out[r], fresh_logits(tiny_model, seq), rtol=1e-4, atol=1e-4, msg=f"op {i} row {r}"
            )
    assert e.rows == 7


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(tiny_model):
    """Bit for bit: one prompt's rows decoded alone and in a batch with another prompt's rows, more of them and
    longer (Speculative Rejection's survivors are Best-of-N's samples). The prompts are prefilled at one padded
    length, as a batch's are."""
    V = tiny_model.config.vocab_size
    alone, together = LlamaEngine(tiny_model), LlamaEngine(tiny_model)
    ids, mask = left_padded([9, 30], V, 2)
    alone.admit(ids[:1], mask[:1])
    together.admit(ids, mask)
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
    e = LlamaEngine(tiny_model)
    e.admit(*left_padded([3 * BLOCK, 5], V, 3))
    assert e.allocated_tokens == 4 * BLOCK  # each prompt its own length in blocks, unpadded
    e.select(torch.arange(2).repeat_interleave(8))  # fan-out: the prompts' blocks shared
    assert e.allocated_tokens == 4 * BLOCK
    for s in range(BLOCK):
        e.step(tokens(e.rows, V, s))
    held, pool = e.allocated_tokens, e.kpool[0].data_ptr()
    e.select(torch.tensor([0, 8]))  # rejection: one row a prompt
    assert e.kpool[0].data_ptr() == pool  # no copy
    # before: the first prompt's 3 blocks, the second's 1 (padded at the front), and 16 rows' one block each
    assert held == (3 + 1 + 16) * BLOCK
    assert e.allocated_tokens == (3 + 1 + 2) * BLOCK
    e.select(torch.tensor([1]))  # the first prompt's last row gone: its prompt blocks freed too
    assert e.allocated_tokens == 2 * BLOCK


def test_the_engine_counts_its_memory_in_blocks_and_paged_is_its_other_name(tiny_gen):
    for name in ("fast", "paged", "auto"):
        gen = tiny_gen(name)
        assert gen.kv.block == BLOCK and gen.kv.shares_prefix and gen.info.name == "fast"
        assert type(gen.new_engine()) is LlamaEngine


def test_the_pool_is_fixed_by_the_budget_and_a_step_past_it_is_refused(tiny_model):
    """``pool_tokens`` sizes the pool once (no growth, no copy); the bookkeeping says how many steps fit, and a
    step past them raises ``PoolFull`` instead of growing the pool."""
    V = tiny_model.config.vocab_size
    e = LlamaEngine(tiny_model, pool_tokens=6 * BLOCK)
    assert e.pool_tokens == 6 * BLOCK
    pool = e.kpool[0].data_ptr()
    e.admit(*left_padded([BLOCK + 3], V, 4))  # two blocks (padded at the front), shared by the rows
    e.select(torch.zeros(4, dtype=torch.long))
    rows = np.arange(4)
    k = e.steps_within(rows, 6 * BLOCK, 0, 100)
    assert k == BLOCK  # 2 shared + 4 rows x 1 block = 6 blocks; the next block for 4 rows does not fit
    assert e.steps_within(rows, 6 * BLOCK, 0, 5) == 5  # at most ``most``
    assert e.steps_within(rows, 6 * BLOCK, 1, 100) == 0  # with a token of working memory a row: not one step
    for s in range(k):
        e.step(tokens(e.rows, V, s))
    assert e.kpool[0].data_ptr() == pool and e.allocated_tokens == 6 * BLOCK
    with pytest.raises(PoolFull):
        e.step(tokens(e.rows, V, k))
