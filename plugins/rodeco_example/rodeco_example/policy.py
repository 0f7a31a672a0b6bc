"""``example_keep``: keep the best ``keep`` rows of each prompt at every decision point."""

from __future__ import annotations

from typing import Any

from rodeco import BuildContext, ConfigError, PolicyInfo, RoundView, keep_top, take_params


class KeepPolicy:
    """Per prompt, keep the ``keep`` highest partial scores (fewer if the budget forces it, always one).
    Ties go to the lower candidate id, so the choice is deterministic."""

    info = PolicyInfo()  # what it needs from the loop: no decisions besides the budget's, no start of its own

    def __init__(self, keep: int) -> None:
        self.keep = keep

    def select(self, view: RoundView) -> list[list[int]]:
        return [keep_top(pv, pv.k - self.keep) for pv in view.prompts]


def build_keep(params: dict[str, Any], ctx: BuildContext) -> KeepPolicy:
    p = take_params("policy", params, {"keep": 2})
    k = p["keep"]
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        raise ConfigError("policy.keep", k, "must be a positive integer", "set e.g. policy.keep=2")
    return KeepPolicy(k)
