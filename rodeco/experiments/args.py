"""The schemas of the built-in experiments' ``experiment_args`` (stored in Hydra's ConfigStore as
``experiment_args/<name>``). The values live in ``conf/experiment/<name>.yaml``: no field has a default here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rodeco.core.config import required


@dataclass
class EngineBenchArgs:
    batch: int = required("rows decoded together (split evenly over the prompts)")
    new_tokens: int = required("tokens each row decodes (EOS ignored)")
    repeats: int = required("timed runs of each side, alternating")
    prompts: list[str] = required("the prompts")
    matmul_size: int = required("n of the n x n matmul (generator dtype) that measures the peak")
    engines: list[str] = required(
        "engines rodeco's loop is timed on, alternating ([]: generator.engine; the first "
        "gives rodeco_tokens_per_s; fast-compiled: fast with generator.compile=true)"
    )


@dataclass
class CorrelationArgs:
    candidates: int = required("M: pool candidates per prompt (the pool is recorded where prompts are missing)")
    lengths: list[int] = required("decision lengths (generator tokens)")
    rewards: list[str] = required("registered rewards to study, each with its config option's parameters")
    bootstrap: int = required("bootstrap resamples of the prompts, for the 95% CIs")
    final: Optional[str] = required("null: each reward's partial vs its own final score; a reward: vs its final")


@dataclass
class CalibrateArgs:
    candidates: int = required("M: pool candidates per prompt (the pool is recorded where prompts are missing)")
    lengths: list[int] = required("decision lengths (generator tokens) to measure; the policy interpolates")
    top_k: list[int] = required("k of P(the eventual best is in the partial scores' top k)")
    bootstrap: int = required("bootstrap resamples of the prompts, for the 95% CIs")
    exclude_data: list[str] = required("data options (evaluation sets) none of whose prompts may be calibrated on")
    output: Optional[str] = required("where to write the calibration file (null: calibration.json in the run dir)")


@dataclass
class EfficiencyArgs:
    n: int = required("Best-of-n sets the budget: the memory Best-of-n fills at full length, per prompt")
    candidates: int = required("M: pool candidates per prompt; Best-of-N's curve goes up to N = M")
    alphas: list[float] = required("policy=fixed at each alpha")
    adaptive_deltas: list[float] = required("policy=adaptive at each delta")
    policies: list[str] = required(
        "other policies, with their config options' defaults: name (from n=auto) or "
        "name@start (from that many rows, e.g. particle_filter@4)"
    )
    calibrated_deltas: list[float] = required("policy=calibrated at each delta, from n=auto and n=calibrated")
    partial_rewards: list[str] = required("what decides: same, oracle (the ceiling), reward options (learned heads)")
    starts: list[int] = required("fixed alpha 0.5 started from each of these many rows (the others start at auto)")
    scales: list[int] = required("budgets as multiples of Best-of-n's (1 must be there: the headline figures)")
    bon_groups: int = required(
        "Best-of-N's cost: the mean over this many disjoint groups of N candidates "
        "(fewer where the pool holds fewer: M // N)"
    )
    bootstrap: int = required("bootstrap resamples of the report half's prompts, for the 95% CIs")
    replicates: int = required(
        "each Speculative Rejection method replayed from this many sets of pool candidates "
        "(offsets r * M / replicates, wrapping round); figures average them, and each "
        "bootstrap resample draws one per prompt (candidate-sampling variance in the CIs)"
    )
    live_check: int = required("report-half prompts on which three policies also run live, to check replay")


@dataclass
class PoolArgs:
    candidates: int = required("M: candidates recorded per prompt")
    top_logprobs: int = required("k: the k most likely tokens' log-probs recorded at each position (0: none)")
    batch_prompts: int = required("prompts recorded together in one session (more rows a step: faster)")
    hidden_states: bool = required("record the generator's hidden states (one prompt at a time; what value heads read)")


@dataclass
class ReplayArgs:
    best_of: Optional[int] = required("null: the budget is budget.kv_tokens; n: per batch, what Best-of-n fills")
