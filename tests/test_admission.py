"""Prompts join a running session (``TorchSession.admit``): each keeps its own clock, length, sampling and seed, so
its candidates are the samples it draws decoding alone, at whatever step it joined, on ``fast`` (eager, fp32) and
``hf`` (left padding masked). A new session is an empty one: its first prompts are admitted the same way."""

from __future__ import annotations

import pytest

from rodeco.common.state import OpenPrompt, Row, SamplingParams, SessionSpec

X = "the quick brown fox"
Y = "explain why the sky is blue in two sentences"  # longer than X: the running prompt's cache is re-padded
Z = "tips"


def opened(gen, text: str, p: OpenPrompt):
    """A session with prompt ``text`` admitted as ``p`` into it."""
    sess = gen.open_session(SessionSpec())
    sess.admit([gen.encode(text)], [p])
    return sess


def drain(sess) -> list[Row]:
    """Decode until no row is left; every row that left."""
    rows: list[Row] = []
    for _ in range(10_000):  # bounded: each pass decodes at least one token or retires rows
        if not sess.rows:
            return rows
        rows += sess.decode(until=10**6)
        rows += sess.retire_finished()
    raise AssertionError("the session did not drain")


def alone(gen, text: str, p: OpenPrompt) -> list[tuple[int, list[int], str]]:
    sess = opened(gen, text, p)
    return sorted((r.candidate_id, r.token_ids, r.reason) for r in drain(sess))


def of(rows: list[Row], key: int) -> list[tuple[int, list[int], str]]:
    return sorted((r.candidate_id, r.token_ids, r.reason) for r in rows if r.prompt == key)


RUNNING = OpenPrompt(n=3, max_new_tokens=40, sampling=SamplingParams(), seed=3, stream_key=11)
JOINING = OpenPrompt(n=4, max_new_tokens=24, sampling=SamplingParams(temperature=0.7, top_k=20), seed=9, stream_key=5)


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("at", [0, 1, 9, 30])
def test_a_joining_prompt_draws_what_it_draws_alone(tiny_gen, engine, at):
    """A prompt admitted after ``at`` steps of another, with other settings (rows, length, sampling, seed), gets
    the candidates it gets alone, and the running prompt keeps its own."""
    gen = tiny_gen(engine)
    sess = opened(gen, X, RUNNING)
    rows = sess.decode(until=at) if at else []
    assert sess.t == at
    (key,) = sess.admit([gen.encode(Y)], [JOINING])
    assert sess.clock(key) == 0 and sess.clock(0) == at
    rows += drain(sess)
    assert len(of(rows, key)) == JOINING.n and len(of(rows, 0)) == RUNNING.n
    assert of(rows, key) == alone(gen, Y, JOINING)
    assert of(rows, 0) == alone(gen, X, RUNNING)
    assert all(len(r.token_ids) <= JOINING.max_new_tokens for r in rows if r.prompt == key)


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_prompts_join_one_after_another_and_through_rejections(tiny_gen, engine):
    """Three prompts at three steps, rows rejected and copied on the way: each prompt's surviving candidates are
    its solo samples (a copy continues its own stream), and the compute is charged to every prompt."""
    gen = tiny_gen(engine)
    third = OpenPrompt(n=2, max_new_tokens=16, sampling=SamplingParams(top_p=0.9, top_k=0), seed=1, stream_key=7)
    sess = opened(gen, X, RUNNING)
    rows = sess.decode(until=5)
    (y,) = sess.admit([gen.encode(Y)], [JOINING])
    rows += sess.decode(until=8)
    rows += sess.reject([i for i, p in enumerate(sess.prompt_of) if p == 0][:1])  # the running prompt loses a row
    (z,) = sess.admit([gen.encode(Z)], [third])
    rows += drain(sess)
    rejected = [r for r in rows if r.prompt == 0 and r.reason == "rejected"]
    solo = {c: (ids, why) for c, ids, why in alone(gen, X, RUNNING)}
    assert len(rejected) == 1 and solo[rejected[0].candidate_id][0][:8] == rejected[0].token_ids
    kept = [r for r in of(rows, 0) if r[2] != "rejected"]
    assert kept == [(c, *solo[c]) for c, _, _ in kept]
    assert of(rows, y) == alone(gen, Y, JOINING)
    assert of(rows, z) == alone(gen, Z, third)
    st = sess.stats
    assert len(st.decode_tokens) == 3 and (st.decode_tokens > 0).all() and (st.decode_flops > 0).all()


def test_a_closed_batch_keeps_one_clock(tiny_gen):
    """While every prompt started at the same step, the session's steps are one number (the batch's clock)."""
    gen = tiny_gen("fast")
    sess = opened(gen, X, RUNNING)
    sess.decode(until=4)
    assert sess.steps() == 4


@pytest.mark.parametrize("engine", ["fast", "hf"])
def test_an_open_batch_holds_its_longest_rows_tokens_not_its_steps(tiny_gen, engine):
    """Prompts that come and go keep the batch open for more steps than any row lives, its rows never of one length:
    the engine's own columns are the longest row's tokens, not the steps since the batch opened, and every prompt
    still draws its solo candidates."""
    gen = tiny_gen(engine)
    sess = opened(gen, X, RUNNING)  # 40 tokens: its rows leave at step 40
    sess.decode(until=20)
    (y,) = sess.admit([gen.encode(Y)], [JOINING])  # 24 tokens: to step 44
    rows = sess.decode(until=30)
    late = OpenPrompt(n=2, max_new_tokens=30, sampling=SamplingParams(), seed=4, stream_key=2)
    (z,) = sess.admit([gen.encode(Z)], [late])  # 30 tokens: to step 60
    rows += sess.decode(until=43) + sess.retire_finished()
    assert set(sess.prompt_of.tolist()) == {y, z}
    assert sess.clock(y) == 23 and sess.clock(z) == 13 and sess.t == 43
    # the longest row's 22 cached tokens (its 23rd is fed at the next step), not the 42 of the batch's steps
    if engine == "fast":  # each row its own tokens
        assert sess.engine.length == max(len(gen.encode(Y)) + 22, len(gen.encode(Z)) + 12)
    else:  # the cache's positions: the longest row's prompt and tokens
        assert sess.engine.mask.shape[1] == max(len(gen.encode(Y)) + 22, len(gen.encode(Z)) + 12)
    rows += drain(sess)
    assert of(rows, y) == alone(gen, Y, JOINING) and of(rows, z) == alone(gen, Z, late)


@pytest.mark.slow  # compiles
def test_the_compiled_step_admits_without_a_compile_per_admission(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """On the compiled step (fp32) a prompt admitted into a running batch gets its solo candidates, and rows of
    different lengths are one more graph: later admissions, at other steps with other prompts and rows, compile
    nothing new."""
    from rodeco.core.generator import TorchGenerator

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    comp = TorchGenerator(tiny_model, tiny_tokenizer, engine="fast", name="tiny", compile="true")
    assert comp.info.compiled

    def joined(at: int, text: str, joining: OpenPrompt) -> list[Row]:
        sess = opened(comp, X, RUNNING)
        rows = sess.decode(until=at)
        (key,) = sess.admit([comp.encode(text)], [joining])
        return [r for r in rows + drain(sess) if r.prompt == key]

    # at 9: rows of different lengths (one more graph); at 0: rows of one length, two prompts (rodeco's attention
    # kernel reads the prompts' keys by column, as admission lays them out)
    for at, text in ((9, Y), (0, Y)):
        first = joined(at, text, JOINING)
        assert len(first) == JOINING.n
        assert of(first, 1) == alone(comp, text, JOINING)
    compiles = comp.compiled.compiles
    other = OpenPrompt(n=3, max_new_tokens=20, sampling=SamplingParams(), seed=2, stream_key=8)
    for at, text in ((3, Z), (0, Z), (17, Y + " please")):
        rows = joined(at, text, other)
        assert of(rows, 1) == alone(comp, text, other)
    assert comp.compiled.compiles == compiles  # no compile for the later admissions
