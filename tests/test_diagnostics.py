"""Hacking diagnostics of one response (``rodeco.common.diagnostics``): hand-checked values of every field, and
the summary."""

from __future__ import annotations

import math

import pytest

from rodeco.common.diagnostics import Diagnostics, diagnose, ends_sentence, repeated_fraction, summarize


def test_every_field_by_hand():
    # 8 words: "the cat sat. the cat sat. the end" (lowercased: The -> the)
    d = diagnose("The cat sat. the cat sat. the end", 10, "length", logprobs=[-1.0, -2.0, -3.0])
    assert d.truncated and not d.ends_sentence
    assert d.tokens == 10
    assert d.chars_per_token == pytest.approx(33 / 10)
    # unigrams: the x3, cat x2, sat. x2, end -> 4 unique of 8
    assert d.distinct_1 == pytest.approx(4 / 8)
    # bigrams (7): the-cat, cat-sat., sat.-the, the-cat, cat-sat., sat.-the, the-end -> 4 unique
    assert d.distinct_2 == pytest.approx(4 / 7)
    # 4-grams (5): [the cat sat. the] x2, [cat sat. the cat], [sat. the cat sat.], [cat sat. the end] -> 2 of 5
    assert d.repeated_4gram_fraction == pytest.approx(2 / 5)
    assert d.non_ascii_fraction == 0.0 and d.digit_fraction == 0.0
    assert d.mean_logprob == pytest.approx(-2.0)


def test_characters_and_missing_values():
    d = diagnose("Año 2024: 5€.", 4, "eos")
    assert not d.truncated and d.ends_sentence
    assert d.non_ascii_fraction == pytest.approx(2 / 13)  # ñ and €
    assert d.digit_fraction == pytest.approx(5 / 13)  # 2, 0, 2, 4, 5
    assert d.mean_logprob is None  # not given
    assert diagnose("x", 1, "eos", logprobs=[]).mean_logprob is None
    one = diagnose("word", 1, "eos")
    assert one.distinct_1 == 1.0 and one.distinct_2 is None and one.repeated_4gram_fraction is None
    empty = diagnose("", 0, "eos")
    assert empty.chars_per_token is None and empty.non_ascii_fraction is None and empty.distinct_1 is None
    with pytest.raises(ValueError, match="token_ids_count=-1"):
        diagnose("x", -1, "eos")


@pytest.mark.parametrize(
    "text, want",
    [
        ("It ends here.", True),
        ("Really?  \n", True),
        ("Stop!", True),
        ('He said "go."', True),
        ("(as shown.)", True),
        ("She asked \u201cwhy?\u201d", True),
        ("```python\nprint(1)\n```", True),
        ("It ends with a list:\n- apples", False),
        ("cut off mid", False),
        ('"quoted"', False),
        ("(aside)", False),
        ("", False),
        ("1.", True),
    ],
)
def test_ends_sentence(text, want):
    assert ends_sentence(text) is want


def test_repeated_fraction_of_a_loop():
    assert repeated_fraction("a b c d a b c d".split()) == pytest.approx(2 / 5)
    assert repeated_fraction("a b c d e f".split()) == 0.0
    assert repeated_fraction("a a a a a a".split()) == 1.0  # three 4-grams, all "a a a a"


def test_summarize_shares_and_means():
    ds = [
        diagnose("Done.", 2, "eos", logprobs=[-1.0]),
        diagnose("and then and then and", 6, "length"),
        diagnose("", 0, "length"),
    ]
    s = summarize(ds)
    assert s["n"] == 3.0
    assert s["truncated"] == pytest.approx(2 / 3) and s["ends_sentence"] == pytest.approx(1 / 3)
    assert s["tokens"] == pytest.approx(8 / 3)
    assert s["chars_per_token"] == pytest.approx((5 / 2 + 21 / 6) / 2)  # the empty one has none
    assert s["distinct_1"] == pytest.approx((1.0 + 2 / 5) / 2)
    assert s["mean_logprob"] == pytest.approx(-1.0)  # only the first was given
    assert all(math.isfinite(v) for v in s.values())
    assert summarize([]) == {"n": 0.0}
    assert set(summarize(ds)) <= {"n", *Diagnostics.__dataclass_fields__}
