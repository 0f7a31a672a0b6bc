"""The ``judge`` role: rewards that score each prompt's winner after the decode (and, with
``output.all_candidates=true``, every finished candidate), so that a method is measured by something it did not
optimise. A judge is never seen by the decode: the loop, the policy, the partial scorer and the winner rule get the
``reward`` and ``partial_reward`` only, and the runner calls the judges on a prompt's result once it is final. Their
cost is kept apart from the method's (``summary.json``'s ``judge`` section, not its ``compute``).

A judge that fails loses nothing the decode computed: the result is written with ``score: null`` and the error, a
resumed run (or ``rodeco task=judge``) scores what lacks a score, and a changed judge under the same name is refused.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rodeco.common.protocols import RewardCost
from rodeco.common.state import GOLD, JudgeScore, PromptResult, ScoreRequest, judge_entries, judge_field
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer

log = logging.getLogger(__name__)


@dataclass
class Judge:
    """One judge: its option name (the key under ``judge``), the scorer, and the config it was resolved to."""

    name: str
    scorer: Scorer
    node: dict[str, Any]
    seconds: float = 0.0

    @property
    def spec(self) -> dict[str, Any]:
        """What makes two judges the same judge: the resolved config and what its scores come from."""
        return {"config": self.node, "identity": self.scorer.identity}

    def cost(self) -> dict[str, float]:
        c: RewardCost = self.scorer.cost()
        return {"tokens": c.tokens, "flops": c.flops, "calls": c.calls, "seconds": self.seconds}


@dataclass(frozen=True)
class Item:
    """One response to judge: its candidate id, text and the generator's token ids."""

    candidate_id: int
    text: str
    token_ids: tuple[int, ...]


class Judges:
    """The run's judges. ``judge_result`` scores a finished prompt's result; ``judge_record`` a written record (its
    text), so old runs can be judged without decoding again."""

    def __init__(self, judges: Sequence[Judge] = ()) -> None:
        self.judges = list(judges)

    def __bool__(self) -> bool:
        return bool(self.judges)

    @property
    def names(self) -> list[str]:
        return [j.name for j in self.judges]

    def specs(self) -> dict[str, dict[str, Any]]:
        return {j.name: j.spec for j in self.judges}

    def costs(self) -> dict[str, dict[str, float]]:
        return {j.name: j.cost() for j in self.judges}

    def reports(self) -> dict[str, dict[str, float]]:
        """Each judge's own figures of this process's scoring (an LLM judge's win rates), where it has any."""
        return {j.name: r for j in self.judges if (r := j.scorer.report())}

    def score(
        self,
        prompt: str,
        index: int,
        items: Sequence[Item],
        only: Iterable[str] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[int, list[JudgeScore]]:
        """Each item's scores by every judge (or those named in ``only``), keyed by candidate id; ``meta`` is the
        prompt's record (its gold answer). A judge that raises gives ``score=None`` and its error for these items; the
        others still score."""
        wanted = set(self.names if only is None else only)
        out: dict[int, list[JudgeScore]] = {it.candidate_id: [] for it in items}
        reqs = [
            ScoreRequest(
                prompt,
                it.text,
                it.token_ids,
                partial=False,
                prompt_index=index,
                candidate_id=it.candidate_id,
                meta=meta or {},
            )
            for it in items
        ]
        for j in self.judges:
            if j.name not in wanted or not reqs:
                continue
            t0 = time.perf_counter()
            try:
                scores: list[float | None] = [float(x) for x in j.scorer(reqs)]
                error = None
            except Exception as e:  # the decode's results are kept whatever a judge does
                scores, error = [None] * len(reqs), f"{type(e).__name__}: {e}"
                log.warning(
                    "judge %r failed on prompt %d (the result is kept without its score; rodeco task=judge "
                    "output.dir=... scores it later): %s",
                    j.name,
                    index,
                    error,
                )
            j.seconds += time.perf_counter() - t0
            for it, s in zip(items, scores):
                out[it.candidate_id].append(JudgeScore(j.name, s, error))
        return out

    def judge_result(self, result: PromptResult) -> None:
        """Set ``result.judge`` (the winner's) and, when the result keeps every candidate, each finished
        candidate's ``judge``."""
        if not self.judges:
            return
        cands = [c for c in (result.candidates or []) if c.finished]
        items = {c.candidate_id: Item(c.candidate_id, c.text, tuple(c.token_ids)) for c in cands}
        best = result.best
        items.setdefault(best.candidate_id, Item(best.candidate_id, best.text, tuple(best.token_ids)))
        scores = self.score(result.prompt, result.prompt_index, list(items.values()), meta=result.meta)
        result.judge = scores[best.candidate_id]
        for c in cands:
            c.judge = scores[c.candidate_id]

    def judge_record(self, rec: dict[str, Any]) -> bool:
        """Score what a written record lacks (a judge of this run with no score for its winner or a finished
        candidate), in place; True if anything changed."""
        if not self.judges:
            return False
        targets = [rec] + [c for c in rec.get("candidates") or [] if c.get("finished")]
        missing = {j for t in targets for j in self.names if _lacks(t, j)}
        if not missing:
            return False
        best = rec["best"]
        items = {int(best["candidate_id"]): Item(int(best["candidate_id"]), best["text"], tuple(best["token_ids"]))}
        for c in targets[1:]:
            items.setdefault(int(c["candidate_id"]), Item(int(c["candidate_id"]), c["text"], tuple(c["token_ids"])))
        meta = {**rec.get("record", {}), **({GOLD: rec[GOLD]} if GOLD in rec else {})}
        scores = self.score(rec["prompt"], int(rec["prompt_index"]), list(items.values()), only=missing, meta=meta)
        _merge(rec, scores[int(best["candidate_id"])])
        for c in targets[1:]:
            _merge(c, scores[int(c["candidate_id"])])
        return True


def _lacks(target: dict[str, Any], name: str) -> bool:
    e = judge_entries(target.get("judge")).get(name)
    return e is None or e.get("score") is None


def _merge(target: dict[str, Any], new: list[JudgeScore]) -> None:
    """``new`` scores into a record's (or candidate's) ``judge`` field, replacing those of the same judges."""
    entries = judge_entries(target.get("judge"))
    for s in new:
        entries[s.name] = s.to_dict()
    target["judge"] = judge_field([JudgeScore(e["name"], e["score"], e.get("error")) for e in entries.values()])


def check_specs(previous: dict[str, Any], judges: Judges, where: str) -> None:
    """A judge of this run that the results in ``where`` were judged by under the same name with another config
    (``previous``: the ``judge`` section of their ``summary.json``) is refused: its scores would mix two judges."""
    for name, spec in judges.specs().items():
        old = previous.get(name)
        if old is None or "config" not in old:
            continue
        if (old["config"], old.get("identity")) != (spec["config"], spec["identity"]):
            raise ConfigError(
                f"judge.{name}",
                spec["config"],
                f"the results in {where} were judged by another "
                f"{name!r} ({old['config']}, identity {old.get('identity')})",
                f"keep judge.{name} as it was, or write to a new output.dir",
            )


def summarize(
    records: Iterable[dict[str, Any]], judges: Judges | None = None, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``summary.json``'s ``judge`` section: per judge, the winners' mean score, how many were scored and how many
    failed, its config, and its cost (``previous``'s plus this run's: never charged to the method)."""
    previous = previous or {}
    specs = judges.specs() if judges else {}
    costs = judges.costs() if judges else {}
    reports = judges.reports() if judges else {}
    scores: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for rec in records:
        for name, e in judge_entries(rec.get("judge")).items():
            if e.get("score") is None:
                failed[name] = failed.get(name, 0) + 1
            else:
                scores.setdefault(name, []).append(float(e["score"]))
    out: dict[str, Any] = {}
    for name in dict.fromkeys([*previous, *scores, *failed, *specs]):
        vals = scores.get(name, [])
        old = previous.get(name, {})
        cost = dict(old.get("cost", {}))
        for k, v in costs.get(name, {}).items():
            cost[k] = cost.get(k, 0) + v
        out[name] = {
            "mean": sum(vals) / len(vals) if vals else math.nan,
            "n": len(vals),
            "failed": failed.get(name, 0),
            **(specs.get(name) or {k: old[k] for k in ("config", "identity") if k in old}),
            "cost": cost,
            **(
                {"report": reports[name]}
                if name in reports
                else {k: old[k] for k in ("report", "report_by_shard") if k in old}
            ),
        }
    return out
