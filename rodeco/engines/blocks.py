"""A paged KV cache's bookkeeping, without tensors: which blocks of a pool each row's tokens lie in.

A pool holds blocks of ``size`` tokens. Each row names its blocks in order (its *table*) and holds ``lens`` slots,
its prompt's and its own. A prompt ends on a block boundary: its first block is padded at the front (``starts``:
the slots before its first token, which attention skips), so all its blocks are whole and named by all its rows
(shared by reference, counted once), and each row's own tokens start in a block of its own: a fan-out copies
nothing, and the padding is held once a prompt, not once a row. A row that writes into a block another row also
names gets its own copy first (copy-on-write), so a copied row (beam, particle filter) shares its parent's blocks
until one of them writes. Dropping rows (rejection, finished rows leaving) frees the blocks no row
names any more, with no copy. The blocks in use are what the cache holds (``in_use``). Rows set aside (``park``: a
prompt waiting for its scores while the others decode) leave the tables but keep their blocks, until ``unpark`` puts
them back after the rows there are.

The pool has a fixed number of blocks (``capacity``: the budget, as vLLM's KV manager has) or, without a budget, grows
when it runs out of free blocks (by half its size at least). A fixed pool that runs out raises ``PoolFull``: the
loop asks ``steps_within`` how far a cohort's rows may decode inside its quota before it decodes, so that never
happens.

The Llama engine (``rodeco.engines.fast``) keeps one of these beside its tensors and applies what it decides; a
replay counts memory with the same object (``rodeco.engines.layout``), so the two agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROWTH = 0.5  # the pool grows by at least this share of its size when it runs out of free blocks
FIRST = 16  # blocks a growing pool starts with, at least


class PoolFull(RuntimeError):
    """A fixed pool had too few free blocks: the loop let rows decode past their quota (a bug)."""


@dataclass
class Parked:
    """Rows set aside (``Blocks.park``): their tables, slots and front padding."""

    tables: np.ndarray
    lens: np.ndarray
    starts: np.ndarray

    def counts(self, size: int) -> np.ndarray:
        return _block_counts(self.lens, size)


def _block_counts(lens: np.ndarray, size: int) -> np.ndarray:
    """[rows] blocks each row of ``lens`` slots names."""
    return -(-lens // size)


def _named(tables: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The blocks rows name (with repeats): each row's first ``counts[row]`` entries."""
    return tables[np.arange(tables.shape[1])[None] < counts[:, None]]


class Blocks:
    """Rows' block tables over a pool of blocks of ``size`` tokens (see the module doc); ``capacity``: the pool's
    fixed number of blocks, None: it grows."""

    def __init__(self, size: int, capacity: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"a block holds at least one token, not {size}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"a fixed pool holds at least one block, not {capacity}")
        self.size, self.capacity = size, capacity
        self.tables = np.zeros((0, 0), dtype=np.int64)  # [rows, M]: each row's blocks in order; past them, unread
        self.lens = np.zeros(0, dtype=np.int64)  # [rows]: slots each row holds (its prompt's padding included)
        self.starts = np.zeros(0, dtype=np.int64)  # [rows]: its prompt's padding, the slots before its first token
        self.ref = np.zeros(0, dtype=np.int64)  # [pool]: rows naming each block
        self.free: list[int] = []  # blocks no row names, taken from the end
        self.fresh: list[np.ndarray] = []  # blocks handed out since the last ``taken()``: what they hold is stale
        self.parked: dict[int, Parked] = {}  # rows set aside (``park``), by handle: their blocks stay named
        self._handles = 0
        if capacity is not None:
            self._grow(capacity)

    @property
    def pool(self) -> int:
        """Blocks in the pool, free or not."""
        return len(self.ref)

    @property
    def rows(self) -> int:
        return len(self.lens)

    @property
    def in_use(self) -> int:
        """Blocks some row names: what the cache holds."""
        return self.pool - len(self.free)

    @property
    def held_tokens(self) -> int:
        """Tokens' worth of the blocks in use (a shared block counted once): what the budget bounds."""
        return self.in_use * self.size

    @property
    def longest(self) -> int:
        """The longest row's tokens (0 without rows): no row is padded to it."""
        return int((self.lens - self.starts).max()) if self.rows else 0

    def counts(self) -> np.ndarray:
        """[rows] blocks each row names."""
        return _block_counts(self.lens, self.size)

    def _grow(self, new: int) -> None:
        old = self.pool
        self.ref = np.concatenate([self.ref, np.zeros(new - old, dtype=np.int64)])
        self.free = list(range(new - 1, old - 1, -1)) + self.free  # the lowest new block is taken last

    def _alloc(self, k: int) -> np.ndarray:
        """``k`` free blocks, now named once each; a growing pool grows first if too few are free."""
        if k > len(self.free):
            if self.capacity is not None:
                raise PoolFull(f"{k} blocks asked of a pool of {self.capacity} with {len(self.free)} free")
            self._grow(max(self.pool + k - len(self.free), self.pool + int(self.pool * GROWTH), FIRST))
        ids = np.array(self.free[len(self.free) - k :][::-1], dtype=np.int64)
        del self.free[len(self.free) - k :]
        self.ref[ids] = 1
        if k:
            self.fresh.append(ids)
        return ids

    def taken(self) -> np.ndarray:
        """The blocks handed out since the last call (a cache clears them before use: a block's slots that no token
        fills, its prompt's front padding, must hold no stale values)."""
        out = np.concatenate(self.fresh) if self.fresh else np.zeros(0, dtype=np.int64)
        self.fresh = []
        return out

    def _widen(self, width: int) -> None:
        if width > self.tables.shape[1]:
            pad = np.zeros((self.rows, width - self.tables.shape[1]), dtype=np.int64)
            self.tables = np.concatenate([self.tables, pad], axis=1)

    def add(self, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One row for each of the new prompts of ``lens`` tokens, after the rows there are, its tokens in blocks of
        its own, the first padded at the front so that the last ends full. Returns where each token goes, prompt by
        prompt, in order: (block, offset in the block)."""
        tokens = np.asarray(lens, dtype=np.int64)
        pad = -tokens % self.size
        lens = tokens + pad
        nb = lens // self.size
        ids = self._alloc(int(nb.sum()))
        width = max(self.tables.shape[1], int(nb.max()) if len(nb) else 0)
        self._widen(width)
        new = np.zeros((len(lens), width), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(nb)[:-1]])
        for i, (s, k) in enumerate(zip(starts, nb)):
            new[i, :k] = ids[s : s + k]
        self.tables = np.concatenate([self.tables, new])
        self.lens = np.concatenate([self.lens, lens])
        self.starts = np.concatenate([self.starts, pad])
        slot = np.concatenate([np.arange(p, n) for p, n in zip(pad, lens)]) if len(lens) else np.zeros(0, np.int64)
        first = np.repeat(starts, tokens)
        return ids[first + slot // self.size], slot % self.size

    def select(self, rows: np.ndarray) -> None:
        """Keep (and repeat, reorder) rows by index: a repeated row shares its blocks; blocks no row names are
        freed."""
        rows = np.asarray(rows, dtype=np.int64)
        self.tables, self.lens, self.starts = self.tables[rows], self.lens[rows], self.starts[rows]
        width = int(self.counts().max()) if self.rows else 0
        self.tables = self.tables[:, :width]
        named = [_named(self.tables, self.counts())] + [
            _named(p.tables, p.counts(self.size)) for p in self.parked.values()
        ]
        self.ref = np.bincount(np.concatenate(named), minlength=self.pool).astype(np.int64)
        self.free = np.flatnonzero(self.ref == 0)[::-1].tolist()

    def park(self, rows: np.ndarray) -> int:
        """Set rows (indices) aside: they leave the tables, and the blocks they name stay theirs (held, not freed,
        still counted in ``in_use``) until ``unpark``. Returns the handle ``unpark`` takes."""
        rows = np.asarray(rows, dtype=np.int64)
        self._handles += 1
        self.parked[self._handles] = Parked(self.tables[rows].copy(), self.lens[rows].copy(), self.starts[rows].copy())
        keep = np.setdiff1d(np.arange(self.rows), rows)
        self.tables, self.lens, self.starts = self.tables[keep], self.lens[keep], self.starts[keep]
        return self._handles

    def unpark(self, handle: int) -> None:
        """Rows set aside by ``park`` come back, in their order, after the rows there are."""
        p = self.parked.pop(handle)
        self._widen(p.tables.shape[1])
        pad = np.zeros((len(p.lens), self.tables.shape[1] - p.tables.shape[1]), dtype=np.int64)
        self.tables = np.concatenate([self.tables, np.concatenate([p.tables, pad], axis=1)])
        self.lens, self.starts = np.concatenate([self.lens, p.lens]), np.concatenate([self.starts, p.starts])

    def append(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Room for one more token in every row. Returns (block [rows], offset [rows]) where each row writes it, and
        the copies to make before it does, (from [k], to [k]): each row writing into a block that another row also
        names gets a copy of it, except the last such row when every row naming the block writes into it now."""
        j, off = np.divmod(self.lens, self.size)
        at = np.arange(self.rows)
        self._widen(int(j.max()) + 1 if self.rows else 0)
        opened = off == 0  # a new block
        cur = np.where(opened, 0, self.tables[at, j])
        shared = np.flatnonzero(~opened & (self.ref[cur] > 1))
        blk = cur[shared]
        last = np.zeros(len(shared), dtype=bool)
        _, first_from_end = np.unique(blk[::-1], return_index=True)
        last[len(blk) - 1 - first_from_end] = True
        writers = np.bincount(blk, minlength=self.pool)
        copy = shared[~(last & (writers[blk] == self.ref[blk]))]
        src = cur[copy]
        dst = self._alloc(len(copy))
        np.subtract.at(self.ref, src, 1)
        self.tables[copy, j[copy]] = dst
        fresh = np.flatnonzero(opened)
        self.tables[fresh, j[fresh]] = self._alloc(len(fresh))
        self.lens = self.lens + 1
        return self.tables[at, j], off, src, dst

    def named(self, rows: np.ndarray) -> int:
        """Blocks that ``rows`` (indices) name, a shared block counted once."""
        rows = np.asarray(rows, dtype=np.int64)
        k = self.counts()[rows]
        return len(np.unique(self.tables[rows][np.arange(self.tables.shape[1])[None] < k[:, None]]))

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """The most steps (up to ``most``) that ``rows`` (indices; their blocks named by no other row) can all take
        while the blocks they name, in tokens, plus ``row_overhead`` tokens a row stay within ``tokens``: what a
        cohort's quota allows before its next decision point, asked as vLLM's scheduler asks its KV manager. The
        first step is counted exactly (its copy-on-write copies, on a copy of the tables); after it every row writes
        into a block of its own, and takes a new one each ``size`` tokens."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0 or most <= 0:
            return max(0, most)
        room = tokens - row_overhead * len(rows)
        if self.named(rows) * self.size > room:
            return 0
        sub = Blocks(self.size)
        sub.tables, sub.lens, sub.ref = self.tables[rows].copy(), self.lens[rows].copy(), self.ref.copy()
        sub.starts = self.starts[rows].copy()
        sub._grow(self.pool + len(rows))  # a step takes a block a row at most (a copy, or a new one)
        sub.free = sub.free[: len(rows)]
        sub.append()
        first = sub.named(np.arange(len(rows)))
        if first * self.size > room:
            return 0
        L = sub.lens  # after one step
        k = np.arange(0, most)  # more steps after the first
        more = (-(-(L[:, None] + k[None]) // self.size) - (-(-L // self.size))[:, None]).sum(0)  # [most]
        fits = (first + more) * self.size <= room
        return int(np.flatnonzero(fits).max()) + 1
