"""rodeco: reward-oriented decoding. Best-of-N and Speculative Rejection as two policies of one loop.

    import rodeco
    out = rodeco.decode(["Write a haiku about autumn."], n=16, policy="fixed", overrides=["policy.alpha=0.7"])
    print(out.results[0].best.text)

Every name below is public: plugins (rodeco's own and third parties') import only these. Names that need torch
(``load_model_and_tokenizer``, ``resolve_dtype``, ``resolve_device``, ``cache_dir``) are imported on first use, so
that importing ``rodeco`` (or a plugin) stays light.
"""

from __future__ import annotations

from typing import Any

from rodeco.api import Decoder, decode, load_config, run
from rodeco.common.confidence import group_confidences, lowest_group_confidence, token_confidence
from rodeco.common.hookspecs import hookimpl
from rodeco.common.params import take_params
from rodeco.common.protocols import EngineInfo, Policy, Reward, RewardCost, TaskSource
from rodeco.common.ranking import best_first, keep_best, keep_top
from rodeco.common.state import (
    Candidate,
    Compute,
    Counts,
    PolicyInfo,
    PromptRef,
    PromptResult,
    PromptView,
    Round,
    RoundView,
    RunOutput,
    SamplingParams,
    ScoreRequest,
    StartView,
)
from rodeco.common.validation import ConfigError, PluginError, check_number, check_positive_int, node_dict
from rodeco.common.winner import WinnerRule
from rodeco.core.calibration import Calibration, best_probability, rejectable, standardize
from rodeco.core.config import required
from rodeco.core.contracts import Scorer
from rodeco.core.results import ResultsWriter, atomic_write
from rodeco.plugins import BuildContext, Plugins, get_plugin_manager

_LAZY = {
    "load_model_and_tokenizer": "rodeco.core.loading",
    "resolve_dtype": "rodeco.core.loading",
    "resolve_device": "rodeco.common.hardware",  # a *.device setting: auto, cpu, cuda, cuda:N
    "cache_dir": "rodeco.core.loading",
    # pools, for experiments that learn from them (value_train): open one, serve a reward from its cache
    "open_pool": "rodeco.replays.replay",
    "PoolReward": "rodeco.replays.pool_rewards",
    "pool_served": "rodeco.roles",
    "check_training_prompts": "rodeco.experiments.calibrate",
    "prompts_of": "rodeco.tasks",
    "data_root": "rodeco.core.data",
    "find_data_file": "rodeco.core.data",
}

__all__ = [
    # running
    "decode",
    "Decoder",
    "load_config",
    "run",
    "RunOutput",
    "PromptRef",  # what Decoder.batch and Decoder.request take: a prompt with its index, stream key and seed
    "SamplingParams",
    # writing plugins: hooks, contracts, what they see and return
    "hookimpl",
    "BuildContext",
    "Plugins",
    "get_plugin_manager",
    "TaskSource",
    "Policy",
    "Reward",
    "RewardCost",
    "EngineInfo",
    "Scorer",
    "ScoreRequest",
    "PromptView",
    "RoundView",
    "PolicyInfo",
    "StartView",
    "Counts",
    "keep_top",
    "keep_best",
    "best_first",
    "token_confidence",  # a trace's token confidence (DeepConf): the confidence reward, deepconf, the weighted vote
    "group_confidences",
    "lowest_group_confidence",
    "Candidate",
    "Compute",
    "PromptResult",
    "Round",
    "WinnerRule",
    # decision-time calibration (rodeco experiment=calibrate; policy=calibrated)
    "Calibration",
    "best_probability",
    "rejectable",
    "standardize",
    # checking parameters
    "ConfigError",
    "PluginError",
    "take_params",
    "check_number",
    "check_positive_int",
    "node_dict",
    # building blocks for rewards and experiments
    "ResultsWriter",
    "atomic_write",
    "required",
    *_LAZY,
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rodeco' has no attribute {name!r}")
