"""The generator: a causal LM, its tokenizer, and a live batch of candidate rows (``Session``).

``Session`` holds what the loop needs between decision points: the engine's KV cache, which prompt and candidate
each row is, the tokens generated so far, per-row EOS, and (only when the reward asks) per-token log-probs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from rodeco.engine import Engine, HFEngine
from rodeco.errors import ConfigError
from rodeco.sampling import SamplingParams, sample, uniforms

log = logging.getLogger(__name__)


class Generator:
    """A causal LM ready to decode: tokenizer, chat template, EOS ids, sizes for the budget and FLOPs."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, chat_template: bool = True,
                 system_prompt: str | None = None, engine: str = "auto", name: str = "") -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.use_chat_template = chat_template and getattr(tokenizer, "chat_template", None) is not None
        self.system_prompt = system_prompt
        self.engine_kind = engine
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = sorted({int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None})
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.max_context = getattr(cfg, "max_position_embeddings", None)
        n_all = sum(p.numel() for p in model.parameters())
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings()
        tied = out is not None and out.weight.data_ptr() == emb.data_ptr()
        self.n_params = n_all  # parameters stored
        self.n_matmul_params = n_all if tied else n_all - emb.numel()  # parameters multiplied per token
        self.kv_bytes_per_token = 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize
        self.eos_tensor = torch.tensor(self.eos_ids, device=self.device)

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs of one token: 2 per matmul parameter plus attention over ``context`` cached tokens."""
        return 2.0 * self.n_matmul_params + 4.0 * self.n_layers * self.n_heads * self.head_dim * context

    def encode(self, prompt: str) -> list[int]:
        if self.use_chat_template:
            msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            msgs.append({"role": "user", "content": prompt})
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(prompt)["input_ids"]]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def engine_class(self) -> type:
        """The engine ``generator.engine`` selects for this model (``auto``: fast when it can run the model)."""
        kind = self.engine_kind
        if kind in ("auto", "fast"):
            from rodeco.fast_llama import FastLlamaEngine, supports

            why = supports(self.model)
            if why is None:
                return FastLlamaEngine
            if kind == "fast":
                raise ConfigError("generator.engine", kind, f"the fast engine cannot run this model: {why}",
                                  "use generator.engine=hf (any causal LM) or auto")
        elif kind != "hf":
            raise ConfigError("generator.engine", kind, "unknown engine", "use auto, fast or hf")
        return HFEngine

    @property
    def shares_prefix(self) -> bool:
        """Whether a prompt's KV cache is stored once for all its rows (the budget then counts it once)."""
        return bool(self.engine_class().shares_prefix)

    def new_engine(self) -> Engine:
        return self.engine_class()(self.model)


@dataclass
class Finished:
    """A row that left the batch: reached EOS, max_new_tokens, or was rejected."""

    prompt: int  # local prompt index in the batch
    candidate_id: int
    token_ids: list[int]
    logprobs: list[float] | None
    reason: str  # "eos" | "length" | "rejected"


@dataclass
class SessionStats:
    prefill_tokens: np.ndarray  # [P]
    decode_tokens: np.ndarray  # [P]
    decode_flops: np.ndarray  # [P]
    steps: int = 0
    peak_kv_tokens: int = 0
    peak_kv_bytes: int = 0
    times: dict[str, float] = field(default_factory=dict)


class Session:
    """Candidate rows of several prompts decoding together. Rows are sampled independently of each other."""

    def __init__(self, gen: Generator, prompt_ids: list[list[int]], n: int, *, sampling: SamplingParams,
                 max_new_tokens: int, seed: int, keys: list[int], needs_logprobs: bool,
                 compact_fraction: float = 0.25, ignore_eos: bool = False) -> None:
        self.gen, self.sampling, self.max_new, self.seed = gen, sampling, max_new_tokens, seed
        self.needs_logprobs, self.compact_fraction = needs_logprobs, compact_fraction
        P, dev = len(prompt_ids), gen.device
        self.prompt_len = max(len(p) for p in prompt_ids)  # L0: prompts are left-padded to this length
        ids = torch.full((P, self.prompt_len), gen.pad_id, dtype=torch.long)
        mask = torch.zeros((P, self.prompt_len), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, self.prompt_len - len(p):] = torch.tensor(p)
            mask[i, self.prompt_len - len(p):] = 1
        self.engine = gen.new_engine()
        self.stats = SessionStats(np.full(P, self.prompt_len), np.zeros(P, np.int64), np.zeros(P))
        logits = self.engine.prefill(ids.to(dev), mask.to(dev))  # each prompt forwarded once: [P, V]
        rows = torch.arange(P, device=dev).repeat_interleave(n)  # fan the prompt cache out to n rows each
        self.engine.select(rows)
        self.logits = logits[rows]
        self.prompt_of = np.repeat(np.arange(P), n)
        self.cand = np.tile(np.arange(n), P)
        self.keys = np.asarray(keys, dtype=np.uint64)  # per prompt: mixes into each row's random stream
        B = P * n
        self.out = torch.full((B, max_new_tokens), gen.pad_id, dtype=torch.long, device=dev)
        self.lp = torch.zeros((B, max_new_tokens), device=dev) if needs_logprobs else None
        self.n_tok = torch.zeros(B, dtype=torch.long, device=dev)  # tokens kept per row (EOS included)
        self.finished = torch.zeros(B, dtype=torch.bool, device=dev)
        self.pending: torch.Tensor | None = None  # sampled tokens not yet fed to the model
        self.t = 0  # tokens generated by every active row
        self.done: list[Finished] = []
        self.eos = gen.eos_tensor if not ignore_eos else torch.tensor([-1], device=dev)  # -1: never sampled
        self._track_memory()

    @property
    def rows(self) -> int:
        return len(self.prompt_of)

    def _track_memory(self) -> None:
        tokens = self.engine.allocated_tokens
        if tokens > self.stats.peak_kv_tokens:
            self.stats.peak_kv_tokens = tokens
            self.stats.peak_kv_bytes = tokens * self.gen.kv_bytes_per_token

    def _row_keys(self) -> np.ndarray:
        return (self.keys[self.prompt_of] << np.uint64(24)) | self.cand.astype(np.uint64)

    @torch.inference_mode()
    def decode(self, until: int) -> None:
        """Generate until every active row has ``until`` tokens (or has finished)."""
        until = min(until, self.max_new)
        self.engine.reserve(self.prompt_len + until)
        while self.t < until and self.rows:
            if self.pending is not None:
                context = self.engine.length
                self.logits = self.engine.step(self.pending)  # [B, V]
                counts = np.bincount(self.prompt_of, minlength=len(self.stats.decode_tokens))
                self.stats.decode_tokens += counts
                self.stats.decode_flops += counts * self.gen.flops_per_token(context)
                self.stats.steps += 1
                self._track_memory()
            u = torch.from_numpy(uniforms(self.seed, self._row_keys(), self.t)).to(self.logits.device)
            tok = sample(self.logits, u, self.sampling)
            tok = torch.where(self.finished, self.gen.pad_id, tok)
            if self.lp is not None:
                self.lp[:, self.t] = torch.log_softmax(self.logits.float(), -1).gather(-1, tok[:, None])[:, 0]
            self.out[:, self.t] = tok
            self.t += 1
            self.n_tok = torch.where(self.finished, self.n_tok, self.n_tok + 1)
            self.finished |= torch.isin(tok, self.eos)
            self.pending = tok
            n_fin = int(self.finished.sum())
            if self.t >= self.max_new or n_fin == self.rows:
                self._retire(torch.ones_like(self.finished))
            elif n_fin >= max(1, self.compact_fraction * self.rows):
                self._retire(self.finished)

    def retire_finished(self) -> None:
        if bool(self.finished.any()):
            self._retire(self.finished)

    def _retire(self, which: torch.Tensor) -> None:
        """Move finished rows (``which``) out of the batch."""
        idx = which.nonzero()[:, 0].tolist()
        n_tok, fin = self.n_tok.tolist(), self.finished.tolist()
        for i in idx:
            reason = "eos" if fin[i] else "length"
            self.done.append(self._finished(i, n_tok[i], reason))
        self.select((~which).nonzero()[:, 0])

    def _finished(self, i: int, n: int, reason: str) -> Finished:
        ids = self.out[i, :n].tolist()
        lps = self.lp[i, :n].tolist() if self.lp is not None else None
        if reason == "eos":  # the EOS token is not part of the response
            ids, lps = ids[:-1], (lps[:-1] if lps is not None else None)
        return Finished(int(self.prompt_of[i]), int(self.cand[i]), ids, lps, reason)

    def reject(self, rows: list[int]) -> None:
        """Drop active rows (batch indices) after a decision point, keeping their text for the trace."""
        for i in rows:
            self.done.append(self._finished(i, self.t, "rejected"))
        keep = sorted(set(range(self.rows)) - set(rows))
        self.select(torch.tensor(keep, dtype=torch.long))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (batch indices): cache, tokens and metadata alike."""
        rows_np = rows.cpu().numpy()
        rows = rows.to(self.out.device)
        self.engine.select(rows)
        self.prompt_of, self.cand = self.prompt_of[rows_np], self.cand[rows_np]
        self.out, self.n_tok, self.finished = self.out[rows], self.n_tok[rows], self.finished[rows]
        self.lp = self.lp[rows] if self.lp is not None else None
        self.pending = self.pending[rows] if self.pending is not None else None
        self.logits = self.logits[rows]

    def active(self) -> list[tuple[int, int, list[int], list[float] | None]]:
        """(prompt, candidate, token ids, logprobs) of every active row, in batch order."""
        ids = self.out[:, : self.t].tolist()
        lps = self.lp[:, : self.t].tolist() if self.lp is not None else [None] * self.rows
        return [(int(p), int(c), i, lp) for p, c, i, lp in zip(self.prompt_of, self.cand, ids, lps)]
