"""Calling plugins and holding them to their contracts (``rodeco.common.protocols``): a reward returns one finite float
per request, a policy valid row indices or counts within the budget. A broken contract is a ``PluginError`` naming the
plugin."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rodeco.common.backoff import is_oom
from rodeco.common.protocols import Policy, Reward, RewardCost
from rodeco.common.state import Counts, PolicyInfo, PromptView, RoundView, ScoreRequest
from rodeco.common.validation import ConfigError, PluginError


@dataclass(frozen=True)
class RewardInfo:
    """A reward's optional members, read once (``reward_info``): what its requests must carry, and what its scores
    come from beyond its parameters."""

    needs_logprobs: bool = False  # requests carry the generator's token log-probabilities
    needs_hidden_states: bool = False  # requests carry the generator's hidden state (partial and finished)
    identity: str | None = None  # e.g. a trained head's hash: cached scores are keyed by it
    needs_top_logprobs: int = 0  # k: requests carry the k most likely tokens' log-probs at each position
    needs_meta: tuple[str, ...] = ()  # fields every prompt's record must hold (``gold_answer``): checked before a run


def reward_info(reward: Reward) -> RewardInfo:
    """The reward's ``needs_logprobs``, ``needs_hidden_states``, ``identity`` and ``needs_top_logprobs`` (defaults
    where it has none); a ``needs_top_logprobs`` that is not a whole number of at least 0 is a ``PluginError``."""
    k = getattr(reward, "needs_top_logprobs", 0) or 0
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise PluginError(
            f"reward {type(reward).__name__}: needs_top_logprobs is {k!r}; declare how many of the most likely "
            "tokens' log-probs it reads at each position, a whole number (0: none)"
        )
    return RewardInfo(
        bool(getattr(reward, "needs_logprobs", False)),
        bool(getattr(reward, "needs_hidden_states", False)),
        identity_of(reward),
        k,
        tuple(getattr(reward, "needs_meta", ()) or ()),
    )


def reward_cost(reward: Reward) -> RewardCost | None:
    """The cost the reward keeps itself (its ``cost``: tokens, FLOPs, calls), if it keeps one."""
    return getattr(reward, "cost", None)


def identity_of(plugin: object) -> str | None:
    """What a reward's or policy's results depend on beyond its parameters (its ``identity``: a trained head's or a
    calibration's hash), if it says."""
    return getattr(plugin, "identity", None)


class Scorer:
    """Wraps a reward in one role (``reward``: finished rows; ``partial_reward``: active rows at decision points;
    ``judge``: winners after the decode): checks its output and counts its calls (its own ``cost``, if it keeps one,
    is read as is). The reward's optional members (``needs_logprobs``, ``needs_hidden_states``, ``identity``,
    ``cost``, ``report``) are read here, once."""

    def __init__(self, reward: Reward, name: str, role: str = "reward") -> None:
        self.reward, self.name, self.role = reward, name, role
        info = reward_info(reward)
        self.needs_logprobs, self.needs_hidden_states = info.needs_logprobs, info.needs_hidden_states
        self.needs_top_logprobs, self.needs_meta = info.needs_top_logprobs, info.needs_meta
        self.identity: str | None = info.identity  # what its scores come from (a head's hash)
        self._report = getattr(reward, "report", None)  # a judge's own figures beside its mean (a win rate)
        self.calls = 0

    def report(self) -> dict[str, float]:
        """The figures the reward reports of what it scored in this process (``report()``), if it has any."""
        return dict(self._report()) if self._report is not None else {}

    def cost(self) -> RewardCost:
        return reward_cost(self.reward) or RewardCost(calls=self.calls)

    def __call__(self, requests: Sequence[ScoreRequest]) -> np.ndarray:
        if not requests:
            return np.zeros(0)
        try:
            out = self.reward.score(list(requests))
        except Exception as e:
            raise plugin_failure(e, f"{self.role} {self.name!r}", "scoring", [r.prompt_index for r in requests])  # noqa: B904
        self.calls += 1
        try:
            scores = [float(x) for x in out]
        except (TypeError, ValueError) as e:
            raise PluginError(f"reward {self.name!r} returned {type(out).__name__}, not a list of floats: {e}") from e
        if len(scores) != len(requests):
            raise PluginError(f"reward {self.name!r} returned {len(scores)} scores for {len(requests)} requests")
        bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
        if bad:
            raise PluginError(
                f"reward {self.name!r} returned non-finite scores {[scores[i] for i in bad[:5]]} "
                f"for request(s) {bad[:5]}; a reward must return finite floats"
            )
        return np.asarray(scores, dtype=np.float64)


def plugin_failure(e: Exception, plugin: str, doing: str, prompts: Sequence[int]) -> Exception:
    """What to raise when a plugin raised ``e``: rodeco's own errors and out-of-memory (which the run backs off
    from) as they are; anything else as a ``PluginError`` naming the plugin and the prompts it was working on. Raised
    inside the ``except`` (without ``from``: ``e`` itself may be what is raised), so ``e`` stays the context."""
    if isinstance(e, (PluginError, ConfigError)) or is_oom(e):
        return e
    return PluginError(f"{plugin} raised {type(e).__name__}: {e} (while {doing} prompt(s) {sorted(set(prompts))})")


def select_checked(policy: Policy, name: str, view: RoundView) -> list[Counts]:
    """Run the policy and check its answer against the contract in ``rodeco.common.protocols.Policy``: each prompt's
    answer as ``Counts`` (a keep list is read as counts of 0 and 1), the checks applied to the totals after copies."""
    try:
        answer = policy.select(view)
    except Exception as e:
        raise plugin_failure(e, f"policy {name!r}", "deciding for", [p.prompt_index for p in view.prompts])  # noqa: B904
    if len(answer) != len(view.prompts):
        raise PluginError(f"policy {name!r} returned {len(answer)} answers for {len(view.prompts)} prompts")
    out = []
    for a, pv in zip(answer, view.prompts):
        counts = _counts(a, pv, name)
        if counts.total == 0 and not pv.finished_scores:
            raise PluginError(
                f"policy {name!r} kept no row of prompt {pv.prompt_index}, which has no finished "
                "candidate yet; keep at least one"
            )
        out.append(counts)
    total = sum(c.total for c in out)
    if total > view.max_rows_next:
        raise PluginError(
            f"policy {name!r} kept {total} rows (copies included) but the budget allows {view.max_rows_next} at this "
            f"decision point (at least {view.min_reject_total} must go). Fix: raise budget.kv_tokens or lower n, or "
            f"use a policy that rejects (policy=fixed)"
        )
    return out


def _counts(a: list[int] | Counts, pv: PromptView, name: str) -> Counts:
    """One prompt's answer as counts; a keep list must name distinct rows, counts must be one per row, none negative."""
    if isinstance(a, Counts):
        if len(a) != pv.k:
            raise PluginError(
                f"policy {name!r} returned {len(a)} counts for prompt {pv.prompt_index}, which has "
                f"{pv.k} rows; give one count per row"
            )
        if any(c < 0 for c in a):
            raise PluginError(
                f"policy {name!r} returned negative counts {list(a)} for prompt {pv.prompt_index}; a "
                "count is 0 (reject), 1 (keep) or more (copies)"
            )
        return a
    kept = [int(i) for i in a]
    if kept and (len(set(kept)) != len(kept) or min(kept) < 0 or max(kept) >= pv.k):
        raise PluginError(
            f"policy {name!r} returned duplicate or out-of-range rows {kept} for a prompt "
            f"with {pv.k} rows (to copy rows, return rodeco.Counts)"
        )
    return Counts.keep(kept, pv.k)


def policy_info(policy: Policy, name: str) -> PolicyInfo:
    """The policy's declared ``info`` (defaults when it declares none), checked. The one place that reads a
    policy's optional members: a bare ``decision_tokens`` attribute still works, with a DeprecationWarning."""
    info = getattr(policy, "info", None)
    if info is None:
        every = getattr(policy, "decision_tokens", None)
        if every is not None:
            warnings.warn(
                f"policy {name!r} sets a bare decision_tokens attribute; declare "
                f"info = rodeco.PolicyInfo(decision_tokens={every!r}) instead",
                DeprecationWarning,
                stacklevel=2,
            )
        info = PolicyInfo(decision_tokens=every)
    if not isinstance(info, PolicyInfo):
        raise PluginError(f"policy {name!r}: its info is a {type(info).__name__}, not a rodeco.PolicyInfo")
    every = info.decision_tokens
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise PluginError(
            f"policy {name!r} asks for a decision every {every!r} tokens; decision_tokens must be a "
            "whole number of at least 1, or None"
        )
    if info.chooses_start and not callable(getattr(policy, "choose_start", None)):
        raise PluginError(f"policy {name!r} declares chooses_start but has no choose_start(StartView) method")
    return info
