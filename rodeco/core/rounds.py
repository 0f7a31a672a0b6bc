"""What the loop does at a decision point, and the settings it runs under: a cohort's ``RoundView`` (its prompts'
views, the budget's rows shared among them), the policy's counts applied to the session (rejections, copies),
and the rows a prompt starts with (``rows_per_prompt``). ``rodeco.core.loop`` runs them."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from rodeco.common.budget import Budget
from rodeco.common.protocols import Policy, Session, StartChooser
from rodeco.common.sampling import copy_stream
from rodeco.common.state import (
    Counts,
    OpenPrompt,
    PolicyInfo,
    PromptRef,
    PromptView,
    RoundView,
    SamplingParams,
    SessionSpec,
    StartView,
)
from rodeco.common.validation import ConfigError, PluginError
from rodeco.common.winner import WinnerRule
from rodeco.core.contracts import Scorer, policy_info
from rodeco.core.trace import Trace

START_BY_POLICY = "policy"  # n: the policy chooses each prompt's start (PolicyInfo.chooses_start)


@dataclass(frozen=True)
class LoopSettings:
    n: int | str  # rows per prompt; "auto": as many as the first round's budget allows; "policy": the policy's
    sampling: SamplingParams
    max_new_tokens: int
    budget: Budget
    seed: int = 0
    ignore_eos: bool = False  # decode exactly max_new_tokens (benchmarks)
    all_candidates: bool = False
    policy_name: str = ""
    reward_name: str = ""
    winner: WinnerRule = WinnerRule()  # how each prompt's winner is chosen among its finished candidates
    stop: tuple[str, ...] = ()  # stop strings: a row ends when its text holds one (rodeco.common.stops)
    check_tokens: int | None = None  # with decode_batch's ``cancelled``: ask it at least every this many tokens

    def __post_init__(self) -> None:
        if self.n == "calibrated":  # the name n=policy had when only the calibrated policy chose a start
            warnings.warn('n="calibrated" is deprecated: use n="policy"', DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "n", START_BY_POLICY)


def session_spec(s: LoopSettings, kv_tokens: int | None, **kw) -> SessionSpec:
    """The spec of a session under the run's settings ``s``: its pool holds ``kv_tokens`` (None: no limit)."""
    return SessionSpec(ignore_eos=s.ignore_eos, kv_tokens=kv_tokens, **kw)


def open_prompt(s: LoopSettings, ref: PromptRef, n: int, first: int = 0) -> OpenPrompt:
    """Prompt ``ref`` as it joins a session under the run's settings ``s``: ``n`` rows, candidates ``first`` on."""
    return OpenPrompt(
        n=n,
        max_new_tokens=s.max_new_tokens,
        sampling=s.sampling,
        seed=ref.seed_or(s.seed),
        stream_key=ref.stream_key,
        index=ref.index,
        stop=tuple(s.stop),
        first=first,
    )


def recorded_for(scorer: Scorer, decider: Scorer, top_k: int = 0) -> dict[str, Any]:
    """What a session records for the roles (``session_spec``'s keywords): the token log-probs either reads, the
    hidden states either reads, the most top-k log-probs either reads or the policy and winner rule read
    (``top_k``)."""
    return {
        "needs_logprobs": scorer.needs_logprobs or decider.needs_logprobs,
        "needs_hidden": scorer.needs_hidden_states or decider.needs_hidden_states,
        "top_logprobs": max(scorer.needs_top_logprobs, decider.needs_top_logprobs, top_k),
    }


def top_logprobs_read(s: LoopSettings, info: PolicyInfo) -> int:
    """The top-k log-probs a cohort's policy and its winner rule (``winner_of``) read at each position."""
    return max(info.top_logprobs, winner_of(s, info).top_logprobs)


def winner_of(s: LoopSettings, info: PolicyInfo) -> WinnerRule:
    """The winner rule of a cohort: the run's (``winner``), with the fields its policy sets (``PolicyInfo.winner``:
    deepconf's confidence-weighted vote) replaced."""
    if not info.winner:
        return s.winner
    try:
        return dataclasses.replace(s.winner, **dict(info.winner))
    except TypeError as e:
        raise PluginError(f"policy {s.policy_name!r} sets winner fields {dict(info.winner)}: {e}") from e


def apply_counts(
    sess: Session,
    trace: Trace,
    rnd: int,
    rows: list[np.ndarray],
    keys: list[int],
    view: RoundView,
    counts: list[Counts],
    at: int | None = None,
) -> None:
    """A decision's counts applied: rows of count 0 leave the batch, a row of count ``c > 1`` gets ``c - 1`` copies,
    each a new candidate (the prompt's next id, a stream derived from its lineage at step ``at``: by default the
    batch's clock ``sess.t``; a prompt on its own clock passes its own) right after its parent."""
    at = sess.t if at is None else at
    drop, parents, ids, streams, copies = [], [], [], [], []
    for pr, c, key in zip(rows, counts, keys):
        made: dict[int, list[int]] = {}
        for local, k in enumerate(c):
            r = int(pr[local])
            if k == 0:
                drop.append(r)
            for j in range(k - 1):
                parent = int(sess.cand[r])
                made.setdefault(parent, []).append(trace.copy(key, parent, rnd))
                parents.append(r)
                ids.append(made[parent][-1])
                streams.append(copy_stream(int(sess.stream[r]), at, j))
        copies.append(made)
    trace.round(view, counts, keys, copies)
    trace.rejected(sess.reject(drop))
    if parents:  # the parents' places once the rejected rows are gone
        kept = np.setdiff1d(np.arange(sess.rows + len(drop)), drop)
        sess.fork(np.searchsorted(kept, parents).tolist(), ids, streams)


def rows_per_prompt(
    s: LoopSettings, budget: Budget, base: int, n_prompts: int, policy: Policy, cap: int | None = None
) -> int:
    """``budget``/``base``: the rows' share of the budget and their start length (``Budget.for_batch``); ``cap``:
    at most this many rows for ``auto`` and ``policy`` (a pool's candidates)."""
    if s.n in ("auto", START_BY_POLICY):
        if budget.kv_tokens is None:
            raise ConfigError(
                "n",
                s.n,
                "needs a finite budget to size the start",
                "set budget.kv_tokens (budget=cpu), budget=cuda on a GPU or budget=engine on vLLM, "
                "or give n as a number",
            )
        most = budget.auto_n(n_prompts, base, base + s.max_new_tokens)
        most = min(most, cap) if cap is not None else most
        if s.n == "auto":
            return most
        if not policy_info(policy, s.policy_name).chooses_start:
            raise ConfigError(
                "n",
                s.n,
                f"policy {s.policy_name!r} does not choose a start (its info declares no chooses_start)",
                "use a policy that does (policy=calibrated), or n=auto",
            )
        view = StartView(
            kv_tokens=int(budget.kv_tokens) // n_prompts,
            base=base,
            max_rows=most,
            max_new_tokens=s.max_new_tokens,
            min_tokens_per_round=budget.min_tokens_per_round,
        )
        assert isinstance(policy, StartChooser)  # policy_info checked that it has choose_start
        n = int(policy.choose_start(view))
        if not 1 <= n <= most:
            raise PluginError(f"policy {s.policy_name!r} chose a start of {n} rows; the budget allows 1 to {most}")
        return n
    n = int(s.n)
    w = budget.row_overhead  # each row's working memory, in tokens
    first = budget.held(base + min(budget.min_tokens_per_round, s.max_new_tokens)) + w
    if budget.kv_tokens is not None and n * n_prompts * first > budget.kv_tokens:
        fit = budget.kv_tokens // (first * n_prompts)
        assert s.budget.kv_tokens is not None  # the batch's share of a finite budget (Budget.for_batch)
        shared = s.budget.kv_tokens - budget.kv_tokens
        held = f"{first} tokens" + (f" ({w} of them working memory)" if w else "")
        raise ConfigError(
            "n",
            n,
            f"{n} rows x {n_prompts} prompt(s) x {held} do not fit budget.kv_tokens="
            f"{s.budget.kv_tokens}"
            + (f" less the {shared} prompt tokens stored once" if shared else "")
            + " for one round of budget.min_tokens_per_round tokens",
            f"use n<={fit}, n=auto, or raise budget.kv_tokens",
        )
    return n


def round_view(
    rnd: int,
    sess: Session,
    rows: np.ndarray,
    scores: np.ndarray,
    trace: Trace,
    s: LoopSettings,
    clock: int,
    fit: int,
    n_start: int,
    tops: list[np.ndarray] | None = None,
) -> tuple[RoundView, list[np.ndarray], list[int]]:
    """A cohort's view at decision point ``rnd``: its prompts' views (its ``rows``, batch indices in order, and their
    ``scores``; ``clock`` its tokens so far), each prompt's batch rows (in the view's local order) and its batch key.
    ``fit``: the most rows the budget lets the cohort decode on (copies may grow it up to that), shared among its
    prompts; the rows it must shed beyond are split among them in proportion to their rows. ``tops``: each row's
    top-k log-probs (its policy reads them), in ``rows``' order."""
    of = sess.prompt_of[rows]
    views, rows_of, keys = [], [], np.unique(of)
    shares = np.full(len(keys), fit // len(keys)) + (np.arange(len(keys)) < fit % len(keys))
    for p, share in zip(keys, shares):
        mine = of == p
        rows_of.append(rows[mine])
        pv = prompt_view(rnd, int(p), sess.cand[rows[mine]].tolist(), scores[mine], trace, clock, int(share), s.seed)
        if tops is not None:
            pv.top_logprobs = [tops[i] for i in np.flatnonzero(mine)]
        views.append(pv)
    _share_min_reject(views, len(rows) - fit)
    view = RoundView(round=rnd, prompts=views, max_rows_next=fit, max_new_tokens=s.max_new_tokens, n_start=n_start)
    return view, rows_of, keys.tolist()


def prompt_view(
    rnd: int, p: int, cands: list[int], scores: np.ndarray, trace: Trace, tokens: int, max_rows: int, seed: int
) -> PromptView:
    """Prompt ``p``'s view at decision point ``rnd``: its rows' candidates and scores, what the trace knows of
    them, its tokens so far, the most rows it may keep, and a generator seeded by the prompt and the round."""
    ref = trace.prompts[p]
    return PromptView(
        prompt_index=ref.index,
        candidate_ids=cands,
        scores=scores,
        history=trace.history(p, cands),
        finished_scores=trace.finished_scores(p),
        tokens_generated=tokens,
        min_reject=0,
        parents=trace.parents(p, cands),
        origins=trace.origins(p, cands),
        finished_ids=trace.finished_ids(p),
        max_rows=max_rows,
        rng=np.random.default_rng([ref.seed_or(seed) & 0xFFFFFFFF, ref.stream_key, rnd]),
    )


def _share_min_reject(views: list[PromptView], total: int) -> None:
    """Split the budget's minimum rejection over prompts in proportion to their rows (each keeps one)."""
    if total <= 0:
        return
    rows = np.array([v.k for v in views])
    share = np.minimum(np.floor(total * rows / rows.sum()).astype(int), rows - 1)
    for i in np.argsort(-(rows - 1 - share), kind="stable"):  # hand out the remainder where room is left
        if share.sum() >= total:
            break
        share[i] += min(total - share.sum(), rows[i] - 1 - share[i])
    for v, m in zip(views, share):
        v.min_reject = int(m)
