"""Out-of-memory back-off: a batch that runs out of CUDA memory is retried smaller instead of ending the run.

First ``data.batch_prompts`` is halved down to 1; then the budget's share of memory (``budget.memory_fraction``
with ``budget=cuda``, ``budget.kv_tokens`` or the engine's pool otherwise) is halved, at most
``MAX_BUDGET_HALVINGS`` times; ``budget=unlimited`` has no budget to halve. Each step logs a warning
and applies to the rest of the run. When nothing is left to shrink, the error names the keys to change.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from rodeco.common.hardware import empty_cache
from rodeco.common.validation import ConfigError

log = logging.getLogger(__name__)

MAX_BUDGET_HALVINGS = 3


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is PyTorch's out-of-memory error (``torch.cuda.OutOfMemoryError``)."""
    torch = sys.modules.get("torch")  # not imported: nothing can have raised its error (and rodeco stays light)
    return torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))


def free_cached_memory() -> None:
    import gc

    gc.collect()
    empty_cache()


@dataclass
class Backoff:
    """The run's current batch size and budget scale (1, 1/2, 1/4, ...)."""

    batch_prompts: int
    budget_key: str | None = "budget.memory_fraction"  # what the budget scale shrinks (None: budget=unlimited)
    budget_scale: float = 1.0

    def shrink(self, error: BaseException, n_prompts: int) -> None:
        """Halve the batch (or else the budget) after ``error`` in a batch of ``n_prompts``; raise a
        ``ConfigError`` naming the keys to change when both are at their minimum."""
        if self.batch_prompts > 1:
            self.batch_prompts = max(1, min(self.batch_prompts, n_prompts) // 2)
            change = f"data.batch_prompts -> {self.batch_prompts}"
        elif self.budget_key is not None and self.budget_scale > 0.5**MAX_BUDGET_HALVINGS:
            self.budget_scale /= 2
            change = f"{self.budget_key} x {self.budget_scale:g}"
        elif self.budget_key is None:
            raise ConfigError(
                "data.batch_prompts",
                1,
                f"a single prompt still runs out of memory with no budget "
                f"(budget=unlimited: every row decodes to the end) ({error})",
                "give the run a budget: budget=cuda (free CUDA memory, less each row's working "
                "memory) or budget=cpu budget.kv_tokens=N; or lower n or sampling.max_new_tokens",
            ) from error
        else:
            raise ConfigError(
                "data.batch_prompts",
                1,
                f"a single prompt still runs out of memory with "
                f"{self.budget_key} scaled down to {self.budget_scale:g} ({error})",
                "lower n, sampling.max_new_tokens or budget.kv_tokens, raise budget.reserve_gib "
                "(memory kept for activations and the reward), or use a smaller model or a larger "
                "device (generator.device_map=auto spreads a model over several)",
            ) from error
        log.warning("out of memory in a batch of %d prompt(s): retrying it with %s", n_prompts, change)
