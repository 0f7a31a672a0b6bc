"""Plain data passed between the loop, the sessions, the plugins and the results writer.

Nothing here imports torch: rewards and policies can be written and tested with lists and numpy alone.

Identities (``docs/guide.md#identities``). A prompt has a *dataset index* (``PromptRef.index``: results'
``prompt_index``, ``ScoreRequest.prompt_index``, a pool's key), a *stream key* (``PromptRef.stream_key``: mixed into
every one of its rows' random streams and vLLM seeds; by default its dataset index) and a *batch key* (its position
in the batch: ``Row.prompt``, a session's ``prompt_of``). A candidate has an *id* (``candidate_id``: results,
``PromptView.candidate_ids``, ``ScoreRequest.candidate_id``, the trace's key), a *stream* (``Row.stream``: its
random-stream key within its prompt, what makes candidate ``i`` the same sample under Best-of-N and Speculative
Rejection), a *pool index* (which recorded candidate a replayed row is) and an engine *request seed* (vLLM). A
starting candidate's id, stream and pool index are one number. A *copy* (a decision's count above 1,
``rodeco.lineage``) is a new candidate: the next free id of its prompt, and a stream derived from its parent's stream,
the step of the fork and its place among its siblings, so the same copy has the same stream under any policy (a
pool stores its continuation under that stream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 50  # 0 disables
    top_p: float = 1.0  # 1.0 disables

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class PromptRef:
    """One prompt of a batch: its dataset index, its text, its stream key (None: the dataset index), its own seed
    (None: the run's ``seed``; a server's requests each bring theirs) and, for a conversation, its messages (what the
    chat template encodes; ``text`` is then the conversation as the rewards read it). ``meta`` holds the data
    record's fields beyond its prompt (a task's gold answer): rewards and judges receive it as ``ScoreRequest.meta``."""

    index: int
    text: str
    stream: int | None = None
    seed: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) pairs
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def gold_answer(self) -> str | None:
        """The record's gold answer as a string (``meta["gold_answer"]``), or None where it has none."""
        return gold_answer_of(self.meta)

    @property
    def stream_key(self) -> int:
        return self.index if self.stream is None else int(self.stream)

    def seed_or(self, run_seed: int) -> int:
        return run_seed if self.seed is None else int(self.seed)

    @property
    def source(self) -> str | list[dict[str, str]]:
        """What the generator encodes: the text, or the conversation's messages."""
        return self.text if self.messages is None else [{"role": r, "content": c} for r, c in self.messages]


GOLD = "gold_answer"  # the meta field that holds a record's gold answer


def gold_answer_of(meta: Mapping[str, Any] | None) -> str | None:
    """``meta``'s gold answer as a string, or None where it has none."""
    g = (meta or {}).get(GOLD)
    return None if g is None else str(g)


@dataclass
class Row:
    """A candidate's response so far: an active row, or one that left the batch (EOS, max_new_tokens, rejected)."""

    prompt: int  # batch key: the prompt's position in the batch
    candidate_id: int
    token_ids: list[int]
    logprobs: list[float] | None
    reason: str = ""  # "" while active; "eos" | "stop" (a stop string) | "length" | "rejected" | "settled" once it left
    stop: int | None = None  # the EOS token that ended it (reason "eos")
    hidden: np.ndarray | None = None  # [hidden] the state that sampled its latest token (when asked)
    stream: int | None = None  # the random-stream key within its prompt (None: the candidate id)
    top_logprobs: list[list[float]] | None = None  # [tokens][k] the k most likely tokens' log-probs (when asked)


class Counts(tuple):
    """A policy's answer for one prompt as counts, one per row (local order): 0 rejects the row, 1 keeps it, ``c > 1``
    keeps it and adds ``c - 1`` copies (new candidates that continue from its tokens and cache). Its own type, so that
    a keep list ``[0, 1]`` (rows 0 and 1 kept) is never read as counts; a plain list is a keep list."""

    def __new__(cls, counts: Sequence[int] | np.ndarray) -> Counts:
        return super().__new__(cls, (int(c) for c in counts))

    @classmethod
    def keep(cls, kept: Sequence[int], k: int) -> Counts:
        """The counts of the keep list ``kept`` among ``k`` rows (1 for each kept row, 0 elsewhere)."""
        out = [0] * k
        for i in kept:
            out[int(i)] = 1
        return cls(out)

    @property
    def total(self) -> int:
        return sum(self)

    @property
    def kept(self) -> list[int]:
        """The rows that go on (count at least 1), in local order."""
        return [i for i, c in enumerate(self) if c > 0]

    def __repr__(self) -> str:
        return f"Counts({list(self)})"


@dataclass
class SessionStats:
    prefill_tokens: np.ndarray  # [P]
    decode_tokens: np.ndarray  # [P]
    decode_flops: np.ndarray  # [P]
    steps: int = 0
    peak_kv_tokens: int = 0
    peak_kv_bytes: int = 0
    step_rows: list[int] = field(default_factory=list)  # rows forwarded at each decode step
    step_context: list[int] = field(default_factory=list)  # cached tokens per row before each step
    step_seconds: list[float] = field(default_factory=list)  # wall time of each step (forward, sampling; no sync)
    preemptions: int = 0  # rows the engine preempted (vLLM's scheduler; rodeco's own engines never do)


@dataclass(frozen=True)
class SessionSpec:
    """What a session is opened with (``Generator.open_session``), for all its prompts: what the rewards need, whether
    rows ignore EOS, ``record_hidden`` (keep every step's hidden states in ``Session.hidden_log``: recording a pool)
    and ``kv_tokens``, the KV memory its rows may hold together (the engine's block pool, fixed when the session
    opens; None: no limit). Each prompt's own settings come with it when it is admitted (``OpenPrompt``)."""

    needs_logprobs: bool = False
    needs_hidden: bool = False
    top_logprobs: int = 0  # k: record the k most likely tokens' log-probs at each step (0: none)
    ignore_eos: bool = False
    record_hidden: bool = False
    kv_tokens: int | None = None


@dataclass(frozen=True)
class OpenPrompt:
    """A prompt that joins a session (``Session.admit``) with its own settings: its rows (candidates ``first`` to
    ``first + n - 1``; a replay wraps round its pool), length, sampling, stop strings, seed, stream key and dataset
    index (a replay's key into its pool). Its rows draw their random numbers on its own clock, so they are the
    samples it would get decoding alone."""

    n: int
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    stream_key: int
    index: int = 0
    stop: tuple[str, ...] = ()
    first: int = 0


@dataclass(frozen=True)
class ScoreRequest:
    """One (prompt, response) pair to score.

    ``response_ids`` are the generator's token ids; rewards that have their own tokenizer re-tokenize
    ``response``. ``logprobs`` holds the generator's log-probability of each response token and is filled only
    when the reward declares ``needs_logprobs = True``. ``hidden_state`` is the generator's final-layer hidden state
    (the final norm's output) at the position that sampled the response's last token, filled when the reward
    declares ``needs_hidden_states = True``: for a partial request, after reading the prompt and all response tokens
    but the last; for a finished one, the state of its last step, which sampled its EOS (after reading the whole
    response) or, cut at its length, its last token. ``top_logprobs`` holds, for each response token,
    the log-probabilities of the generator's ``k`` most likely tokens at that position (descending), filled when the
    reward declares ``needs_top_logprobs = k``. ``meta`` holds the prompt's data record beyond its text (a task's
    ``gold_answer``, its checker's fields); empty where the record has none.
    """

    prompt: str
    response: str
    response_ids: tuple[int, ...]
    partial: bool
    prompt_index: int = 0
    candidate_id: int = 0
    logprobs: tuple[float, ...] | None = None
    hidden_state: np.ndarray | None = field(default=None, compare=False)
    stream: int | None = None  # the candidate's random stream (a copy's names its lineage; a pool keys copies by it)
    top_logprobs: tuple[tuple[float, ...], ...] | None = None  # [tokens][k]
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class PromptView:
    """What a rejection policy sees of one prompt at a decision point.

    Rows are indexed locally ``0..k-1``; ``candidate_ids[i]`` names row ``i`` across rounds.
    """

    prompt_index: int
    candidate_ids: list[int]
    scores: np.ndarray  # [k] partial rewards at this decision point
    history: np.ndarray  # [k, r] the same candidates' rewards at the r earlier decision points (nan if absent)
    finished_scores: list[float]  # final rewards of this prompt's candidates that already finished
    tokens_generated: int  # response tokens so far (same for every active row)
    min_reject: int  # the budget's share for this prompt: reject at least this many rows
    # lineage (rodeco.lineage): each row's parent candidate id (None: a starting row) and origin, the position
    # (0..n_start-1) among the prompt's starting rows of the row it descends from (its own, for a starting row)
    parents: list[int | None] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    finished_ids: list[int] = field(default_factory=list)  # the candidates of finished_scores, in its order
    max_rows: int = 0  # this prompt's share of the rows the budget fits next round (RoundView.max_rows_next)
    # seeded by (run seed, prompt's stream key, round): a policy that samples (particle_filter) stays reproducible
    rng: np.random.Generator | None = field(default=None, repr=False, compare=False)
    # [k] each row's [tokens, top_logprobs] log-probs of the most likely tokens at each position, when its policy's
    # info asks (PolicyInfo.top_logprobs); None otherwise
    top_logprobs: list[np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def k(self) -> int:
        return len(self.candidate_ids)


@dataclass
class RoundView:
    """Every prompt of the batch at one decision point, plus the budget that binds them together."""

    round: int
    prompts: list[PromptView]
    max_rows_next: int  # the most rows (over all prompts) that fit the next round: may exceed the rows there are
    max_new_tokens: int
    n_start: int = 0  # rows each prompt started with

    @property
    def min_reject_total(self) -> int:
        return max(0, sum(p.k for p in self.prompts) - self.max_rows_next)


@dataclass(frozen=True)
class PolicyInfo:
    """What a policy needs from the loop, declared once as its ``info`` (``rodeco.common.protocols.Policy``); a policy
    without one gets these defaults."""

    decision_tokens: int | None = None  # a decision point every that many tokens too, besides the budget's
    chooses_start: bool = False  # it sizes its own start with choose_start(StartView) -> rows, under n=policy
    rejects: bool = True  # False: it never rejects a row (Best-of-N), so a budget must hold every row to the end
    # k: each row's k most likely tokens' log-probs at each of its positions, in PromptView.top_logprobs (0: none)
    top_logprobs: int = 0
    # fields of the winner rule (rodeco.WinnerRule) it sets whatever winner says, e.g. deepconf's
    # {"rule": "weighted", "weight": "confidence"}; the others (the extractor) stay the run's. None: the run's rule
    winner: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class StartView:
    """What a policy that chooses its own start (``n: policy``) sees: per prompt, the budget for the rows' own
    tokens, the length each row starts from, and the most rows whose first round fits."""

    kv_tokens: int  # per prompt: cache slots for the rows' own tokens (the budget's share)
    base: int  # cached tokens a row starts with (its prompt copy when prompts are not shared)
    max_rows: int  # the most rows per prompt whose first round decodes min_tokens_per_round tokens
    max_new_tokens: int
    min_tokens_per_round: int


@dataclass
class JudgeScore:
    """One judge's score of one response (``rodeco.core.judging``): ``score`` is None when the judge failed on it, and
    ``error`` then names the failure."""

    name: str
    score: float | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "score": self.score}
        if self.error is not None:
            d["error"] = self.error
        return d


def judge_field(scores: Sequence[JudgeScore]) -> dict[str, Any] | list[dict[str, Any]]:
    """What a record holds under ``"judge"``: one judge's ``{"name", "score"}``, or a list of them for several."""
    out = [s.to_dict() for s in scores]
    return out[0] if len(out) == 1 else out


def judge_entries(field_: dict[str, Any] | list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """A record's ``"judge"`` field (either shape, or absent) as ``{judge name: {"name", "score"[, "error"]}}``."""
    if not field_:
        return {}
    return {e["name"]: e for e in ([field_] if isinstance(field_, dict) else field_)}


@dataclass
class Candidate:
    candidate_id: int
    token_ids: list[int]
    text: str
    score: float | None  # final reward, or the last partial reward if it was rejected
    finished: bool  # reached EOS or max_new_tokens
    rejected_at_round: int | None = None
    stop_reason: str = ""  # "eos", "stop" (a stop string), "length", "rejected", "settled" (its vote was decided)
    parent: int | None = None  # a copy's parent candidate (None: a starting row); left out of records when None
    forked_round: int | None = None  # the decision point that made the copy
    judge: list[JudgeScore] | None = None  # the judges' scores (``rodeco.core.judging``), set after the decode
    confidence: float | None = None  # its trace's confidence, where the winner rule weighs by it (left out when None)


@dataclass
class Round:
    """One decision point of one prompt."""

    round: int
    tokens_generated: int
    rows_before: int
    rows_kept: int
    kept_ids: list[int]
    rejected_ids: list[int]
    scores: dict[int, float]  # candidate id -> partial score
    min_reject: int
    copies: dict[int, list[int]] = field(default_factory=dict)  # parent id -> its copies' ids (left out when empty)


@dataclass
class Compute:
    """Compute accounting of a run (or one prompt's share of it)."""

    gen_prefill_tokens: int = 0
    gen_decode_tokens: int = 0
    gen_flops: float = 0.0
    reward_tokens: int = 0
    reward_flops: float = 0.0
    reward_calls: int = 0
    # of the reward figures above, what the partial_reward role (scoring active rows at decision points) spent
    partial_reward_tokens: int = 0
    partial_reward_flops: float = 0.0
    partial_reward_calls: int = 0
    peak_kv_bytes: int = 0
    peak_kv_tokens: int = 0
    decode_steps: int = 0
    preemptions: int = 0  # rows the engine preempted in the batch (vLLM; a batch figure, like the peak KV)
    time_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds

    @property
    def total_flops(self) -> float:
        return self.gen_flops + self.reward_flops

    def add_time(self, phase: str, seconds: float) -> None:
        self.time_s[phase] = self.time_s.get(phase, 0.0) + seconds

    def add(self, other: Compute) -> None:
        """Add another batch's compute: counts and times summed, peaks maximized."""
        for f in (
            "gen_prefill_tokens",
            "gen_decode_tokens",
            "gen_flops",
            "reward_tokens",
            "reward_flops",
            "reward_calls",
            "partial_reward_tokens",
            "partial_reward_flops",
            "partial_reward_calls",
            "decode_steps",
            "preemptions",
        ):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.peak_kv_bytes = max(self.peak_kv_bytes, other.peak_kv_bytes)
        self.peak_kv_tokens = max(self.peak_kv_tokens, other.peak_kv_tokens)
        for k, v in other.time_s.items():
            self.add_time(k, v)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_flops"] = self.total_flops
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Compute:
        """The inverse of ``to_dict`` (derived and unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: (dict(v) if k == "time_s" else v) for k, v in d.items() if k in known}
        return cls(**kw)


@dataclass
class PromptResult:
    prompt_index: int
    prompt: str
    best: Candidate
    n_start: int
    rounds: list[Round]
    candidates: list[Candidate] | None  # every candidate, when output.all_candidates is on
    compute: Compute  # this prompt's share of its batch's compute
    policy: str = ""
    reward: str = ""
    winner: str = "reward"  # the rule that chose ``best`` (rodeco.common.winner); left out of records at its default
    answer: str | None = None  # the answer a vote chose by (left out when None)
    gold_answer: str | None = None  # the prompt's gold answer, where its record has one (left out when None)
    # the prompt's record (what judges check against): written as ``record`` beside a gold answer, else left out
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)
    judge: list[JudgeScore] | None = None  # the winner's judge scores, set after the decode (left out when None)
    stopped_at: int | None = None  # the tokens at which its vote was settled and its rows stopped (winner.stop)

    @property
    def best_response(self) -> str:
        return self.best.text

    def to_dict(self) -> dict[str, Any]:
        """The record written to results.jsonl. The fields search added (lineage, the winner rule) are left out at
        their defaults, so a run without copies writes the records it wrote before they existed."""
        d = asdict(self)
        d["compute"] = self.compute.to_dict()
        for c in [d["best"]] + (d["candidates"] or []):
            for k in ("parent", "forked_round", "confidence"):
                if c[k] is None:
                    del c[k]
            del c["judge"]
        for c, obj in zip(d["candidates"] or [], self.candidates or []):
            if obj.judge is not None:  # the winner's scores are the record's own "judge"
                c["judge"] = judge_field(obj.judge)
        d.pop("judge")
        if self.judge is not None:
            d["judge"] = judge_field(self.judge)
        for r in d["rounds"]:
            if not r["copies"]:
                del r["copies"]
        if d["winner"] == "reward":
            del d["winner"]
        for k in ("answer", "gold_answer", "stopped_at"):
            if d[k] is None:
                del d[k]
        meta = d.pop("meta")
        if self.gold_answer is not None:
            d["record"] = {k: v for k, v in meta.items() if k != GOLD}
        return d


@dataclass
class RunOutput:
    """What a run returns: a decode's per-prompt results and total compute, or an experiment's figures (``extra``)."""

    results: list[PromptResult]
    compute: Compute
    out_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def fork_order(rows: int, parents: list[int]) -> tuple[list[int], list[int]]:
    """The batch after a fork of ``rows`` rows: each row followed by its copies (``parents[j]``: copy ``j``'s parent),
    as batch indices of the old batch; and the new position of each copy ``j``."""
    by_parent: dict[int, list[int]] = {}
    for j, r in enumerate(parents):
        by_parent.setdefault(int(r), []).append(j)
    order, slots = [], [0] * len(parents)
    for r in range(rows):
        order.append(r)
        for j in by_parent.get(r, ()):
            slots[j] = len(order)
            order.append(r)
    return order, slots
