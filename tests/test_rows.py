"""``rodeco.common.rows.RowBook``: the row bookkeeping the torch, pool and vLLM sessions share."""

from __future__ import annotations

import numpy as np

from rodeco.common.rows import BookColumn, RowBook


def test_fan_out_take_and_fork_keep_each_rows_prompt_candidate_and_stream():
    book = RowBook()
    book.fan_out(prompts=2, n=3, first=4)
    assert book.prompt_of.tolist() == [0, 0, 0, 1, 1, 1]
    assert book.cand.tolist() == [4, 5, 6, 4, 5, 6] and book.stream.tolist() == book.cand.tolist()
    book.take([0, 2, 5])  # rows 1, 3 and 4 rejected
    assert (book.prompt_of.tolist(), book.cand.tolist()) == ([0, 0, 1], [4, 6, 6])
    order, slots = book.fork([0, 2, 0], ids=[10, 11, 12], streams=[100, 101, 102])
    assert order == [0, 0, 0, 1, 2, 2] and slots == [1, 5, 2]  # copies right after their parent
    assert book.prompt_of.tolist() == [0, 0, 0, 0, 1, 1]
    assert book.cand.tolist() == [4, 10, 12, 6, 6, 11]
    assert book.stream.tolist() == [4, 100, 102, 6, 6, 101]
    assert len(book) == 6


def test_a_row_that_ended_by_eos_leaves_without_it():
    book = RowBook()
    book.fan_out(prompts=1, n=2, first=0)
    eos = book.leaving(1, [5, 6, 2], [-0.1, -0.2, -0.3], "eos", eos_ids=[2])
    assert (eos.token_ids, eos.logprobs, eos.stop, eos.reason) == ([5, 6], [-0.1, -0.2], 2, "eos")
    assert (eos.prompt, eos.candidate_id, eos.stream) == (0, 1, 1)
    cut = book.leaving(0, [5, 6, 2], None, "length", eos_ids=[2])  # at the limit: the last token is the response's
    assert (cut.token_ids, cut.stop, cut.reason) == ([5, 6, 2], None, "length")
    rejected = book.leaving(0, [5, 6], None, "rejected", eos_ids=[2])
    assert rejected.token_ids == [5, 6] and rejected.stop is None


def test_a_sessions_columns_are_its_books_arrays():
    class Session:
        prompt_of, cand, stream = BookColumn(), BookColumn(), BookColumn()

        def __init__(self) -> None:
            self.book = RowBook()

    s = Session()
    s.book.fan_out(prompts=1, n=3, first=0)
    s.cand = s.cand % 2
    assert s.book.cand.tolist() == [0, 1, 0] and s.cand.dtype == np.int64
    s.stream[:] = [7, 8, 9]
    assert s.book.stream.tolist() == [7, 8, 9]
