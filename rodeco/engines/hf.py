"""``HFEngine``: any ``AutoModelForCausalLM``, driven through its own forward with transformers' ``DynamicCache``."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rodeco.engines import HFModel, Unparked

if TYPE_CHECKING:
    from transformers import DynamicCache


class HFEngine(Unparked):
    """Generic engine: the model's own forward with a ``DynamicCache``; left padding masked as ``generate`` does.
    Fan-out copies the prompt's cache into every row."""

    name = "hf"
    shares_prefix = False
    compilable = False  # generator.compile does not apply
    block = 1  # token by token
    aligned = False  # every row holds its own copy of the prompt

    @staticmethod
    def prepare(model: HFModel, mkl: bool = False) -> None:
        """Nothing to prepare: the model's own forward reads its weights."""
        return None

    def __init__(
        self, model: HFModel, weights: None = None, compiled: None = None, pool_tokens: int | None = None
    ) -> None:
        self.model = model
        # transformers >= 5.2x names the argument `cache`; older releases `past_key_values`
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache: DynamicCache | None = None  # set by prefill
        self.mask = torch.empty(0, 0, dtype=torch.long)
        self.next_pos = torch.empty(0, dtype=torch.long)
        self.keep_hidden = False  # keep the final-layer hidden state of each forward's last position
        self.last_hidden: torch.Tensor | None = None  # [rows of the last forward, hidden]

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def allocated_tokens(self) -> int:
        return self.rows * self.length

    @torch.inference_mode()
    def _forward_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)  # [P, L]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=self.keep_hidden,
            **{self.cache_kw: self.cache},
        )
        self.mask, self.next_pos = mask, pos[:, -1] + 1
        return self._out(out)

    @torch.inference_mode()
    def admit(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Prompts joining the running rows, one row each, after them: forwarded on their own, then the shorter
        cache, theirs or the rows', is left-padded to the other's length and masked there, as ``generate`` masks a
        batch's left padding (the padding's positions are skipped: each row keeps its own positions)."""
        old, old_mask, old_pos = self.cache, self.mask, self.next_pos
        logits = self._forward_prompts(ids, mask)
        if old is None or old_mask.shape[0] == 0:
            return logits
        assert self.cache is not None  # set by prefill
        L = max(old_mask.shape[1], self.mask.shape[1])
        # a full-attention cache layer holds ``keys`` and ``values`` [rows, heads, length, head_dim]
        layers: list[Any] = [*old.layers, *self.cache.layers]
        for a, b in zip(layers[: len(old.layers)], layers[len(old.layers) :]):
            a.keys = torch.cat([_left_pad(a.keys, L, 2), _left_pad(b.keys, L, 2)])
            a.values = torch.cat([_left_pad(a.values, L, 2), _left_pad(b.values, L, 2)])
        self.cache = old
        self.mask = torch.cat([_left_pad(old_mask, L, 1), _left_pad(self.mask, L, 1)])
        self.next_pos = torch.cat([old_pos, self.next_pos])
        return logits

    def _out(self, out) -> torch.Tensor:
        # hidden_states[-1] is the final norm's output, the lm_head's input (transformers' convention)
        self.last_hidden = out.hidden_states[-1][:, -1] if self.keep_hidden else None
        return out.logits[:, -1]

    def select(self, rows: torch.Tensor) -> None:
        assert self.cache is not None  # rows are selected after prefill
        self.cache.batch_select_indices(rows)
        self.mask, self.next_pos = self.mask[rows], self.next_pos[rows]
        # the leading positions no row reads (padding left by rows that left): dropped, so an open batch's cache is
        # its longest row's length, not the steps since it opened (positions are the rows' own: nothing moves)
        read = self.mask.any(0)
        first = int(read.int().argmax()) if bool(read.any()) else 0
        if first:
            layers: list[Any] = list(self.cache.layers)  # full-attention layers: keys, values [rows, heads, L, D]
            for layer in layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask = self.mask[:, first:]

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """Every row holds the batch's padded length (its prompt copied into it, no block shared): ``rows`` hold
        ``len(rows) * (L + k)`` tokens after ``k`` steps, ``L`` their longest row (``padded_steps``)."""
        return padded_steps(
            len(rows), int(self.mask[rows].sum(-1).max()) if len(rows) else 0, tokens, row_overhead, most
        )

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.next_pos[:, None],
            use_cache=True,
            output_hidden_states=self.keep_hidden,
            **{self.cache_kw: self.cache},
        )
        self.next_pos = self.next_pos + 1
        return self._out(out)


def padded_steps(rows: int, longest: int, tokens: int, row_overhead: int, most: int) -> int:
    """The most steps (up to ``most``) ``rows`` rows padded to ``longest`` tokens take within ``tokens``, each row
    holding one slot a token and ``row_overhead`` tokens of working memory: ``hf``'s count."""
    if rows == 0 or most <= 0:
        return max(0, most)
    return max(0, min(most, (tokens // rows - row_overhead) - longest))


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """``x`` left-padded with zeros along ``dim`` to ``length`` (a cache's positions, or a mask's: 0 is masked)."""
    short = length - x.shape[dim]
    if short == 0:
        return x
    shape = list(x.shape)
    shape[dim] = short
    return torch.cat([x.new_zeros(shape), x], dim=dim)
