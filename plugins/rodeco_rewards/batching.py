"""Length-sorted batches under a token budget, shared by the rewards that run an encoder or a classifier.

Sorting by length keeps padding small; the budget bounds ``rows x longest row`` (the padded tensor the model sees),
so one long response cannot make a batch of short ones blow up memory. Each text is scored alone in the math
(attention masks hide padding), so a request's score does not depend on which batch it lands in.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_batches(lengths: Sequence[int], batch_tokens: int, max_rows: int | None = None) -> list[list[int]]:
    """Indices into ``lengths`` grouped into batches, longest first, with ``rows * max(length) <= batch_tokens``.

    Every index appears exactly once; a single sequence longer than the budget still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]  # sorted: the first row is the longest
        full = max_rows is not None and len(cur) >= max_rows
        if cur and ((len(cur) + 1) * max(longest, 1) > batch_tokens or full):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches
