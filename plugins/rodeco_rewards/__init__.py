"""rodeco's built-in rewards, registered through the ``rodeco`` entry-point group like any third-party plugin,
with their config options (``conf/reward``) and the embedded reward model's experiments (``conf/experiment``).

Nothing heavy is imported here: each factory loads its models when a run builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rodeco import hookimpl
from rodeco_rewards.callable_reward import FunctionReward, build_custom, response_length, value_function

__all__ = ["FunctionReward", "rodeco_register_rewards", "value_function"]

CONF_DIR = Path(__file__).parent / "conf"


@hookimpl
def rodeco_register_rewards(register: Callable[..., None]) -> None:
    _register_response_rewards(register)
    _register_partial_scorers(register)
    _register_judges(register)


def _register_response_rewards(register: Callable[..., None]) -> None:
    """The rewards a run decodes by: the generator's own signals, the reward models, and their combinations."""
    from rodeco_rewards.callable_reward import CustomParams, LengthParams
    from rodeco_rewards.composite import CompositeParams, build_composite
    from rodeco_rewards.logprob import LogProbParams, build_logprob
    from rodeco_rewards.minilm.reward import MiniLMParams, build_minilm_rm
    from rodeco_rewards.preference_rm import PreferenceRMParams, build_preference_rm

    register(
        "logprob",
        build_logprob,
        "log-probability of the response (mean, sum or -perplexity), generator's own",
        params=LogProbParams,
    )
    from rodeco_rewards.confidence import ConfidenceParams, build_confidence

    register(
        "confidence",
        build_confidence,
        "the generator's own token confidence (DeepConf): -mean top-k log-prob, lowest window, mean or tail",
        params=ConfidenceParams,
    )
    from rodeco_rewards.verifier import VerifierParams, build_verifier

    register(
        "verifier",
        build_verifier,
        "a head trained on gold labels (rodeco experiment=verifier_train): log-odds that the answer is right",
        params=VerifierParams,
    )
    register(
        "minilm_rm",
        build_minilm_rm,
        "the embedded default: MiniLM embeddings + a head trained on AlpacaEval prefs",
        params=MiniLMParams,
    )
    register(
        "preference_rm",
        build_preference_rm,
        "any AutoModelForSequenceClassification reward model (hub name or local dir)",
        params=PreferenceRMParams,
    )
    register(
        "composite", build_composite, "a weighted sum of named rewards, optionally standardized", params=CompositeParams
    )
    register(
        "length",
        value_function(response_length, params=LengthParams),
        "characters of the response / scale (a value function; the length-only baseline)",
        params=LengthParams,
    )
    register(
        "custom", build_custom, "any registered reward or value function, named by reward.function", params=CustomParams
    )


def _register_partial_scorers(register: Callable[..., None]) -> None:
    """The learned heads that score partial responses only (trained by ``rodeco experiment=value_train``)."""
    from rodeco_rewards.learned_heads import HeadParams, build_text_value, build_value_head

    register(
        "value_head",
        build_value_head,
        "learned partial scorer: a head on the generator's hidden state "
        "(partial_reward only; rodeco experiment=value_train)",
        params=HeadParams,
    )
    register(
        "text_value",
        build_text_value,
        "learned partial scorer: a head on the embedded RM's features of the "
        "partial text (rodeco experiment=value_train)",
        params=HeadParams,
    )


def _register_judges(register: Callable[..., None]) -> None:
    """The judges: rewards that grade finished responses (against a reference, a gold answer, or another model)."""
    from rodeco_rewards.gold import GoldParams, build_gold
    from rodeco_rewards.reference import ReferenceParams, RefSimParams, build_chrf, build_ref_sim

    register(
        "chrf",
        build_chrf,
        "a judge: chrF2 (0-100) against AlpacaEval's GPT-4-Turbo reference answer (AlpacaEval prompts only)",
        params=ReferenceParams,
    )
    register(
        "ref_sim",
        build_ref_sim,
        "a judge: cosine of SmolLM2-135M mean hidden states, response vs AlpacaEval's "
        "reference answer (AlpacaEval prompts only)",
        params=RefSimParams,
    )
    register(
        "gold",
        build_gold,
        "a judge: 1 if the response's answer is the prompt's gold answer, by the task's own checker, else 0 "
        "(judge=arith_gold: the scripts/arith_bench.py problems)",
        params=GoldParams,
    )
    from rodeco_rewards.llm_judge import LLMJudgeParams, build_llm_judge

    register(
        "llm_judge",
        build_llm_judge,
        "a judge: an LLM behind an OpenAI-compatible API prefers the response or "
        "AlpacaEval's reference, both orders, temperature 0 (AlpacaEval prompts only)",
        params=LLMJudgeParams,
    )
    from rodeco_rewards.smollm_judge import JudgeParams, build_smollm_judge

    register(
        "smollm_judge",
        build_smollm_judge,
        "UNVALIDATED (0.645 on held-out AlpacaEval pairs vs 0.807 for length alone): "
        "a judge: a length-controlled Bradley-Terry head on SmolLM2-135M "
        "hidden states, trained on AlpacaEval prefs (rodeco experiment=judge_train)",
        params=JudgeParams,
    )


@hookimpl
def rodeco_register_experiments(register: Callable[..., None]) -> None:
    from rodeco_rewards.experiments import (
        PrefixTrainArgs,
        RMBenchArgs,
        RMEvalArgs,
        RMTrainArgs,
        ValueTrainArgs,
        learned_heads_train,
        prefix_train,
        rm_bench,
        rm_eval,
        rm_train,
    )

    register(
        "rm_train",
        rm_train.run,
        "train the embedded RM's Bradley-Terry head on AlpacaEval preferences",
        args=RMTrainArgs,
    )
    register(
        "rm_eval",
        rm_eval.run,
        "a reward's held-out pairwise accuracy next to the length-only baseline",
        args=RMEvalArgs,
    )
    register("rm_bench", rm_bench.run, "a reward's scoring throughput at typical partial lengths", args=RMBenchArgs)
    register(
        "value_train",
        learned_heads_train.run,
        "train the learned partial scorers (value_head, text_value) on a training pool; do they beat same?",
        args=ValueTrainArgs,
    )
    register(
        "prefix_train",
        prefix_train.run,
        "refit the embedded RM's head on prefixes too (TCRM's lookahead and "
        "smoothness terms): partial_reward=minilm_prefix",
        args=PrefixTrainArgs,
    )
    from rodeco_rewards.experiments import VerifierTrainArgs, verifier_train

    register(
        "verifier_train",
        verifier_train.run,
        "train the verifier reward on gold-labelled training pools: held-out AUC, calibration, leave-one-task-out",
        args=VerifierTrainArgs,
    )
    from rodeco_rewards.experiments import judge_train

    register(
        "judge_train",
        judge_train.run,
        "train and validate the smollm_judge judge (length-controlled, on "
        "SmolLM2-135M hidden states): held-out accuracy, length correlation, corruption check",
        args=judge_train.JudgeTrainArgs,
    )


@hookimpl
def rodeco_config_dirs() -> list[str]:
    return [str(CONF_DIR)]  # reward/*.yaml, experiment/rm_*.yaml
