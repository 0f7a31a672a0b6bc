"""The paged cache's bookkeeping (``rodeco.engines.blocks.Blocks``): shared prompt blocks, copy-on-write, freeing."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.engines.blocks import FIRST, Blocks, PoolFull


def named(b: Blocks, row: int) -> list[int]:
    return b.tables[row, : b.counts()[row]].tolist()


def check_counts(b: Blocks) -> None:
    """Each block's count is the rows naming it, and the free blocks are exactly those no row names."""
    refs = np.zeros(b.pool, dtype=np.int64)
    for r in range(b.rows):
        for x in named(b, r):
            refs[x] += 1
    assert refs.tolist() == b.ref.tolist()
    assert sorted(b.free) == np.flatnonzero(refs == 0).tolist()
    assert len(set(b.free)) == len(b.free)


def test_a_prompt_ends_on_a_block_boundary_and_the_tokens_land_in_order():
    """A prompt's first block is padded at the front (``starts``), so its last block is full."""
    b = Blocks(4)
    blk, off = b.add(np.array([6, 4]))
    assert b.counts().tolist() == [2, 1] and b.in_use == 3
    assert b.starts.tolist() == [2, 0] and b.lens.tolist() == [8, 4] and b.longest == 6
    assert off.tolist() == [2, 3, 0, 1, 2, 3, 0, 1, 2, 3]
    assert blk[:2].tolist() == [named(b, 0)[0]] * 2 and blk[2:6].tolist() == [named(b, 0)[1]] * 4
    assert blk[6:].tolist() == [named(b, 1)[0]] * 4
    check_counts(b)


def test_fan_out_shares_all_of_a_prompts_blocks_and_each_row_opens_its_own_without_a_copy():
    b = Blocks(4)
    b.add(np.array([6]))
    b.select(np.zeros(3, dtype=np.int64))  # three rows of one prompt
    assert b.in_use == 2  # shared, counted once
    check_counts(b)
    prompt = named(b, 0)
    blk, off, src, dst = b.append()
    assert off.tolist() == [0, 0, 0] and len(src) == 0  # no copy: the prompt's last block is full
    assert len(set(blk.tolist())) == 3 and not set(blk.tolist()) & set(prompt)
    assert all(named(b, r)[:2] == prompt for r in range(3)) and b.starts.tolist() == [2, 2, 2]
    assert b.in_use == 5
    check_counts(b)
    blk, off, src, dst = b.append()  # each row writes into its own block
    assert len(src) == 0 and off.tolist() == [1, 1, 1]


def test_a_prompt_of_whole_blocks_copies_nothing_and_each_row_opens_a_block():
    b = Blocks(4)
    b.add(np.array([8]))
    b.select(np.zeros(2, dtype=np.int64))
    blk, off, src, dst = b.append()
    assert len(src) == 0 and off.tolist() == [0, 0] and blk[0] != blk[1]
    assert b.in_use == 4 and b.counts().tolist() == [3, 3]
    check_counts(b)


def test_dropping_rows_frees_the_blocks_no_row_names():
    b = Blocks(4)
    b.add(np.array([5, 3]))
    b.select(np.array([0, 0, 1, 1]))
    for _ in range(6):
        b.append()
    before = b.in_use
    b.select(np.array([1, 3]))  # one row of each prompt
    assert b.in_use < before
    check_counts(b)
    b.select(np.array([1]))  # the first prompt's rows all gone: its blocks free
    assert b.in_use == b.counts()[0]
    check_counts(b)
    b.select(np.zeros(0, dtype=np.int64))
    assert b.in_use == 0 and b.rows == 0


def test_a_copied_row_shares_its_parent_until_one_of_them_writes():
    b = Blocks(4)
    b.add(np.array([3]))
    for _ in range(2):
        b.append()  # 3 prompt tokens after a slot of padding, then 2 of its own: half of a second block
    b.select(np.array([0, 0]))  # beam: the row copied
    assert b.in_use == 2
    blk, off, src, dst = b.append()
    assert len(src) == 1 and blk[0] != blk[1] and b.in_use == 3
    check_counts(b)


def test_a_fixed_pool_never_grows_and_says_how_many_steps_a_quota_allows():
    b = Blocks(4, capacity=6)
    assert b.pool == 6 and len(b.free) == 6
    b.add(np.array([3, 8]))  # 1 + 2 blocks, whole
    b.select(np.array([0, 0, 1]))
    rows = np.arange(3)
    assert b.steps_within(rows, 6 * 4, 0, 10) == 4  # each row opens one block: 3 + 3 = 6, the next 4 tokens fit
    assert b.steps_within(np.array([0, 1]), 6 * 4, 0, 10) == 8  # prompt 0 alone: 1 + 2 rows x 2 blocks = 5
    assert b.steps_within(rows, 5 * 4, 0, 10) == 0  # 3 + 3 blocks do not fit 5
    assert b.steps_within(rows, 6 * 4, 1, 10) == 0  # nor with a token of working memory a row
    for _ in range(4):
        b.append()
    assert b.in_use == 6 and not b.free
    with pytest.raises(PoolFull):
        b.append()


def test_the_pool_grows_by_half_at_least_and_keeps_its_blocks():
    b = Blocks(2)
    b.add(np.array([2 * FIRST]))
    assert b.pool == FIRST and not b.free
    keep = named(b, 0)
    b.append()
    assert b.pool == FIRST + FIRST // 2 and named(b, 0)[:FIRST] == keep
    check_counts(b)


def test_a_block_holds_at_least_one_token():
    with pytest.raises(ValueError, match="at least one token"):
        Blocks(0)
