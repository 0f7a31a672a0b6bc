"""What the embedded RM's head sees of a (prompt, response): sentence embeddings plus a few surface statistics.

``features = [e_r, e_p * e_r, cos(e_p, e_r), stats(prompt, response)]`` with ``e_p``, ``e_r`` the L2-normalised
MiniLM embeddings of the prompt and of the response's first ``max_length`` tokens; ``stats`` are computed on the
whole response text (its length above all: the judge of the training data prefers longer answers), a few of them
in interaction with the prompt's length. The first ``2 d + 1`` features come from the encoder (``n_embedding``).
"""

from __future__ import annotations

import math
import re

import numpy as np

STAT_NAMES = (
    "log_chars",
    "log_words",
    "log_lines",
    "list_line_frac",
    "log_bold",
    "log_headers",
    "code_fence",
    "ends_sentence",
    "mean_word_len",
    "non_ascii_frac",
    "refusal",
    "log_questions",
    "digit_frac",
    "log_paragraphs",
    "unique_word_frac",
    "log_sentences",
    "words_per_sentence",
    "log_chars_x_log_prompt_chars",
    "log_chars_sq",
    "log_prompt_chars",
)
_SENTENCE_END = re.compile(r"[.!?]+\s")
_LIST = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_HEADER = re.compile(r"^\s*#{1,6}\s")
_REFUSAL = re.compile(
    r"\b(?:I'm sorry|I am sorry|I cannot|I can't|I can not|As an AI|I'm not able|I am not able|"
    r"I apologi[sz]e)\b",
    re.IGNORECASE,
)


def text_stats(prompt: str, response: str) -> np.ndarray:
    """``[len(STAT_NAMES)]`` float32 surface statistics of one response (and the length of its prompt)."""
    text = response.strip()
    words = text.split()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    n_chars = len(text)
    n_sentences = sum(1 for s in _SENTENCE_END.split(text) if s.strip())
    log_chars, log_prompt = math.log1p(n_chars), math.log1p(len(prompt.strip()))
    stats = (
        log_chars,
        math.log1p(len(words)),
        math.log1p(len(lines)),
        sum(bool(_LIST.match(ln)) for ln in lines) / max(1, len(lines)),
        math.log1p(text.count("**") // 2),
        math.log1p(sum(bool(_HEADER.match(ln)) for ln in lines)),
        float("```" in text),
        float(text.endswith((".", "!", "?", "```", ")", '"'))),
        sum(len(w) for w in words) / max(1, len(words)) / 10.0,
        sum(ord(c) > 127 for c in text) / max(1, n_chars),
        float(bool(_REFUSAL.search(text))),
        math.log1p(text.count("?")),
        sum(c.isdigit() for c in text) / max(1, n_chars),
        math.log1p(text.count("\n\n")),
        len({w.lower() for w in words}) / max(1, len(words)),  # low when the text repeats itself
        math.log1p(n_sentences),
        len(words) / max(1, n_sentences) / 20.0,
        log_chars * log_prompt / 10.0,
        log_chars * log_chars / 10.0,
        log_prompt,
    )
    return np.asarray(stats, dtype=np.float32)


def build_features(e_prompt: np.ndarray, e_resp: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """``[n, 2d + 1 + k]`` features from ``[n, d]`` prompt and response embeddings and ``[n, k]`` stats."""
    cos = (e_prompt * e_resp).sum(-1, keepdims=True)
    return np.concatenate([e_resp, e_prompt * e_resp, cos, stats], axis=1).astype(np.float32)


def feature_dim(d: int) -> int:
    return n_embedding(d) + len(STAT_NAMES)


def n_embedding(d: int) -> int:
    """How many leading features come from the encoder (they get their own L2 penalty in training)."""
    return 2 * d + 1
