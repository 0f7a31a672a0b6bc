"""rodeco: reward-oriented decoding. Best-of-N and Speculative Rejection as two policies of one loop.

    import rodeco
    out = rodeco.decode(["Write a haiku about autumn."], n=16, policy="fixed", overrides=["policy.alpha=0.7"])
    print(out.results[0].best.text)
"""

from __future__ import annotations

from rodeco.api import decode, load_config
from rodeco.hookspecs import hookimpl
from rodeco.protocols import BuildContext, Policy, Reward, RewardCost
from rodeco.state import Candidate, Compute, PromptResult, PromptView, Round, RoundView, ScoreRequest

__all__ = ["decode", "load_config", "hookimpl", "BuildContext", "Policy", "Reward", "RewardCost", "Candidate",
           "Compute", "PromptResult", "PromptView", "Round", "RoundView", "ScoreRequest"]
__version__ = "0.1.0"
