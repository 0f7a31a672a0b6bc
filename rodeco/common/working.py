"""What one row holds beyond its KV cache while it decodes (its working memory), term by term.

A decode step of the fast engine (``rodeco.engines.fast``, driven by ``rodeco.core.session.TorchSession``) holds, for
each row, with ``V`` the vocabulary, ``e`` the model's bytes per value (``ModelShape.dtype_bytes``), ``H`` and
``H_kv`` the query and KV heads of ``D`` values, ``c`` the context (prompt plus own tokens), ``N`` the
``max_new_tokens`` and ``k`` the ``top_k``:

- through the whole step:

  - ``response``: the tokens kept so far (int64, ``8 N``), their log-probs when a reward reads them (fp32, ``4 N``),
    and 64 bytes of per-row state (counts, flags, the pending token, its uniform, its draw);
  - ``hidden``: the final-layer state of the row's latest token (``hidden_size * e``), when a reward reads it;

- then the larger of two phases, which never overlap (the session lets go of the logits it sampled from before the
  next step, and the engine frees each layer's scores before the next layer):

  - the layers', one layer at a time: ``attention``, the fp32 scores ``[H, c]`` and the softmax's fp32 output, plus
    the cast of that output back to the model's dtype below fp32 (``H c (8 + e)`` bytes, ``8 H c`` in fp32), and the
    prompt's padding mask expanded to the row (fp32, ``4 c`` at most); ``activations``, what the layer holds
    meanwhile: the residual stream, the fused QKV projection, the rotated queries, the attention's output and the
    rotary cosines and sines (``e (hidden + (3 H + 2 H_kv + 2) D)``); ``prompt_gather``, only where the engine
    declares it (``EngineInfo.gathers_prompt``: the Llama engine's torch path, where the paged kernel does not
    serve): the layer's keys and values of the row's context gathered from its blocks (``2 H_kv c D e``);
  - the logits: ``logits``, the model's output ``V e`` (after prefill the fan-out copy of the prompt's logits takes
    its place), and the larger of what sampling and the log-probs add:

    - ``sampling``: the fp32 copy divided by the temperature in place (``4 V``; none from fp32 logits at temperature
      1), then what the draw reads: with top-k the ``k`` best (values, int64 indices, probabilities, CDF: ``20 k``
      bytes, ``29 k`` with top-p's cumulative sums and mask), with top-p alone the whole sorted vocabulary (``25 V``:
      values, indices, probabilities, cumulative sums, mask, masked probabilities), else probabilities and CDF
      (``8 V``); greedy decoding adds nothing;
    - ``logprobs`` (when a reward reads them): the fp32 log-softmax (``4 V``) and, from logits below fp32, the fp32
      copy it is taken of (``4 V``).

So ``total = response + hidden + max(attention + activations + prompt_gather, logits + max(sampling, logprobs))``.
A budget charges it as ``ceil(total / kv_bytes_per_token)`` extra tokens per row (``WorkingMemory.tokens``,
``Budget.row_overhead``).
Left out, as they are smaller than either phase for the models rodeco runs: the MLP's activations (a few
``[rows, intermediate]`` tensors, after the attention's are freed: about 12 KiB a row for SmolLM2 in bf16, against
288 KiB of logits; ``ModelShape`` has no intermediate size) and each prompt's (not row's) prefill activations.
The ``hf`` engine's attention is the model's own and is not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rodeco.common.validation import ConfigError

if TYPE_CHECKING:
    from rodeco.common.shape import ModelShape
    from rodeco.common.state import SamplingParams

__all__ = ["ROW_STATE_BYTES", "WorkingMemory", "working_memory"]

ROW_STATE_BYTES = 64  # per-row state besides the response buffers: counts, flags, pending token, uniform, draw
FP32 = 4


@dataclass(frozen=True)
class WorkingMemory:
    """Bytes one row holds beyond its KV cache during a decode step: ``terms`` by name (see the module doc) and their
    ``total``, which is not their sum (the two phases do not overlap); ``phase`` names the larger phase."""

    terms: dict[str, int]
    total: int
    phase: str  # "logits" or "attention"

    def tokens(self, kv_bytes_per_token: int) -> int:
        """The total in KV tokens of ``kv_bytes_per_token`` bytes, rounded up: ``Budget(row_overhead=...)``."""
        return -(-self.total // kv_bytes_per_token)

    def to_dict(self) -> dict:
        return {"terms": dict(self.terms), "total": self.total, "phase": self.phase}


def working_memory(
    shape: ModelShape,
    *,
    context: int,
    max_new_tokens: int,
    sampling: SamplingParams,
    needs_logprobs: bool,
    needs_hidden: bool,
    gathered_prompt: int = 0,
) -> WorkingMemory:
    """The working memory of one row of a model of ``shape`` attending ``context`` tokens (prompt and own; use the
    longest a row reaches) and sampling as ``sampling`` says, term by term (the module doc); ``gathered_prompt``:
    the tokens whose keys and values the engine gathers per row (``EngineInfo.gathers_prompt``; else 0)."""
    if shape.vocab_size is None or shape.hidden_size is None:
        raise ConfigError(
            "generator.model",
            None,
            "the model's shape has no vocab_size or hidden_size (a pool recorded before working memory was counted)",
            "record the pool again, or charge no working memory (Budget row_overhead=0)",
        )
    if context < 1:
        raise ConfigError(
            "sampling.max_new_tokens",
            max_new_tokens,
            f"a context of {context} tokens is empty",
            "count the context as the longest prompt plus sampling.max_new_tokens",
        )
    V, e = shape.vocab_size, shape.dtype_bytes
    terms = {
        "response": (8 + (FP32 if needs_logprobs else 0)) * max_new_tokens + ROW_STATE_BYTES,
        "hidden": shape.hidden_size * e if needs_hidden else 0,
        "attention": shape.n_heads * context * (2 * FP32 + (e if e != FP32 else 0)) + FP32 * context,
        "activations": e * (shape.hidden_size + (3 * shape.n_heads + 2 * shape.n_kv_heads + 2) * shape.head_dim),
        "prompt_gather": 2 * shape.n_kv_heads * gathered_prompt * shape.head_dim * e,
        "logits": V * e,
        "sampling": _sampling_bytes(V, e, sampling),
        "logprobs": (FP32 + (FP32 if e != FP32 else 0)) * V if needs_logprobs else 0,
    }
    logits = terms["logits"] + max(terms["sampling"], terms["logprobs"])
    layers = terms["attention"] + terms["activations"] + terms["prompt_gather"]
    phase = "logits" if logits >= layers else "attention"
    return WorkingMemory(terms, terms["response"] + terms["hidden"] + max(logits, layers), phase)


def _sampling_bytes(V: int, e: int, p: SamplingParams) -> int:
    """Bytes per row that ``rodeco.common.sampling.sample`` holds besides the logits (the module doc's ``sampling``)."""
    if p.greedy:
        return 0
    copy = 0 if e == FP32 and p.temperature == 1.0 else FP32 * V
    nucleus = p.top_p < 1.0
    if p.top_k and p.top_k < V:  # the copy lives through topk, then only the k best do
        k = p.top_k
        return max(copy + 12 * k, (29 if nucleus else 20) * k)
    if nucleus:  # sorted values and indices (12 V) outlive the copy; then probabilities, sums, mask, masked, CDF
        return max(copy + 12 * V, 25 * V)
    return copy + 8 * V  # probabilities and CDF of the (copied) logits
