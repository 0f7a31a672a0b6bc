"""The schemas of the built-in experiments' ``experiment_args`` (stored in Hydra's ConfigStore as
``experiment_args/<name>``). The values live in ``conf/experiment/<name>.yaml``: no field has a default here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


def _help(text: str) -> Any:
    return field(default=MISSING, metadata={"help": text})


@dataclass
class EngineBenchArgs:
    batch: int = _help("rows decoded together (split evenly over the prompts)")
    new_tokens: int = _help("tokens each row decodes (EOS ignored)")
    repeats: int = _help("timed runs of each side, alternating")
    prompts: list[str] = _help("the prompts")


@dataclass
class CorrelationArgs:
    candidates: int = _help("M: pool candidates per prompt (the pool is recorded where prompts are missing)")
    lengths: list[int] = _help("decision lengths (generator tokens)")
    rewards: list[str] = _help("registered rewards to study, each with its config option's parameters")
    bootstrap: int = _help("bootstrap resamples of the prompts, for the 95% CIs")


@dataclass
class EfficiencyArgs:
    n: int = _help("Best-of-n sets the budget: the memory Best-of-n fills at full length, per prompt")
    candidates: int = _help("M: pool candidates per prompt; Best-of-N's curve goes up to N = M")
    alphas: list[float] = _help("policy=fixed at each alpha")
    adaptive_deltas: list[float] = _help("policy=adaptive at each delta")
    policies: list[str] = _help("other policies, with their config options' defaults")
    starts: list[int] = _help("fixed alpha 0.5 started from each of these many rows (the others start at auto)")
    scales: list[int] = _help("budgets as multiples of Best-of-n's (1 must be there: the headline figures)")
    bon_groups: int = _help("Best-of-N's cost: the mean over this many disjoint groups of N candidates")
    bootstrap: int = _help("bootstrap resamples of the report half's prompts, for the 95% CIs")
    live_check: int = _help("report-half prompts on which three policies also run live, to check replay")


@dataclass
class PoolArgs:
    candidates: int = _help("M: candidates recorded per prompt")


@dataclass
class ReplayArgs:
    best_of: Optional[int] = _help("null: the budget is budget.kv_tokens; n: per prompt, what Best-of-n fills")
