"""The judged part of ``rodeco experiment=efficiency``: each method's winners on the report half scored by the run's
judges (``judge=...``; the experiment's default is every offline judge of AlpacaEval prompts), which no decision saw,
and analysed against each judge's Best-of-N curve (``rodeco.experiments.judged``).

Candidate sets are the replicates: set ``r`` is pool candidates ``r * M / replicates`` onwards. In a set, Best-of-N's
winner is the guide's best of the set's first N candidates (N = 1, 2, 4, ... up to the set's size), and each
replayed method's winner is its winner at the budget of Best-of-n from that set's rows. Judge scores come from (and
fill) the pool's score cache, so a rerun or another experiment on the same pool judges nothing twice; judging is
charged to no method and reported on its own lines.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from rodeco.common.validation import ConfigError
from rodeco.core.judging import Item, Judges
from rodeco.experiments.judged import Curve, Winners, analysis_lines, analyze
from rodeco.experiments.metrics import bon_sizes
from rodeco.plugins import Plugins
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.roles import Choice, RoleBuilder, choose_judges

log = logging.getLogger(__name__)

FIXED = "fixed_alpha_0.5"

Scored = Callable[[int, int, str], float]  # (prompt, candidate, method) -> a score of that winner


def judges_of(
    judge: Any, plugins: Plugins, builder: RoleBuilder, guide: Choice | None, pool: Pool, index: int
) -> Judges:
    """The run's judges (``judge``), built by ``builder`` (served from the pool's cache); each is tried on one
    candidate of prompt ``index``, so a judge that does not apply to these prompts (a reference judge on prompts
    without a reference) stops the run before the analysis, by name."""
    if not judge:
        return Judges()
    judges = builder.judges(choose_judges(judge, plugins, (guide,) if guide is not None else ()))
    first = pool.prompt(index)
    for j in judges.judges:
        try:
            j.scorer([first.request(0)])
        except ConfigError as e:
            raise ConfigError(
                e.key,
                e.value,
                f"{e.problem} (this experiment's prompts)",
                f"{e.fix}; or judge=none, or judge=[...] without {j.name}",
            ) from None
    return judges


def _scored(scores: dict[tuple[int, int], float], i: int, c: int, label: str) -> float:
    """A judge's score of prompt ``i``'s candidate ``c`` (whatever method chose it)."""
    return scores[(i, c)]


def _runs(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A prompt record's method runs per candidate set: the first set's, then each further replicate's."""
    return [rec["methods"], *(x["methods"] for x in rec.get("replicates", []))]


def winners(
    records: dict[int, dict[str, Any]], report: list[int], labels: list[str], M: int, replicates: int
) -> tuple[list[int], dict[str, np.ndarray]]:
    """Best-of-N's sizes in a set and ``{method: [P, S] winning candidate ids}`` (-1: none, e.g. an infeasible
    start or a copy's continuation, which the pool does not hold as a candidate) for Best-of-N (``best_of_<N>``)
    and each method at scale 1."""
    size = M // replicates
    sizes = [n for n in bon_sizes(size) if n <= size]
    out: dict[str, np.ndarray] = {}
    for k, i in enumerate(report):
        rec = records[i]
        final = np.asarray(rec["final"], dtype=np.float64)
        runs = _runs(rec)
        for r in range(replicates):
            first = r * size
            for n in sizes:
                out.setdefault(f"best_of_{n}", np.full((len(report), replicates), -1))[k, r] = first + int(
                    np.argmax(final[first : first + n])
                )
            for label in labels:
                run = runs[r].get(label, {}).get("1", {})
                cid = int(run.get("best_id", -1))
                out.setdefault(label, np.full((len(report), replicates), -1))[k, r] = cid if 0 <= cid < M else -1
    return sizes, out


@dataclass(frozen=True)
class Picks:
    """The winners to judge: ``ids[label]`` [P, S], the candidate id each method (and each Best-of-N size) won on
    each report-half prompt (``report``) in each candidate set (-1: none)."""

    report: list[int]
    replicates: int
    ids: dict[str, np.ndarray]

    def wanted(self, k: int) -> list[int]:
        """The candidates of the ``k``-th report prompt that won anywhere, each once, in order."""
        return sorted({int(x[k, r]) for x in self.ids.values() for r in range(self.replicates) if x[k, r] >= 0})

    def grid(self, label: str, value: Scored) -> np.ndarray:
        """``value(i, c, label)`` of ``label``'s winner ``c`` on each prompt ``i`` and set, [P, S] (NaN: none)."""
        x = self.ids[label]
        out = np.full(x.shape, np.nan)
        for k, i in enumerate(self.report):
            for r in range(self.replicates):
                if x[k, r] >= 0:
                    out[k, r] = value(i, int(x[k, r]), label)
        return out


def judge_winners(pool: Pool, judges: Judges, picks: Picks) -> dict[str, dict[tuple[int, int], float]]:
    """Each judge's score of every winning candidate, ``{judge: {(prompt, candidate): score}}`` (NaN: the judge gave
    none), the pool's score cache saved prompt by prompt."""
    from tqdm.auto import tqdm

    scores: dict[str, dict[tuple[int, int], float]] = {j.name: {} for j in judges.judges}
    for k, i in enumerate(tqdm(picks.report, desc="judging winners", unit="prompt")):
        want = picks.wanted(k)
        reqs = [pool.prompt(i).request(c) for c in want]
        got = judges.score(pool.prompt(i).text, i, [Item(c, r.response, r.response_ids) for c, r in zip(want, reqs)])
        for c in want:
            for e in got[c]:
                scores[e.name][(i, c)] = math.nan if e.score is None else float(e.score)
        for j in judges.judges:
            if isinstance(j.scorer.reward, PoolReward):
                j.scorer.reward.save()  # the pool's cache, prompt by prompt
    return scores


def _guide(records: dict[int, dict[str, Any]], i: int, c: int, label: str) -> float:
    """The guide's (the run's reward's) final score of prompt ``i``'s candidate ``c``."""
    return float(records[i]["final"][c])


def _flops(records: dict[int, dict[str, Any]], i: int, c: int, label: str) -> float:
    """The FLOPs method ``label`` spent on prompt ``i``, averaged over the candidate sets it ran on."""
    return float(
        np.mean([r[label]["1"]["flops"] for r in _runs(records[i]) if "flops" in r.get(label, {}).get("1", {})])
    )


def judge_lines(
    picks: Picks, M: int, costs: dict[str, Any], lost: dict[str, int], analyses: dict[str, Any], refs: list[str]
) -> list[str]:
    """The ``judge_*`` lines to print: what was judged, what judging cost, the winners left out, and the analyses."""
    replicates = picks.replicates
    lines = [
        f"judge_prompts: {len(picks.report)} report-half prompts x {replicates} candidate sets (replicates, "
        f"{M // replicates} candidates each); 95% bootstrap CIs over prompts and sets"
    ]
    lines += [
        f"judge_cost_{name}: {c['calls']} calls, {round(c['tokens'])} tokens, {c['flops'] / 1e12:.3f} TFLOPs "
        f"(as first computed; cached scores are charged what they cost then), {c['seconds']:.1f} s here "
        "(not charged to any method)"
        for name, c in costs.items()
    ]
    lines += [
        f"judge_left_out_{label}: {k} of {picks.ids[label].size} winner(s) not judged (an infeasible start, or a "
        "copy's continuation, which is not a pool candidate)"
        for label, k in lost.items()
    ]
    return lines + analysis_lines(analyses, refs)


def judge_efficiency(
    pool: Pool,
    judges: Judges,
    records: dict[int, dict[str, Any]],
    report: list[int],
    labels: list[str],
    n: int,
    replicates: int,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """Judge the winners, analyse each judge (and the guide, alike) and return the figures with ``lines``, the
    ``judge_*`` lines to print."""
    M = pool.candidates
    sizes, ids = winners(records, report, labels, M, replicates)
    picks = Picks(report, replicates, ids)
    lost = {label: int((x < 0).sum()) for label, x in ids.items() if label in labels and (x < 0).any()}
    methods = [m for m in labels if m not in lost or lost[m] < ids[m].size]
    scores = judge_winners(pool, judges, picks)
    guide = partial(_guide, records)
    scorers: dict[str, Scored] = {"guide": guide, **{name: partial(_scored, s) for name, s in scores.items()}}
    bon_flops = np.array([[records[i]["bon"][str(s)]["flops"] for s in sizes] for i in report])
    curve = Curve(
        sizes,
        np.stack([picks.grid(f"best_of_{s}", guide) for s in sizes], -1),
        {sc: np.stack([picks.grid(f"best_of_{s}", f) for s in sizes], -1) for sc, f in scorers.items()},
        bon_flops,
    )
    flops = partial(_flops, records)
    won = {
        m: Winners(picks.grid(m, guide), {sc: picks.grid(m, f) for sc, f in scorers.items()}, picks.grid(m, flops))
        for m in methods
    }
    refs = [f"best_of_{n}", f"best_of_{sizes[-1]}", *([FIXED] if FIXED in methods else [])]
    analyses = {sc: analyze(curve, won, sc, refs, resamples, seed) for sc in scorers}
    costs = judges.costs()
    return {
        "judges": judges.specs(),
        "judge_cost": costs,
        "refs": refs,
        "analysis": analyses,
        "winner_ids": {label: x.tolist() for label, x in ids.items()},
        "lines": judge_lines(picks, M, costs, lost, analyses, refs),
    }
