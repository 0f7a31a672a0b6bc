"""``data.source=reasoning_gym``: problems of reasoning-gym's procedural tasks (Apache-2.0), each with its gold
answer, checked by the task's own ``score_answer``.

A problem's record (``ScoreRequest.meta``) holds ``gold_answer``, ``source``, ``task``, the task's ``config``, the
``seed`` and ``index`` it was drawn at, and reasoning-gym's ``metadata`` (what some checkers read). The extractor a
task's answers need is declared here (``EXTRACTORS``): the tasks whose answer is one number take the response's last
number; the others its first line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from rodeco import ConfigError

SOURCE = "reasoning_gym"
EXTRA = "pip install 'rodeco[tasks]' (reasoning-gym)"
# tasks whose gold answer is one number: the response's last number is its answer
NUMERIC = frozenset(
    {
        "basic_arithmetic",
        "chain_sum",
        "leg_counting",
        "letter_counting",
        "count_bits",
        "decimal_arithmetic",
        "decimal_chain_sum",
        "gsm_symbolic",
        "products",
        "prime_factorization_count",
        "fraction_simplification_count",
        "time_intervals_count",
        "number_of_islands",
    }
)


def _rg() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "data.source", SOURCE, "needs the reasoning-gym package, which is not installed", EXTRA
        ) from None
    return reasoning_gym


def _plain(x: Any) -> Any:
    """``x`` as JSON holds it (tuples as lists, other objects as strings): what a pool and results.jsonl keep."""
    return json.loads(json.dumps(x, default=str))


@lru_cache(maxsize=64)
def _scorer(task: str) -> Any:
    return _rg().get_score_answer_fn(task)


class ReasoningGym:
    """The ``reasoning_gym`` task source (``rodeco.common.protocols.TaskSource``)."""

    def generate(self, task: str, size: int, seed: int, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        rg = _rg()
        try:
            ds = rg.create_dataset(task, seed=seed, size=size, **config)
        except (KeyError, ValueError) as e:
            raise ConfigError("data.task", task, f"reasoning-gym refused the task: {e}", _fix(rg)) from None
        except (TypeError, AssertionError) as e:
            raise ConfigError(
                "data.task_config", config, f"{task} refused its settings: {e}", f"see {task}'s config in reasoning-gym"
            ) from None
        out = []
        for i in range(size):
            entry = ds[i]
            rec = {
                "gold_answer": str(entry["answer"]),
                "source": SOURCE,
                "task": task,
                "config": _plain(config),
                "seed": seed,
                "index": i,
                "metadata": _plain(entry.get("metadata", {})),
            }
            out.append((str(entry["question"]), rec))
        return out

    def check(self, answer: str | None, record: Mapping[str, Any]) -> float:
        """The task's own checker on ``answer`` (None: no answer, 0.0)."""
        if answer is None:
            return 0.0
        entry = {"question": "", "answer": str(record["gold_answer"]), "metadata": dict(record.get("metadata", {}))}
        return float(_scorer(str(record["task"]))(answer, entry))

    def extractor(self, task: str) -> str:
        return "last_number" if task in NUMERIC else "first_line"


def _fix(rg: Any) -> str:
    try:
        from reasoning_gym.factory import DATASETS

        names = ", ".join(sorted(DATASETS)[:12])
        return f"name a reasoning-gym task ({names}, ...)"
    except ImportError:
        return "name a reasoning-gym task"
