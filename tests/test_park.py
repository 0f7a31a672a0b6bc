"""Rows set aside (``Session.park``): a prompt waiting for its scores holds its rows, their cache kept and its clock
stopped, while the other prompts decode; once back, each prompt's candidates are the samples it draws alone."""

from __future__ import annotations

import numpy as np
import pytest

from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec
from rodeco.engines.blocks import Blocks


def _prompts(n: int = 3, max_new: int = 24) -> list[OpenPrompt]:
    sp = SamplingParams(temperature=1.0, top_p=1.0)
    return [OpenPrompt(n=n, max_new_tokens=max_new, sampling=sp, seed=7, stream_key=11 + i) for i in range(2)]


def _tokens(sess, rows) -> dict[tuple[int, int], list[int]]:
    return {(r.prompt, r.candidate_id): r.token_ids for r in rows}


def _decode(gen, hold: list[tuple[int, int, int]], spec: SessionSpec | None = None):
    """Two prompts decoded to the end; ``hold``: (prompt, from step, for steps) its rows set aside."""
    sess = gen.open_session(spec or SessionSpec(needs_logprobs=True, ignore_eos=True))
    ids = [gen.encode("hello there"), gen.encode("a longer prompt, to differ")]
    sess.admit(ids, _prompts())
    out, handles = [], {}
    while sess.rows or handles:
        for p, at, steps in hold:
            if sess.t == at:
                handles[p] = (sess.park([p]), at + steps)
        for p, (h, back) in list(handles.items()):
            if sess.t >= back or not sess.rows:
                sess.unpark(h)
                del handles[p]
        out += sess.decode(until=sess.t + 1)
        out += sess.retire_finished()
    return {(r.prompt, r.candidate_id): (r.token_ids, r.logprobs) for r in out}, sess


@pytest.mark.parametrize("hold", [[(0, 5, 7)], [(1, 3, 4), (0, 9, 2)], [(0, 0, 3)]])
def test_held_rows_decode_what_they_decode_alone(tiny_gen, hold):
    gen = tiny_gen("fast")
    plain, _ = _decode(gen, [])
    held, sess = _decode(gen, hold)
    assert plain.keys() == held.keys() and len(plain) == 6
    for k, (toks, lps) in plain.items():
        assert held[k][0] == toks, k
        np.testing.assert_allclose(held[k][1], lps, atol=1e-4)
    assert all(len(t) == 24 for t, _ in held.values())  # a held prompt's clock stopped: full length all the same


def test_held_rows_keep_their_blocks_and_others_grow_beside_them():
    b = Blocks(4, capacity=32)
    b.add(np.array([5, 6]))
    b.select(np.array([0, 0, 1, 1]))
    for _ in range(5):
        b.append()
    held = b.in_use
    h = b.park(np.array([0, 1]))
    assert b.rows == 2 and b.in_use == held  # set aside, not freed
    b.select(np.array([0]))  # a selection of the others keeps the rows aside theirs
    assert b.in_use < held
    for _ in range(9):
        b.append()
    b.unpark(h)
    assert b.rows == 3 and list(b.lens[1:]) == [13, 13]
    b.select(np.array([1, 2]))  # the other row leaves: its blocks are freed, the held rows' stay
    b.append()
    assert len(set(b.tables[0, :4]) & set(b.tables[1, :4])) >= 2  # the prompt's blocks still shared


def test_an_engine_that_cannot_set_rows_aside_says_so(tiny_gen):
    sess = tiny_gen("hf").open_session(SessionSpec())
    assert sess.parks is False
    with pytest.raises(NotImplementedError, match="parks is False"):
        sess.park([0])
    assert tiny_gen("fast").open_session(SessionSpec()).parks is True
