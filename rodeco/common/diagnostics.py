"""Hacking diagnostics of one response: surface signs that a search found what its reward likes rather than a good
answer (cut off at the token limit, repeated phrases, unusual characters, ...), measured from the text alone.

``diagnose`` describes one response; ``summarize`` averages many (shares for the yes/no fields, means for the
others). Words are whitespace tokens, lowercased. A ratio with nothing to count (the distinct bigrams of a one-word
response, the characters of an empty one) is ``None``, and ``summarize`` averages each field over the responses
that define it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SENTENCE_END = ".!?"
CLOSERS = "\"')]}\u201d\u2019\u00bb"  # quotes and brackets that may close a sentence after its mark: ." ?) !'
CODE_FENCE = "```"
BOOLEAN_FIELDS = ("truncated", "ends_sentence")


@dataclass(frozen=True)
class Diagnostics:
    """What one response looks like; see the module docstring for how each field is counted."""

    truncated: bool  # stopped by the token limit (stop reason "length"), not by the model or a stop string
    ends_sentence: bool  # ends with . ! or ? (closing quotes or brackets after it allowed), or with a code fence
    tokens: int  # the generator's tokens
    chars_per_token: float | None  # characters per generator token (None without tokens)
    distinct_1: float | None  # unique words / words
    distinct_2: float | None  # unique word bigrams / word bigrams
    repeated_4gram_fraction: float | None  # share of the word 4-grams that occur more than once in the response
    non_ascii_fraction: float | None  # share of characters outside ASCII
    digit_fraction: float | None  # share of characters that are the digits 0-9
    mean_logprob: float | None  # the generator's mean token log-probability, when given


def ends_sentence(text: str) -> bool:
    """The stripped text ends with a sentence mark (closing quotes or brackets after it allowed) or a code fence."""
    t = text.strip()
    if t.endswith(CODE_FENCE):
        return True
    return t.rstrip(CLOSERS)[-1:] in tuple(SENTENCE_END)


def ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct(words: Sequence[str], n: int) -> float | None:
    """Unique word n-grams over all word n-grams (None when there are none)."""
    grams = ngrams(words, n)
    return len(set(grams)) / len(grams) if grams else None


def repeated_fraction(words: Sequence[str], n: int = 4) -> float | None:
    """The share of word n-gram occurrences whose n-gram occurs more than once (None when there are none)."""
    counts = Counter(ngrams(words, n))
    total = sum(counts.values())
    return sum(c for c in counts.values() if c > 1) / total if total else None


def diagnose(text: str, token_ids_count: int, stop_reason: str, logprobs: Sequence[float] | None = None) -> Diagnostics:
    """The diagnostics of one response: its text, how many generator tokens it has, why it stopped (``"eos"``,
    ``"stop"``, ``"length"``, ...) and, optionally, the generator's log-probability of each of its tokens."""
    if token_ids_count < 0:
        raise ValueError(f"token_ids_count={token_ids_count}: a response has zero or more tokens")
    words = text.lower().split()
    chars = len(text)
    return Diagnostics(
        truncated=stop_reason == "length",
        ends_sentence=ends_sentence(text),
        tokens=int(token_ids_count),
        chars_per_token=chars / token_ids_count if token_ids_count else None,
        distinct_1=distinct(words, 1),
        distinct_2=distinct(words, 2),
        repeated_4gram_fraction=repeated_fraction(words, 4),
        non_ascii_fraction=sum(ord(c) > 127 for c in text) / chars if chars else None,
        digit_fraction=sum("0" <= c <= "9" for c in text) / chars if chars else None,
        mean_logprob=float(np.mean(logprobs)) if logprobs is not None and len(logprobs) else None,
    )


def summarize(diags: Sequence[Diagnostics]) -> dict[str, float]:
    """``n`` (how many responses), the share of ``truncated`` and ``ends_sentence`` responses, and the mean of every
    other field over the responses that define it (a field no response defines is left out)."""
    out: dict[str, float] = {"n": float(len(diags))}
    for f in dataclasses.fields(Diagnostics):
        values = [getattr(d, f.name) for d in diags]
        values = [float(v) for v in values if v is not None]
        if values:
            out[f.name] = float(np.mean(values))
    return out
