"""Choosing a prompt's winner among its finished candidates (``winner`` config group).

- ``rule: reward`` (the default): the highest final reward.
- ``rule: majority``: self-consistency. Each finished candidate's answer is extracted (``extractor``); the answer
  most candidates give wins, and of its candidates the highest reward.
- ``rule: weighted``: weighted Best-of-N (search-and-learn's ``utils/score.py``, its_hub's weighted vote): each
  answer's weight is the sum of its candidates' ``softmax(reward / temperature)`` weights. Softmax weights are
  positive on any reward scale (a preference RM's logits as a PRM's probabilities); a large ``temperature`` is the
  plain majority, a small one the highest reward. With ``weight: confidence`` a candidate's weight is instead its
  trace's confidence (DeepConf's vote, arXiv 2508.15260): the lowest mean, over any ``window`` consecutive tokens, of
  ``-mean`` of the ``top_k`` most likely tokens' log-probs at each position (``Candidate.confidence``), summed as it
  is (it is positive).

A vote can stop when it is decided (``stop``, off by default): every ``stop_tokens`` tokens the loop retires a
prompt's finished rows and asks ``settled``; a settled prompt's active rows stop (they leave unfinished, with
``stop_reason`` ``settled``, and do not vote), and its result says where (``PromptResult.stopped_at``).
``stop: beta`` is Adaptive-Consistency's Beta test (Aggarwal et al. 2023): the chance, under a uniform prior, that
the leading answer's share exceeds the runner-up's, given their votes, is at least ``stop_threshold``.
``stop: certain``: no answer can overtake the leader even if every row still decoding voted against it, so the
winner's answer is the one the full vote would give (majority only). Votes are counted, one a candidate, whatever
the rule's weights.

Extractors: ``boxed`` (the last ``\\boxed{...}``, nested braces allowed), ``last_number``, ``first_line`` (the
first line with text, an ``Answer:`` label dropped: a word, a list or a sentence), ``regex`` (``pattern``:
its first group, or the whole match), or ``package.module:function`` (a callable ``str -> str | None``: any
installed package can provide one). Answers are normalized (spaces, ``$``, thousands separators, ``2.0`` is ``2``).
Candidates without an answer do not vote; if none has one, the highest reward wins and the result says so
(``winner: reward``).
"""

from __future__ import annotations

import importlib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from rodeco.common.confidence import lowest_group_confidence
from rodeco.common.state import Candidate
from rodeco.common.validation import ConfigError

RULES = ("reward", "majority", "weighted")
WEIGHTS = ("reward", "confidence")
STOPS = ("beta", "certain")
EXTRACTORS = ("boxed", "last_number", "first_line", "regex")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


_LABEL = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\b\s*(?:is\b)?\s*[:=]?\s*", re.IGNORECASE)


def first_line(text: str) -> str | None:
    """The first line that holds text, without an ``Answer:`` label, or None."""
    for line in text.splitlines():
        line = _LABEL.sub("", line.strip()).strip()
        if line:
            return line
    return None


def normalize(answer: str) -> str:
    a = answer.strip().strip("$").strip().rstrip(".").replace(" ", "")
    num = a.replace(",", "")
    try:
        x = float(num)
    except ValueError:
        return a
    return str(int(x)) if math.isfinite(x) and x == int(x) else repr(x)


def extractor(name: str, pattern: str | None = None) -> Callable[[str], str | None]:
    """The extractor ``winner.extractor=name`` names."""
    if name == "boxed":
        return boxed
    if name == "last_number":
        return last_number
    if name == "first_line":
        return first_line
    if name == "regex":
        if not pattern:
            raise ConfigError(
                "winner.pattern",
                pattern,
                "the regex extractor needs a pattern",
                r"set winner.pattern, e.g. 'answer is (\S+)'",
            )
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ConfigError("winner.pattern", pattern, f"not a regular expression: {e}", "fix the pattern") from e

        def by_regex(text: str) -> str | None:  # the last match
            last = None
            for last in rx.finditer(text):  # noqa: B007 - the loop keeps the last match
                pass
            return None if last is None else last.group(1 if rx.groups else 0)

        return by_regex
    if ":" in name:
        mod, _, fn = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise ConfigError(
                "winner.extractor", name, f"cannot load it: {e}", "give package.module:function of an installed package"
            ) from e
    raise ConfigError(
        "winner.extractor", name, "unknown extractor", f"use one of {', '.join(EXTRACTORS)} or package.module:function"
    )


@dataclass(frozen=True)
class Choice:
    best: Candidate
    rule: str  # the rule that chose it
    answer: str | None = None  # the answer it won by (a vote)


@dataclass(frozen=True)
class WinnerRule:
    rule: str = "reward"
    extractor: str = "boxed"
    pattern: str | None = None
    temperature: float = 1.0
    weight: str = "reward"  # rule=weighted: a candidate's weight, softmax(reward / temperature) or its confidence
    top_k: int = 5  # weight=confidence: a token's confidence is -mean of its top_k log-probs
    window: int = 16  # weight=confidence: a trace's confidence is its lowest mean over this many tokens
    stop: str | None = None  # None, "beta" or "certain": the vote's stopping test
    stop_threshold: float = 0.95  # stop=beta: the chance the leader leads that settles the vote
    stop_tokens: int = 8  # stop: the vote is tested every this many tokens

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ConfigError("winner.rule", self.rule, "unknown rule", f"use one of {', '.join(RULES)}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ConfigError(
                "winner.temperature", self.temperature, "must be a number above 0", "set winner.temperature, e.g. 1.0"
            )
        if self.weight not in WEIGHTS:
            raise ConfigError("winner.weight", self.weight, "unknown weight", f"use one of {', '.join(WEIGHTS)}")
        for key, example in (("top_k", 5), ("window", 16), ("stop_tokens", 8)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"winner.{key}", v, "must be a whole number of at least 1", f"e.g. {example}")
        if self.stop is not None:
            if self.stop not in STOPS:
                raise ConfigError(
                    "winner.stop", self.stop, "unknown stopping test", f"use one of {', '.join(STOPS)}, or null"
                )
            if self.rule == "reward":
                raise ConfigError(
                    "winner.stop",
                    self.stop,
                    "stops a vote, and winner.rule=reward does not vote",
                    "set winner.rule=majority or weighted, or winner.stop=null",
                )
            if self.stop == "certain" and self.rule != "majority":
                raise ConfigError(
                    "winner.stop",
                    self.stop,
                    f"is exact only for the majority vote, not winner.rule={self.rule}",
                    "set winner.rule=majority, or winner.stop=beta",
                )
            if not (isinstance(self.stop_threshold, (int, float)) and 0.5 < self.stop_threshold < 1):
                raise ConfigError(
                    "winner.stop_threshold", self.stop_threshold, "must lie between 0.5 and 1", "e.g. 0.95"
                )
        if self.rule != "reward":
            self.extract  # noqa: B018  resolved now: a bad extractor fails at start-up, not at the first prompt

    @property
    def top_logprobs(self) -> int:
        """The top-k log-probs its weights read at each position (0: none)."""
        return self.top_k if self.rule == "weighted" and self.weight == "confidence" else 0

    def confidence(self, top: Sequence[Sequence[float]] | None) -> float | None:
        """A trace's confidence from its positions' top-k log-probs (None without them): its lowest group confidence
        (``rodeco.common.confidence``)."""
        if not top:
            return None
        return lowest_group_confidence(top, self.top_k, self.window)

    def settled(self, answers: Sequence[str | None], remaining: int) -> bool:
        """Whether a prompt's vote is decided: ``answers`` its finished candidates' extracted answers (None: no
        answer, no vote), ``remaining`` its rows still decoding."""
        votes = Counter(normalize(a) for a in answers if a is not None and normalize(a))
        if not votes or self.stop is None:
            return False
        top = sorted(votes.values(), reverse=True) + [0]
        first, second = top[0], top[1]
        if self.stop == "certain":
            return first > second + remaining
        return beta_lead(first, second) >= self.stop_threshold

    @staticmethod
    def normalize(answer: str) -> str:
        """An answer as votes compare it (``normalize``): spaces, ``$`` and thousands separators dropped, ``2.0`` is
        ``2``."""
        return normalize(answer)

    @cached_property
    def extract(self) -> Callable[[str], str | None]:
        """The extractor, resolved once (a regex compiled, a function imported) for every prompt it reads."""
        return extractor(self.extractor, self.pattern)

    def choose(self, finished: Sequence[Candidate]) -> Choice:
        """The winner among a prompt's finished candidates (at least one)."""
        top = max(finished, key=_final)
        if self.rule == "reward":
            return Choice(top, "reward")
        answers = [(c, self.extract(c.text)) for c in finished]
        voting = [(c, normalize(a)) for c, a in answers if a is not None and normalize(a)]
        if not voting:
            return Choice(top, "reward")
        hi = max(_final(c) for c, _ in voting)
        weight: dict[str, float] = {}
        best: dict[str, Candidate] = {}
        for c, a in voting:
            if self.rule == "majority":
                w = 1.0
            elif self.weight == "confidence":
                assert c.confidence is not None, f"candidate {c.candidate_id} has no confidence to weigh it by"
                w = c.confidence
            else:
                w = math.exp((_final(c) - hi) / self.temperature)
            weight[a] = weight.get(a, 0.0) + w
            if a not in best or _final(c) > _final(best[a]):
                best[a] = c
        answer = max(weight, key=lambda a: (weight[a], _final(best[a])))
        return Choice(best[answer], self.rule, answer)


def beta_lead(first: int, second: int) -> float:
    """Adaptive-Consistency's Beta test: ``P(p > 1/2)`` for ``p ~ Beta(first + 1, second + 1)``, the chance under a
    uniform prior that the answer with ``first`` votes is likelier than the one with ``second``. Exact for whole
    counts: ``I_{1/2}(a, b) = P(Binomial(a + b - 1, 1/2) >= a)``."""
    a, b = first + 1, second + 1
    m = a + b - 1
    return sum(math.comb(m, j) for j in range(a)) / 2**m


def _final(c: Candidate) -> float:
    """A finished candidate's final reward (the loop scores every finished candidate)."""
    assert c.score is not None, f"finished candidate {c.candidate_id} has no final reward"
    return c.score
