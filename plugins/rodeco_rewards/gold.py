"""``gold``: 1.0 when the response's answer is the prompt's gold answer, else 0.0, checked by the task's own checker.

The gold answer travels with the prompt (``ScoreRequest.meta["gold_answer"]``): a generated task's record
(``data=reasoning_gym``), or a field of a JSONL record beside its prompt. The answer is extracted from the response
by ``extractor`` (null: the one the task's source declares, else ``last_number`` for a numeric gold answer and
``first_line`` otherwise; any ``winner.extractor``, with ``pattern`` for ``regex``). A record that names its source
(``meta["source"]``) is checked by that source (``rodeco.common.protocols.TaskSource.check``: reasoning-gym's
``score_answer``), and a partial credit below 1.0 counts as 0; other records by equality after
``WinnerRule.normalize`` (spaces, ``$``, thousands separators, ``2.0`` is ``2``).

``answer_from: arith`` (the ``arith_gold`` option) reads the gold answer from the prompt instead: the seeded
arithmetic problems of ``scripts/arith_bench.py`` ("What is 23 + 7? Answer with the number."), solved exactly. A
prompt that is not such a problem is an error.

No model is involved, so nothing the search optimised can fool it, except in what it does not look at: with
``last_number`` a response that states the right number and then another counts as wrong, and one that ends on the
right number after wrong reasoning counts as right. A judge's scores are never seen by the decode; ``gold`` as a
guide would be cheating, and the Any-of-N ceiling is computed from its scores of every candidate instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from rodeco import BuildContext, ConfigError, Plugins, RewardCost, ScoreRequest, WinnerRule, take_params

NODE = "judge.gold"
ARITH_NODE = "judge.arith_gold"
PROBLEM = re.compile(r"(?<![\d.])(-?\d+)\s*([-+*])\s*(-?\d+)(?![\d.])")
SHOWN = 60  # characters of a prompt an error shows
GOLD = "gold_answer"


def _extract(name: str, pattern: str | None = None):
    return WinnerRule(extractor=name, pattern=pattern).extract


LAST_NUMBER = _extract("last_number")  # the extractor winner.extractor=last_number uses


def answer_of(prompt: str) -> int:
    """The exact answer of the one arithmetic problem ``a op b`` in ``prompt``; otherwise a ``ConfigError``."""
    found = PROBLEM.findall(prompt)
    if len(found) != 1:
        shown = " ".join(prompt.split())
        shown = shown if len(shown) <= SHOWN else shown[:SHOWN] + "..."
        problem = "no arithmetic problem" if not found else f"{len(found)} arithmetic problems, not one"
        raise ConfigError(
            ARITH_NODE,
            shown,
            f"{problem} (a + b, a - b or a * b with integers) in this prompt",
            "use arith_gold only on the problems of scripts/arith_bench.py ('What is 23 + 7? Answer "
            "with the number.'); judge other prompts with gold and a gold answer in their records",
        )
    a, op, b = found[0]
    x, y = int(a), int(b)
    return x + y if op == "+" else x - y if op == "-" else x * y


def same_answer(answer: str | None, gold: str) -> bool:
    """``answer`` equals ``gold`` after ``WinnerRule.normalize`` (numbers compared as numbers)."""
    return answer is not None and WinnerRule.normalize(answer) == WinnerRule.normalize(gold)


def is_correct(prompt: str, response: str) -> bool:
    """The response's last number equals the answer of the prompt's arithmetic problem (``answer_of``)."""
    return same_answer(LAST_NUMBER(response), str(answer_of(prompt)))


class Gold:
    """1.0 for a response whose answer is the gold answer, else 0.0; partial responses are scored the same way."""

    def __init__(
        self,
        extractor: str | None = None,
        answer_from: str = "record",
        plugins: Plugins | None = None,
        pattern: str | None = None,
    ):
        self.extractor, self.answer_from, self.plugins, self.pattern = extractor, answer_from, plugins, pattern
        self.needs_meta = (GOLD,) if answer_from == "record" else ()
        self.identity = f"gold:{answer_from}:{extractor or 'declared'}" + (f":{pattern}" if pattern else "")
        self.cost = RewardCost()  # no model: calls only
        self._extractors: dict[str, Any] = {}

    def _extractor(self, name: str):
        if name not in self._extractors:
            self._extractors[name] = _extract(name, self.pattern if name == self.extractor else None)
        return self._extractors[name]

    def _source(self, name: str):
        if self.plugins is None:  # built outside a run: the installed plugins, once
            from rodeco import get_plugin_manager

            self.plugins = get_plugin_manager()
        return self.plugins.source(name)

    def check(self, r: ScoreRequest) -> float:
        if self.answer_from == "arith":
            gold: str | None = str(answer_of(r.prompt))
            meta: Mapping[str, Any] = {}
        else:
            meta = r.meta
            gold = None if meta.get(GOLD) is None else str(meta[GOLD])
        if gold is None:
            shown = " ".join(r.prompt.split())[:SHOWN]
            raise ConfigError(
                NODE,
                shown,
                f"prompt {r.prompt_index} has no gold answer (its record has no {GOLD})",
                "judge=gold needs prompts that carry one: data=reasoning_gym, or a gold_answer field in each record",
            )
        source = self._source(str(meta["source"])) if meta.get("source") else None
        name = self.extractor or (
            source.extractor(str(meta.get("task", ""))) if source is not None else _default_extractor(gold)
        )
        answer = self._extractor(name)(r.response)
        if source is not None:
            return 1.0 if source.check(answer, meta) >= 1.0 else 0.0
        return 1.0 if same_answer(answer, gold) else 0.0

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        return [self.check(r) for r in requests]


def _default_extractor(gold: str) -> str:
    try:
        float(WinnerRule.normalize(gold))
        return "last_number"
    except ValueError:
        return "first_line"


@dataclass
class GoldParams:
    extractor: Optional[str] = field(
        default=None,
        metadata={"help": "how the answer is read (null: the task's own; last_number, first_line, boxed, regex, ...)"},
    )
    pattern: Optional[str] = field(
        default=None, metadata={"help": "extractor=regex: the regular expression; its last match is the answer"}
    )
    answer_from: Literal["record", "arith"] = field(
        default="record",
        metadata={"help": "record: the prompt's gold_answer; arith: solve the scripts/arith_bench.py problem"},
    )


def build_gold(params: dict[str, Any], ctx: BuildContext) -> Gold:
    p = take_params(NODE, params, GoldParams)
    if p["extractor"] is not None:
        try:
            _extract(p["extractor"], p["pattern"])  # an unknown extractor or a bad pattern fails now, named
        except ConfigError as e:
            key = "pattern" if e.key == "winner.pattern" else "extractor"
            fix = e.fix.replace("winner.pattern", f"{NODE}.pattern")
            raise ConfigError(f"{NODE}.{key}", p[key], e.problem, fix) from None
    return Gold(p["extractor"], p["answer_from"], ctx.plugins, p["pattern"])
