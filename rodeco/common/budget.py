"""A memory budget: what it lets a cohort start with and keep, in the engine's units.

The budget ``B`` is the most KV-cache tokens a cohort's rows may hold: on CPU ``budget.kv_tokens``; on CUDA, unless
given, ``B = floor((free_bytes - reserve) * memory_fraction / kv_bytes_per_token)`` with
``kv_bytes_per_token = 2 * layers * kv_heads * head_dim * dtype_bytes`` (keys and values). It sizes the engine's
block pool, fixed when the session opens, and each cohort holds a quota of it (its own ``kv_tokens``).

**Decision points are asked of the engine's block bookkeeping**, as vLLM's scheduler asks its KV manager: before a
round, ``Session.steps_within(rows, B, w, ...)`` says how many steps the cohort's rows can take before the blocks they
hold (plus each row's working memory ``w``) would pass its quota (``rodeco.engines.blocks.Blocks.steps_within`` on
the Llama engine and its replay layout; the padded count on ``hf``; vLLM's block count on ``vllm``). The arithmetic
here bounds what the policy may keep and what a cohort may start with, in the same units:

A cohort's prompts of ``P_i`` tokens hold ``S`` tokens once for all their rows, and each row starts from ``base``
tokens of its own (``for_batch``): on the Llama engine (``KVSpec.aligned``, blocks of ``b``) each prompt is held whole
in ``ceil(P_i / b)`` blocks and a row's own tokens start in a block of its own (``base = 0``); on vLLM a prompt's full
blocks before its last token are shared and each row holds the rest of it (``base``: the longest such tail); an
engine that copies the prompt into every row (``hf``) shares nothing (``S = 0``, ``base`` the longest prompt). The
rows share ``B' = B - S``. A row of own length ``L`` holds ``held(L) = ceil(L / b) * b`` slots and ``w`` tokens of
working memory (``row_overhead``: ``WorkingMemory.tokens``, its logits, sampling copies and attention scores,
``rodeco.common.working``). At a decision point the next round must decode at least ``m = min(min_tokens_per_round,
L_max - L)`` tokens, so at most ``floor(B' / (held(L + m) + w))`` rows may go on (``max_rows``: the policy must reject
the rest); ``n: auto`` is ``floor(B' / ((held(base + m) + w) * G))`` for ``G`` prompts; and a cohort must fit
``G * (held(base + N) + w)`` plus its shared tokens to start (``check_feasible``). Rows are freed before the next
round allocates, so the pool never holds more than ``B``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rodeco.common.shape import KVSpec, kv_bytes_per_token
from rodeco.common.validation import ConfigError

__all__ = [
    "Budget",
    "KVSpec",
    "block_shared",
    "budget_from_device",
    "budget_from_devices",
    "full_length_tokens",
    "kv_bytes_per_token",
]

MIN_TOKENS_PER_ROUND = 8  # the default of ``m`` (``budget.min_tokens_per_round``; the schema reads it from here)


@dataclass(frozen=True)
class Budget:
    kv_tokens: int | None  # None: no limit, so no decision point (every row decodes to the end)
    min_tokens_per_round: int = MIN_TOKENS_PER_ROUND
    block: int = 1  # cache slots are allocated in blocks of this many tokens: the rows' share (for_batch) has the
    # engine's; a run's whole budget is counted in tokens until for_batch splits it for an engine (KVSpec)
    row_overhead: int = 0  # w: tokens' worth of working memory each row holds besides its cache (rodeco.common.working)

    def __post_init__(self) -> None:
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ConfigError(
                "budget.kv_tokens",
                self.kv_tokens,
                "must be a positive number of tokens",
                "set it to e.g. 4096, or null for no limit on CPU",
            )
        if self.min_tokens_per_round < 1:
            raise ConfigError(
                "budget.min_tokens_per_round",
                self.min_tokens_per_round,
                "must be >= 1",
                "set it to a positive number of tokens, e.g. 8",
            )
        if self.block < 1:
            raise ConfigError("generator.kv_block", self.block, "must be >= 1", "use the engine's block size")
        if not isinstance(self.row_overhead, int) or self.row_overhead < 0:
            raise ConfigError(
                "budget.row_overhead",
                self.row_overhead,
                "must be a whole number of tokens >= 0",
                "pass WorkingMemory.tokens(kv_bytes_per_token) (rodeco.common.working), or 0 to charge none",
            )

    def held(self, length: int) -> int:
        """Cache slots a row of own length ``length`` holds: ``length`` rounded up to whole blocks."""
        return -(-length // self.block) * self.block

    def for_batch(self, prompt_lens: Sequence[int], kv: KVSpec) -> tuple[Budget, int]:
        """(the budget left for the rows' own tokens, the own length a row starts from), for a batch of prompts of
        ``prompt_lens`` tokens on an engine that stores its cache as ``kv`` says (see the module doc): the prompts'
        shared tokens, each prompt's own, are taken off; a row starts from the longest tail any prompt leaves its
        rows, so the figure bounds every prompt's rows."""
        shared, base = _split(prompt_lens, kv)
        tokens = self.kv_tokens
        if tokens is not None and shared:
            tokens = max(1, tokens - shared)
        return Budget(tokens, self.min_tokens_per_round, kv.block, self.row_overhead), base

    def max_rows(self, length: int, max_length: int) -> int:
        """The most rows that can decode at least ``min_tokens_per_round`` more tokens from ``length``."""
        if self.kv_tokens is None:
            return 1 << 62
        m = min(self.min_tokens_per_round, max_length - length)
        return self.kv_tokens // (self.held(length + m) + self.row_overhead)

    def check_feasible(self, prompt_lens: Sequence[int], max_new_tokens: int, kv: KVSpec) -> None:
        """Every prompt of ``prompt_lens`` must be able to keep one row to the end (in the engine's blocks,
        ``kv``), its working memory included."""
        if self.kv_tokens is None:
            return
        w = self.row_overhead
        need = full_length_tokens(1, prompt_lens, max_new_tokens, kv) + len(prompt_lens) * w
        if self.kv_tokens < need:
            raise ConfigError(
                "budget.kv_tokens",
                self.kv_tokens,
                f"too small for one row per prompt: {len(prompt_lens)} prompt(s) of up to {max(prompt_lens)} tokens "
                f"and one row each of {max_new_tokens} new tokens"
                + (f" + {w} of working memory" if w else "")
                + f" hold {need} tokens in blocks of {kv.block}",
                f"raise budget.kv_tokens to at least {need}, lower sampling.max_new_tokens, "
                f"or put fewer prompts in one batch (data.batch_prompts)",
            )

    def auto_n(self, n_prompts: int, prompt_length: int, max_length: int) -> int:
        """``n: auto``: the largest rows per prompt whose first round decodes ``min_tokens_per_round`` tokens."""
        if self.kv_tokens is None:
            raise ConfigError("n", "auto", "needs a finite budget", "set budget.kv_tokens, or give n as a number")
        m = min(self.min_tokens_per_round, max_length - prompt_length)
        return max(1, self.kv_tokens // ((self.held(prompt_length + m) + self.row_overhead) * n_prompts))


def block_shared(prompt_len, block: int):
    """Tokens of a prompt that an engine allocating blocks of ``block`` stores once for all its rows: the full blocks
    before its last token, which every row computes itself to sample from (vLLM). Works on numpy arrays too."""
    return (prompt_len - 1) // block * block


def _split(prompt_lens: Sequence[int], kv: KVSpec) -> tuple[int, int]:
    """(tokens the prompts of ``prompt_lens`` hold once for all their rows, together; the own length each row starts
    from, the most of any prompt's) (see ``Budget.for_batch``)."""
    if not kv.shares_prefix:
        return 0, max(prompt_lens)
    if kv.aligned or kv.block == 1:  # each prompt whole, in blocks of its own
        return sum(-(-p // kv.block) * kv.block for p in prompt_lens), 0
    shared = [block_shared(p, kv.block) for p in prompt_lens]
    return sum(shared), max(p - s for p, s in zip(prompt_lens, shared))


def full_length_tokens(rows: int, prompt_lens: int | Sequence[int], max_new_tokens: int, kv: KVSpec) -> int:
    """KV tokens that ``rows`` rows of each prompt of ``prompt_lens`` (one length: one prompt) hold at full length:
    what Best-of-``rows`` fills, counted as ``Budget.for_batch`` splits a batch of them (so a budget of this size
    lets every row of every prompt decode to the end, and one block less does not)."""
    lens = [prompt_lens] if isinstance(prompt_lens, int) else list(prompt_lens)
    shared, base = _split(lens, kv)
    return shared + len(lens) * rows * Budget(None, block=kv.block).held(base + max_new_tokens)


def budget_from_device(free_bytes: int, kv_bytes: int, memory_fraction: float, reserve_bytes: int) -> int:
    """KV tokens that fit in a device's free memory (the CUDA formula in the module docstring)."""
    usable = max(0, free_bytes - reserve_bytes) * memory_fraction
    return int(usable // kv_bytes)


def budget_from_devices(
    free_bytes: dict[str, int], layers: dict[str, int], kv_bytes: int, memory_fraction: float, reserve_bytes: int
) -> int:
    """KV tokens that fit when a model's layers are spread over devices (``generator.device_map``): device ``d``
    holds ``layers[d]`` of the ``sum(layers)`` layers, so a token's keys and values cost it that share of
    ``kv_bytes``; the budget is what the tightest device allows."""
    n = sum(layers.values())
    return min(
        budget_from_device(free_bytes[d], -(-kv_bytes * k // n), memory_fraction, reserve_bytes)
        for d, k in layers.items()
        if k > 0
    )
