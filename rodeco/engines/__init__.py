"""Forward-pass engines. One interface, all cache surgery behind it:

- ``admit(ids [P, L], mask [P, L]) -> logits [P, V]``: prompts joining the rows there are (none, in a new engine),
  one row each, after them, holding no generated token yet; the last position's logits;
- ``select(rows [B'])``: keep (and repeat) cache rows by index; used for fan-out, pruning and copies;
- ``step(tokens [B]) -> logits [B, V]``: one decode step for every row;
- ``steps_within(rows, tokens, row_overhead, most)``: how many steps (at most ``most``) the rows ``rows`` can take
  while the cache they hold, plus ``row_overhead`` tokens a row, stays within ``tokens``: a cohort's decision point,
  asked of the engine's own bookkeeping (``rodeco.engines.blocks.Blocks.steps_within``);
- ``length``: the longest row's cached tokens, ``rows``: batch size, ``allocated_tokens``: cache slots held now
  (what the budget bounds);
- ``name``: the engine's stable id (``generator.engine``'s value, what a pool records);
- ``shares_prefix``: True if a prompt's cache is stored once for all its rows (then the budget counts it once);
- ``compilable``: ``generator.compile`` applies to it (``rodeco.engines.compiled``);
- ``block``: tokens its cache allocates at a time (1: token by token; the Llama engine: blocks of 16), what the
  budget counts in (``rodeco.common.budget``); ``aligned``: a prompt ends on a block boundary, so its rows share all its
  blocks (``rodeco.common.shape.KVSpec``);
- ``prepare(model, mkl)``: what every session's engine computes with besides the model (the Llama engine's fused,
  prepacked weights), built once per generator and handed to each engine as ``weights``; None for none;
- ``parks``: rows can be set aside with their cache kept while the others step (``park(rows) -> handle``,
  ``unpark(handle)`` puts them back after the rows there are): a prompt that waits for its scores holds its rows;
- ``keep_hidden``: when set, ``last_hidden`` holds the final-layer hidden state (the final norm's output, what the
  LM head reads) of each row's last position after ``admit``/``step``: ``[rows, hidden]``, no extra forward.

``rodeco.engines.fast.LlamaEngine`` runs Llama-family weights on one block pool, sized by the session's budget
(``pool_tokens``); ``rodeco.engines.hf.HFEngine`` drives any ``AutoModelForCausalLM`` with transformers'
``DynamicCache``, the reference for architectures the Llama engine does not implement. The folder also holds every
other engine: ``vllm`` (``VLLMGenerator`` and ``VLLMSession``: vLLM samples inside its engine, so it plugs in at the
session, ``rodeco.common.protocols.Session``), ``blocks`` (the block bookkeeping), ``layout`` (the model-free layouts a
replay counts memory with) and ``base`` (what the torch and vLLM generators share). Which generator a config builds
is chosen above the engines, in ``rodeco.core.loading``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from rodeco.common.validation import ConfigError

# A transformers causal LM (or one of its decoder layers). Its submodules and config are found by name
# (``model.model.layers``, ``config.num_key_value_heads``), which torch's ``Module`` typing cannot express: its
# ``__getattr__`` is typed ``Tensor | Module``. So engines take it as ``Any`` under this name.
HFModel = Any

ENGINES = ("auto", "fast", "paged", "hf", "vllm")  # vllm: rodeco.engines.vllm, at the session level; paged: fast


class Forward(Protocol):
    """What a session drives: an engine, or a replay's model-free layout of one (``rodeco.engines.layout``)."""

    keep_hidden: bool
    parks: bool

    @property
    def rows(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def allocated_tokens(self) -> int: ...
    @property
    def last_hidden(self) -> torch.Tensor | None: ...
    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...
    def select(self, rows: torch.Tensor) -> None: ...
    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...
    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int: ...
    def park(self, rows: torch.Tensor) -> int: ...
    def unpark(self, handle: int) -> None: ...


class Unparked:
    """What an engine or layout whose rows cannot be set aside declares (``parks`` False): a session on it scores on
    the decode thread, whatever waits."""

    parks = False

    def park(self, rows: torch.Tensor) -> int:
        raise NotImplementedError(f"{type(self).__name__} cannot set rows aside (parks is False)")

    def unpark(self, handle: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot set rows aside (parks is False)")


class Engine(Forward, Protocol):
    name: str
    shares_prefix: bool
    compilable: bool
    block: int
    aligned: bool

    def __init__(
        self, model: HFModel, weights: Any = None, compiled: Any = None, pool_tokens: int | None = None
    ) -> None: ...
    @staticmethod
    def prepare(model: HFModel, mkl: bool = False) -> Any: ...


def engine_class(kind: str, model: HFModel) -> type[Engine]:
    """The engine ``generator.engine=kind`` selects for ``model`` (``auto``: the Llama engine when it can run the
    model; ``paged`` is another name of ``fast``, the one Llama engine)."""
    from rodeco.engines.hf import HFEngine

    if kind in ("auto", "fast", "paged"):
        from rodeco.engines.fast import LlamaEngine, supports

        why = supports(model)
        if why is None:
            return LlamaEngine
        if kind != "auto":
            raise ConfigError(
                "generator.engine",
                kind,
                f"the {kind} engine cannot run this model: {why}",
                "use generator.engine=hf (any causal LM) or auto",
            )
    elif kind != "hf":
        raise ConfigError("generator.engine", kind, "unknown engine", f"use one of {', '.join(ENGINES)}")
    return HFEngine
