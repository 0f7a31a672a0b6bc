"""A lifecycle-hook plugin registered as an instance (entry point ``example_observer`` points at ``observer``): it
counts decision points and rejections across a run, and logs a summary at the end.

It stays quiet (debug level) unless the run used this package's reward or policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rodeco import Compute, PromptResult, RoundView, hookimpl

log = logging.getLogger(__name__)


@dataclass
class RoundObserver:
    rounds: int = 0
    rejected: int = 0
    verbose: bool = False

    @hookimpl
    def rodeco_run_start(self, config: dict[str, Any], n_prompts: int) -> None:
        self.rounds = self.rejected = 0
        names = (config.get("reward", {}).get("name", ""), config.get("policy", {}).get("name", ""))
        self.verbose = any(str(n).startswith("example_") for n in names)

    @hookimpl
    def rodeco_round_end(self, view: RoundView, kept: list[list[int]]) -> None:
        # Called once per decision point (never per token): cheap bookkeeping only.
        self.rounds += 1
        self.rejected += sum(pv.k - len(k) for pv, k in zip(view.prompts, kept))

    @hookimpl
    def rodeco_run_end(self, results: list[PromptResult], compute: Compute) -> None:
        level = logging.INFO if self.verbose else logging.DEBUG
        log.log(
            level,
            "rodeco-example: %d prompt(s), %d decision point(s), %d row(s) rejected",
            len(results),
            self.rounds,
            self.rejected,
        )


observer = RoundObserver()  # what the entry point loads: pluggy registers this instance and calls its methods
