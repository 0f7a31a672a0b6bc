"""The contracts of rodeco's parts. Plain ``Protocol``s: no base class needed.

- ``Reward`` and ``Policy``: what a plugin implements; ``rodeco.contracts`` holds every call to a plugin to them.
- ``Generator`` and ``Session``: what an engine implements (the torch engines: ``rodeco.generator``; vLLM:
  ``rodeco.engines.vllm``; a recorded pool: ``rodeco.replay``). The loop, the budget, the accounting and the
  experiments read only these members. What an engine can do is a member with a value (``info: EngineInfo``,
  ``provides_hidden``, ``kv_pool_tokens``, ``memory_report()``), never something generic code probes for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rodeco.shape import KVSpec, ModelShape
from rodeco.state import Counts, OpenPrompt, RoundView, Row, ScoreRequest, SessionSpec, SessionStats, StartView

if TYPE_CHECKING:
    import numpy as np


@dataclass
class RewardCost:
    """What a reward spent; the loop reads it into the run's compute accounting."""

    tokens: float = 0  # a pool's served reward charges each request its share of a call's tokens
    flops: float = 0.0
    calls: int = 0


@dataclass(frozen=True)
class EngineInfo:
    """What a generator's engine does, declared once where the generator is built (``Generator.info``). Generic code
    (the session, the runner's working memory, the budget, the experiments) reads this record, never the engine's
    or its compiled step's members."""

    name: str  # the engine's stable id, as pools record it: "fast", "hf" or "vllm"
    compiled: bool = False  # the decode step is compiled (``generator.compile``: ``rodeco.engines.compiled``)
    # each row's step gathers its prompt's keys and values (``prompt_gather`` in ``rodeco.working``: 2 H_kv D e bytes
    # per prompt token per row)
    gathers_prompt: bool = False
    keys_by_column: bool = False  # keys are stored [..., head_dim, tokens], prompt's and own
    linear: str = "torch"  # the linear kernel: "mkl", "onednn" (prepacked), "torch" (F.linear) or "vllm" (its own)
    # host syncs: a step's random numbers are drawn on the device (not uploaded from the host), and finished rows are
    # counted one step late, so a step waits for no copy to the host (CUDA)
    draws_on_device: bool = False
    counts_finished_late: bool = False
    # prompts may join its running batch (its sessions are ``OpenSession``s: each prompt on its own clock;
    # ``rodeco.open_loop``): the fast engine, eager or compiled, hf, vLLM and a pool's replay; not the compiled step
    # as CUDA graphs
    admits: bool = False
    max_rows: int | None = None  # the rows a batch may hold at most (vLLM's max_num_seqs), None: the budget's


@runtime_checkable
class Reward(Protocol):
    """Scores (prompt, response) pairs, partial or complete.

    Optional class attributes: ``needs_logprobs = True`` makes the loop fill ``ScoreRequest.logprobs`` with the
    generator's per-token log-probabilities; ``needs_hidden_states = True`` fills ``ScoreRequest.hidden_state`` of
    partial requests with the generator's final-layer hidden state (such a reward can only be a ``partial_reward``);
    ``cost: RewardCost`` is read for compute accounting.
    """

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        """One finite float per request, in order; higher is better."""
        ...


@runtime_checkable
class Policy(Protocol):
    """Chooses which candidates go on from a decision point, and how many times.

    Optional: ``info: rodeco.PolicyInfo``, what it needs from the loop (a decision point every ``decision_tokens``
    tokens besides those the budget forces; ``chooses_start``, with a ``choose_start(StartView) -> int`` method
    (``StartChooser``) that sizes each prompt's start under ``n=policy``; ``rejects=False`` for a policy that never
    rejects). Read once, by ``rodeco.contracts.policy_info``; without it, the defaults.
    """

    def select(self, view: RoundView) -> list[list[int] | Counts]:
        """For each ``view.prompts[j]``, the local row indices to keep (a keep list), or ``Counts``: one count per row,
        0 rejects it, 1 keeps it, ``c > 1`` keeps it and adds ``c - 1`` copies.

        After copies: at least one row per prompt that has no finished candidate yet (a prompt with one may end
        here), and at most ``view.max_rows_next`` rows in all (which may exceed the rows there are: copies can
        grow the batch into the budget's room); never fewer rejections in total than ``view.min_reject_total``.
        """
        ...


@runtime_checkable
class StartChooser(Policy, Protocol):
    """A ``Policy`` whose info declares ``chooses_start``: it sizes each prompt's start under ``n=policy``
    (``rodeco.contracts.policy_info`` checks that it has the method)."""

    def choose_start(self, view: StartView) -> int:
        """The rows each prompt starts with: 1 to ``view.max_rows``."""
        ...


@runtime_checkable
class Session(Protocol):
    """Candidate rows of a batch of prompts between decision points (``Generator.open_session``)."""

    prompt_of: np.ndarray  # [rows] each active row's batch key (its prompt's position in the batch)
    cand: np.ndarray  # [rows] each active row's candidate id
    stream: np.ndarray  # [rows] each active row's random stream (rodeco.sampling.copy_stream for a copy's)
    t: int  # tokens generated by every active row
    stats: SessionStats  # what the accounting reads (set by prefill)
    hidden_log: list | None  # (step, candidate ids, hidden [rows, hidden]) per step when SessionSpec.record_hidden

    @property
    def rows(self) -> int: ...
    def prefill(self, prompt_ids: list[list[int]]) -> None: ...
    def decode(self, until: int, pause: int | None = None) -> list[Row]: ...
    def retire_finished(self) -> list[Row]: ...
    def reject(self, rows: list[int]) -> list[Row]: ...
    def fork(self, parents: list[int], ids: list[int], streams: list[int]) -> list[int]: ...
    def active(self) -> list[Row]: ...
    def close(self) -> None: ...


class OpenSession(Session, Protocol):
    """A session prompts may join while it runs (``EngineInfo.admits``; ``rodeco.open_loop``), each prompt on its
    own clock: its rows hold ``clock(prompt)`` tokens, where ``t`` counts the session's steps."""

    def admit(self, prompt_ids: list[list[int]], prompts: list[OpenPrompt]) -> list[int]: ...
    def clock(self, prompt: int) -> int: ...
    def finished_rows(self) -> np.ndarray: ...  # [rows] bool: finished, not yet retired
    def retire_finished(self, prompts: Collection[int] | None = None) -> list[Row]: ...


@runtime_checkable
class Generator(Protocol):
    """A causal LM ready to decode, with what the budget, the FLOPs count and the results need of it."""

    name: str
    device: Any  # torch.device: where the rows decode (a replay: the CPU)
    dtype: Any
    shape: ModelShape
    kv_bytes_per_token: int
    max_context: int | None
    eos_ids: list[int]
    pad_id: int
    provides_hidden: bool  # it can hand rewards the final-layer hidden states
    tokenizer: Any  # the model's transformers tokenizer (a pool saves it beside its candidates)

    @property
    def kv_pool_tokens(self) -> int | None: ...  # its engine's own KV capacity (vLLM's block pool), None when none
    @property
    def kv(self) -> KVSpec: ...  # how its engine stores the KV cache: every memory figure is counted with it
    @property
    def info(self) -> EngineInfo: ...  # what its engine does; ``info.name`` is what a pool records

    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]: ...  # a text, or a conversation's messages
    def decode_text(self, ids: list[int]) -> str: ...
    def flops_per_token(self, context: int) -> float: ...
    def layer_devices(self) -> dict[str, int]: ...
    def memory_report(self) -> dict[str, Any] | None: ...
    def open_session(self, spec: SessionSpec) -> Session: ...
