"""Decision points from a memory budget.

The budget ``B`` is the most KV-cache tokens the batch may hold: on CPU ``budget.kv_tokens``; on CUDA, unless
given, ``B = floor((free_bytes - reserve) * memory_fraction / kv_bytes_per_token)`` with
``kv_bytes_per_token = 2 * layers * kv_heads * head_dim * dtype_bytes`` (keys and values).

Every active row holds ``L`` tokens of its own, all rows alike. With the fast engine a prompt's cache is stored
once and shared by its rows: a batch of ``G`` prompts padded to ``P`` tokens holds ``G * P`` shared tokens, each row
owns only what it generated, and the rows share ``B' = B - G * P``. With an engine that copies the prompt into
every row (``hf``), nothing is shared: ``B' = B`` and each row's own length counts the prompt too. ``for_batch``
returns ``B'`` as a ``Budget`` and the length every row starts from (``0`` shared, ``P`` copied).

With ``r`` rows, a round decodes until the cache is full: its decision point is ``C = min(L_max, floor(B' / r))``
own tokens per row, where ``L_max`` is the start length plus ``max_new_tokens``. At a decision point, the next
round must decode at least ``m = min(min_tokens_per_round, L_max - L)`` tokens, so at most ``floor(B' / (L + m))``
rows may go on: the policy must reject at least ``r - floor(B' / (L + m))`` rows. Rows are freed before the next
round allocates, so the cache never holds more than ``B`` tokens.

An engine that allocates its cache in blocks of ``b`` tokens (vLLM: ``generator.kv_block``; ``paged``) shares only
the full blocks before a prompt's last token (vLLM computes that token for each row, to sample from it): each row
holds the prompt's last ``P - b * floor((P - 1) / b)`` tokens (1 to ``b``) itself, and a row of own length ``L``
holds ``ceil(L / b)`` blocks. The arithmetic above then runs in blocks: ``C`` is rounded down to a multiple of
``b``, ``L + m`` up. With ``b = 1`` (``hf``, ``fast``) it is the token arithmetic above. The ``paged`` engine
(blocks of 16) is counted the same way: its rows copy their prompt's partial last block at their first token, and
a prompt of whole blocks it stores entirely once, so for such a prompt the count is one block a row above what it
holds.

Each row also holds working memory beyond its cache while it decodes: its logits, their sampling copies, attention
scores (``rodeco.common.working``). Charged, it is ``w = row_overhead`` tokens a row (``WorkingMemory.tokens``: the
bytes over ``kv_bytes_per_token``, rounded up), held however long the row is, and not in blocks: a row of own length
``L`` counts as ``held(L) + w``. Then ``C = floor((floor(B' / r) - w) / b) * b``, at most
``floor(B' / (held(L + m) + w))`` rows go on, ``n: auto`` is ``floor(B' / ((held(P' + m) + w) * G))`` (``P'`` the
start length), and a batch must fit ``G * (held(P + N) + w)``. With ``w = 0`` every figure is the one above.
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
        ``prompt_lens`` tokens on an engine that stores its cache as ``kv`` says (see the module doc). Prompts are
        padded to the longest unless ``kv.block`` > 1 (then each keeps its length; the split is the largest share
        and the largest tail of any prompt, so it bounds every prompt's rows)."""
        shared, base = _split(prompt_lens, kv)
        tokens = self.kv_tokens
        if tokens is not None and shared:
            tokens = max(1, tokens - len(prompt_lens) * shared)
        return Budget(tokens, self.min_tokens_per_round, kv.block, self.row_overhead), base

    def capacity(self, rows: int, max_length: int) -> int:
        """Cache length per row at which ``rows`` rows, each with its working memory, fill the budget (the next
        decision point)."""
        if self.kv_tokens is None:
            return max_length
        per_row = self.kv_tokens // max(rows, 1) - self.row_overhead
        return min(max_length, max(0, per_row) // self.block * self.block)

    def max_rows(self, length: int, max_length: int) -> int:
        """The most rows that can decode at least ``min_tokens_per_round`` more tokens from ``length``."""
        if self.kv_tokens is None:
            return 1 << 62
        m = min(self.min_tokens_per_round, max_length - length)
        return self.kv_tokens // (self.held(length + m) + self.row_overhead)

    def check_feasible(self, n_prompts: int, prompt_length: int, max_length: int, kv: KVSpec) -> None:
        """Every prompt must be able to keep one row to the end (in the engine's blocks, ``kv.block``)."""
        if self.kv_tokens is None:
            return
        w = self.row_overhead
        need = n_prompts * (Budget(None, block=kv.block).held(max_length) + w)
        if self.kv_tokens < need:
            raise ConfigError(
                "budget.kv_tokens",
                self.kv_tokens,
                f"too small for one row per prompt: {n_prompts} prompt(s) x ({prompt_length} prompt + "
                f"{max_length - prompt_length} new tokens"
                + (f" + {w} of working memory" if w else "")
                + f") = {need} tokens",
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
    """(tokens a prompt holds once for all its rows, the own length each row starts from): the most of any of
    ``prompt_lens`` (see ``Budget.for_batch``)."""
    longest = max(prompt_lens)
    if not kv.shares_prefix:
        return 0, longest
    if kv.block == 1:
        return longest, 0
    shared = [block_shared(p, kv.block) for p in prompt_lens]
    return max(shared), max(p - s for p, s in zip(prompt_lens, shared))


def full_length_tokens(rows: int, prompt_lens: int | Sequence[int], max_new_tokens: int, kv: KVSpec) -> int:
    """KV tokens that ``rows`` rows of each prompt of ``prompt_lens`` (one length: one prompt) hold at full length:
    what Best-of-``rows`` fills, counted as ``Budget.for_batch`` splits a batch of them (so a budget of this size
    lets every row of every prompt decode to the end, and one block less does not)."""
    lens = [prompt_lens] if isinstance(prompt_lens, int) else list(prompt_lens)
    shared, base = _split(lens, kv)
    return len(lens) * (shared + rows * Budget(None, block=kv.block).held(base + max_new_tokens))


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
