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
    prompts_file: Optional[str] = _help("JSON/JSONL records, relative to the working dir")
    field: str = _help("the record key that holds the prompt text")
    prompts: Optional[list[str]] = _help("an inline list of prompts (then prompts_file is not read)")
    k: int = _help("the first k prompts")
    n: int = _help("candidates per prompt")
    lengths: list[int] = _help("decision lengths (generator tokens)")
    rewards: list[str] = _help("registered rewards to study")
    batch_candidates: int = _help("candidates per teacher-forced forward pass (rewards that need log-probs)")


@dataclass
class EfficiencyArgs:
    prompts_file: Optional[str] = _help("JSON list of records with a prompt field (the paper's subset)")
    text_file: Optional[str] = _help("full prompt text by af_eval_idx (null: prompts_file's text)")
    prompts: Optional[list[str]] = _help("an inline list of prompts (then the files are not read)")
    k: int = _help("the first k prompts")
    n: Any = _help("Best-of-n sets the budget; or 'budget': as many rows as budget.kv_tokens holds")
    pool_factor: int = _help("Best-of-N up to N = pool_factor * n, from a pool of that many samples per prompt")
    n_start: Any = _help("Speculative Rejection's first batch: auto (as many as the first round fits) or a number")
    alphas: list[float] = _help("policy=fixed at each alpha")
    policies: list[str] = _help("other policies, with their config options' defaults")
    scales: list[int] = _help("budgets as multiples of Best-of-n's (1 must be there: the headline figures)")


@dataclass
class PoolArgs:
    candidates: int = _help("M: candidates recorded per prompt")


@dataclass
class ReplayArgs:
    best_of: Optional[int] = _help("null: the budget is budget.kv_tokens; n: per prompt, what Best-of-n fills")
