"""rodeco's built-in rewards, registered through the ``rodeco`` entry-point group like any third-party plugin.

Nothing heavy is imported here: each factory loads its models when a run builds it.
"""

from __future__ import annotations

from rodeco.hookspecs import hookimpl
from rodeco_rewards.value_function import FunctionReward, build_custom, response_length, value_function

__all__ = ["FunctionReward", "rodeco_register_rewards", "value_function"]


@hookimpl
def rodeco_register_rewards(register):
    from rodeco_rewards.composite import build_composite
    from rodeco_rewards.logprob import build_logprob
    from rodeco_rewards.minilm.reward import build_minilm_rm
    from rodeco_rewards.preference_rm import build_preference_rm

    register("logprob", build_logprob, "token log-probability of the response (mean, sum or -perplexity) under the "
             "generator or a separate scoring LM")
    register("minilm_rm", build_minilm_rm, "the embedded default: all-MiniLM-L6-v2 embeddings + a Bradley-Terry head "
             "trained on AlpacaEval preferences")
    register("preference_rm", build_preference_rm, "any AutoModelForSequenceClassification reward model (hub name "
             "or local dir)")
    register("composite", build_composite, "a weighted sum of named rewards, optionally standardized")
    register("length", value_function(response_length, params={"scale": 1.0}),
             "characters of the response / scale (a value function; the length-only baseline)")
    register("custom", build_custom, "any registered reward or value function, named by reward.function")
