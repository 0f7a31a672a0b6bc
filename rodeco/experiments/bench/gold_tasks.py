"""What the gold yardstick's steps share (``rodeco.experiments.bench.gold_bench`` runs them,
``rodeco.experiments.bench.gold_report`` reports them): the tasks, guides, rules and sizes, the ``gold`` judge over a
pool, and where each split's pools and records are."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPORT_SEED, SELECT_SEED = 7, 1000  # far apart: reasoning-gym's problem i of seed s is problem i - 1 of seed s + 1
MAX_NEW = 64
TOP_K = 5
# task -> reasoning-gym settings tried on the selection seed (easy: a 135M model gets some right)
CANDIDATES: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "letter_counting": {"min_words": 3, "max_words": 5},
}
GUIDES = ("logprob", "confidence", "verifier", "minilm_rm")
RULES = ("reward", "majority", "weighted", "confidence")
BON = (1, 2, 4, 8, 16, 32, 64)
SEARCH = {"beam": "beam", "dvts": "dvts", "pf": "particle_filter"}


class Gold:
    """The ``gold`` judge over a pool's texts, each (problem, text) checked once."""

    def __init__(self) -> None:
        import rodeco

        self.plugins = rodeco.get_plugin_manager()
        self.judge = self.plugins.build_reward({"name": "gold"}, rodeco.BuildContext(plugins=self.plugins))
        self.cache: dict[tuple[int, str], float] = {}

    def __call__(self, p: Any, text: str) -> float:
        from rodeco import ScoreRequest

        key = (p.index, text)
        if key not in self.cache:
            req = ScoreRequest(p.text, text, (), partial=False, prompt_index=p.index, meta=p.meta)
            self.cache[key] = self.judge.score([req])[0]
        return self.cache[key]


def pool_gold(pool: Any, gold: Gold) -> dict[int, list[float]]:
    """Every pool candidate's gold score, per problem: the any-of-N ceiling."""
    return {i: [gold(pool.prompt(i), c.text) for c in pool.prompt(i).candidates] for i in pool.indices()}


def chosen(a: argparse.Namespace) -> dict[str, dict[str, Any]]:
    f = a.out / "select.json"
    if not f.is_file():
        raise SystemExit(f"no {f}: run `python scripts/gold_bench.py select --out {a.out}` first")
    sel = json.loads(f.read_text())
    return {t: v["config"] for t, v in sel.items() if v["kept"]}


def pools_of(out: Path, split: str) -> Path:
    """Where a split's pools are: the report problems' (``record``) or the selection problems' (``select``)."""
    return out / ("pools" if split == "report" else "select")


def runs_of(out: Path, split: str) -> Path:
    """Where the ``run`` and ``search`` steps write a split's records."""
    return out / ("runs" if split == "report" else "runs_select")


def records(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """The problem records of a ``run`` or ``search`` file (one JSON line each, appended as problems finish), without
    a last line cut short (a run stopped while writing it, or still writing it). ``repair`` (the writer, before it
    resumes): that line is also dropped from the file, so the run appends after whole records and its problem runs
    again; a reader leaves the file alone."""
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")
    out = [json.loads(line) for line in lines[:-1]]  # every line that ends with a newline was written whole
    if lines[-1] and repair:
        log.warning("%s: dropping a record cut short (%d characters); its problem runs again", path, len(lines[-1]))
        with path.open("r+") as f:
            f.truncate(sum(len(line.encode()) + 1 for line in lines[:-1]))
    return out
