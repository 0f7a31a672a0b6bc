"""Reference judges for AlpacaEval prompts: how close a response is to AlpacaEval's GPT-4-Turbo reference answer
for the same prompt (``alpaca_eval_gpt4_1106_preview_outputs.json``).

- ``chrf``: the character n-gram F-score (chrF, Popović 2015) of the response against the reference, 0-100.
- ``ref_sim``: the cosine between the response's and the reference's mean final-layer hidden state under the
  embedded SmolLM2-135M, in [-1, 1].

What they measure is similarity to *one* good answer, not quality. They reward a paraphrase of GPT-4's answer and
penalise a different answer that is just as good (another example, another structure, a shorter correct reply).
chrF is surface overlap: it cannot tell a correct statement from a wrong one in the same words, and as recall
weighs four times precision it favours responses as long as the reference or longer (a short answer misses most of
the reference's n-grams; extra text costs little). ``ref_sim`` reads meaning only as far as a 135M model's average
hidden state does: it sees the first ``max_tokens`` tokens of each text only, it is not a trained sentence encoder,
a mean over tokens moves with a text's length and format, and an LM's hidden states share directions whatever the
text (an unrelated answer still scores about 0.5), so compare its scores with each other, not with 0. Use them as
independent judges beside others, never as the only measure.

A prompt is matched to its reference by its text (stripped, whitespace collapsed): either the ``prompt`` of a
record of ``alpaca_eval_805.jsonl`` (the reference at the same position) or the references' own ``instruction``.
A prompt without a reference is an error: these judges apply to AlpacaEval prompts only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, check_positive_int, take_params

log = logging.getLogger(__name__)

# relative paths: the working directory, else the data root (rodeco.core.data.find_data_file)
DEFAULT_REFERENCES = "prompts/alpaca_eval_gpt4_1106_preview_outputs.json"
DEFAULT_PROMPTS = "prompts/alpaca_eval_805.jsonl"
CHRF_ORDER = 6  # character n-grams of n = 1..6
CHRF_BETA = 2.0  # recall weighs beta^2 = 4 times as much as precision
SHOWN = 60  # characters of a prompt an error shows


def normalize_text(text: str) -> str:
    """The text stripped, every run of whitespace one space: what prompts are matched by."""
    return " ".join(text.split())


def _short(text: str) -> str:
    t = normalize_text(text)
    return t if len(t) <= SHOWN else t[:SHOWN] + "..."


class References:
    """AlpacaEval's reference answers, looked up by prompt text. ``node`` (``judge.chrf``) names the judge in
    errors; ``identity`` is a digest of the references file, so two judges with different references differ."""

    def __init__(self, outputs: Sequence[str], keys: dict[str, int], node: str, identity: str = "") -> None:
        self.outputs, self.keys, self.node, self.identity = list(outputs), dict(keys), node, identity

    @classmethod
    def load(cls, references: str, prompts: str | None, node: str) -> References:
        """The references file (a JSON list of ``{instruction, output, ...}``) and, unless ``prompts`` is None, the
        prompt file in the same order (JSON lines with ``prompt``), both paths relative to the current directory."""
        ref_path = _existing(references, f"{node}.references", "alpaca_eval_gpt4_1106_preview_outputs.json")
        raw = ref_path.read_bytes()
        try:
            records = json.loads(raw)
            outputs = [str(r["output"]) for r in records]
            instructions = [str(r["instruction"]) for r in records]
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(
                f"{node}.references",
                references,
                f"not a JSON list of {{instruction, output}} records ({type(e).__name__}: {e})",
                "point it at AlpacaEval's alpaca_eval_gpt4_1106_preview_outputs.json",
            ) from e
        keys: dict[str, int] = {}
        if prompts is not None:
            listed = _read_prompts(prompts, f"{node}.prompts")
            if len(listed) != len(outputs):
                raise ConfigError(
                    f"{node}.prompts",
                    prompts,
                    f"has {len(listed)} prompts for {len(outputs)} "
                    "references; they must be the same list in the same order",
                    f"use the references' own prompt file ({DEFAULT_PROMPTS}), or {node}.prompts=null "
                    "to match by the references' instructions only",
                )
            for i, prompt in enumerate(listed):
                keys.setdefault(normalize_text(prompt), i)
        for i, instruction in enumerate(instructions):
            keys.setdefault(normalize_text(instruction), i)
        log.info("%s: %d reference answers from %s", node, len(outputs), ref_path)
        return cls(outputs, keys, node, identity=hashlib.sha256(raw).hexdigest()[:12])

    def index(self, prompt: str) -> int:
        """The position of the prompt's reference answer; a prompt without one is a ``ConfigError``."""
        i = self.keys.get(normalize_text(prompt))
        if i is None:
            raise ConfigError(
                self.node,
                _short(prompt),
                "no AlpacaEval reference answer for this prompt (matched by its text, whitespace collapsed)",
                "use a reference judge only on AlpacaEval "
                f"prompts (data.path={DEFAULT_PROMPTS}); judge other prompts with another reward",
            )
        return i

    def answer(self, prompt: str) -> str:
        return self.outputs[self.index(prompt)]


def _existing(path: str, key: str, what: str) -> Path:
    """``path`` (``what``): as given, or relative to the working directory, else to the data root."""
    from rodeco import find_data_file

    try:
        return find_data_file(path, key)
    except ConfigError as e:
        raise ConfigError(e.key, e.value, e.problem, f"{e.fix}; or set {key}=<path to {what}>") from None


def _read_prompts(path: str, key: str) -> list[str]:
    p = _existing(path, key, "alpaca_eval_805.jsonl")
    out = []
    for line_no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(str(json.loads(line)["prompt"]))
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(
                key,
                path,
                f"line {line_no} is not a JSON record with a 'prompt' ({type(e).__name__}: {e})",
                f"use {DEFAULT_PROMPTS}, or {key}=null to match by the references' instructions only",
            ) from e
    return out


# --- chrF ---------------------------------------------------------------------------------------------------------


def char_ngrams(text: str, n: int) -> Counter[str]:
    """The character n-grams of ``text`` with its whitespace removed, counted."""
    t = "".join(text.split())
    return Counter(t[i : i + n] for i in range(len(t) - n + 1))


def chrf_from_ngrams(hyp: Sequence[Counter[str]], ref: Sequence[Counter[str]], beta: float = CHRF_BETA) -> float:
    """chrF from the n-gram counts of each order: precision and recall of each order (matches clipped to the
    other side's count), averaged over the orders that both texts are long enough to have, then
    ``F_beta = (1 + beta^2) P R / (beta^2 P + R)``, times 100. No order in common: 0 (100 if both are empty)."""
    precisions, recalls = [], []
    for h, r in zip(hyp, ref):
        nh, nr = sum(h.values()), sum(r.values())
        if nh == 0 or nr == 0:
            continue
        match = sum(min(c, r[g]) for g, c in h.items())
        precisions.append(match / nh)
        recalls.append(match / nr)
    if not precisions:
        both_empty = not (hyp and hyp[0]) and not (ref and ref[0])  # no unigrams: nothing but whitespace
        return 100.0 if both_empty else 0.0
    prec, rec = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if prec == 0.0 and rec == 0.0:
        return 0.0
    b2 = beta * beta
    return 100.0 * (1 + b2) * prec * rec / (b2 * prec + rec)


def chrf(hypothesis: str, reference: str, order: int = CHRF_ORDER, beta: float = CHRF_BETA) -> float:
    """The chrF score (0-100) of ``hypothesis`` against ``reference``: character n-grams of n = 1..``order``,
    whitespace removed, precision and recall averaged over n, then their F-score with recall ``beta`` times as
    important (Popović 2015; chrF2 with the defaults)."""
    return chrf_from_ngrams(
        [char_ngrams(hypothesis, n) for n in range(1, order + 1)],
        [char_ngrams(reference, n) for n in range(1, order + 1)],
        beta,
    )


class ChrfReward:
    """``chrf``: chrF2 of the response against the prompt's AlpacaEval reference answer, 0-100 (module docstring:
    what it cannot see). Reference n-grams are counted once per prompt."""

    def __init__(self, refs: References) -> None:
        self.refs = refs
        self.cost = RewardCost()  # no model: calls only
        self.identity = f"chrF{CHRF_BETA:g},order={CHRF_ORDER},references={refs.identity}"
        self._ref_ngrams: dict[int, list[Counter[str]]] = {}

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        out = []
        for r in requests:
            i = self.refs.index(r.prompt)
            if i not in self._ref_ngrams:
                self._ref_ngrams[i] = [char_ngrams(self.refs.outputs[i], n) for n in range(1, CHRF_ORDER + 1)]
            out.append(
                chrf_from_ngrams([char_ngrams(r.response, n) for n in range(1, CHRF_ORDER + 1)], self._ref_ngrams[i])
            )
        return out


@dataclass
class ReferenceParams:
    references: str = field(
        default=DEFAULT_REFERENCES,
        metadata={
            "help": "AlpacaEval's reference outputs (JSON list of {instruction, output}); relative: to the current dir"
        },
    )
    prompts: Optional[str] = field(
        default=DEFAULT_PROMPTS,
        metadata={
            "help": "alpaca_eval_805.jsonl, in the references' order (its 'prompt' is matched too); null: instructions "
            "only"
        },
    )


def _node(name: str) -> str:
    return f"judge.{name}"  # what these rewards are for; errors name the judge's keys


def build_chrf(params: dict[str, Any], ctx: BuildContext) -> ChrfReward:
    p = take_params(_node("chrf"), params, ReferenceParams)
    return ChrfReward(References.load(str(p["references"]), p["prompts"], _node("chrf")))


# --- ref_sim ------------------------------------------------------------------------------------------------------


class HiddenStateEncoder:
    """Mean final-layer hidden state (after the final norm) of a causal LM's base model over a text's first
    ``max_tokens`` tokens; the text alone, no special tokens, no prompt. Right-padded, length-sorted batches with
    attention masks, so a text's vector does not depend on its batch neighbours."""

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int = 256, batch_tokens: int = 8192) -> None:
        self.base = model.base_model.eval()  # the transformer without the LM head: no vocabulary projection
        self.tokenizer, self.max_tokens, self.batch_tokens = tokenizer, max_tokens, batch_tokens
        self.device = next(self.base.parameters()).device
        n_params = sum(p.numel() for p in self.base.parameters())
        self.n_matmul_params = n_params - self.base.get_input_embeddings().weight.numel()  # the embedding is a lookup
        self.tokens = 0

    def ids(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]][: self.max_tokens]

    def encode(self, texts: Sequence[str]) -> list[np.ndarray | None]:
        """One float64 vector per text (None for a text without tokens)."""
        import torch

        from rodeco_rewards.batching import token_batches

        seqs = [self.ids(t) for t in texts]
        out: list[np.ndarray | None] = [None] * len(seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        todo = [i for i, s in enumerate(seqs) if s]
        with torch.inference_mode():
            for batch in token_batches([len(seqs[i]) for i in todo], self.batch_tokens):
                rows = [todo[b] for b in batch]
                L = max(len(seqs[i]) for i in rows)
                x = torch.full((len(rows), L), int(pad), dtype=torch.long)
                mask = torch.zeros((len(rows), L), dtype=torch.long)
                for row, i in enumerate(rows):
                    x[row, : len(seqs[i])] = torch.tensor(seqs[i])
                    mask[row, : len(seqs[i])] = 1
                h = self.base(input_ids=x.to(self.device), attention_mask=mask.to(self.device)).last_hidden_state
                h = h.float().cpu().numpy().astype(np.float64)
                for row, i in enumerate(rows):
                    out[i] = h[row, : len(seqs[i])].mean(0)
                self.tokens += int(mask.sum())
        return out


def cosine(a: np.ndarray | None, b: np.ndarray | None) -> float:
    """The cosine of two vectors; 0 when either is missing or zero."""
    if a is None or b is None:
        return 0.0
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / den if den > 0 and math.isfinite(den) else 0.0


class RefSimReward:
    """``ref_sim``: cosine between the response's and the reference's mean final-layer hidden state under an LM
    (the embedded SmolLM2-135M by default); an empty response scores 0. Reference vectors are computed once per
    prompt. ``cost``: tokens forwarded, FLOPs = 2 x non-embedding parameters x tokens, calls."""

    def __init__(self, refs: References, encoder: HiddenStateEncoder, model_name: str = "smollm2") -> None:
        self.refs, self.encoder = refs, encoder
        self.cost = RewardCost()
        self.identity = f"model={model_name},max_tokens={encoder.max_tokens},references={refs.identity}"
        self._ref_vecs: dict[int, np.ndarray | None] = {}

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.cost.calls += 1
        idx = [self.refs.index(r.prompt) for r in requests]
        new = sorted(set(idx) - set(self._ref_vecs))
        before = self.encoder.tokens
        # references apart from the responses: a response's batches, so its bits, are the same on every call
        self._ref_vecs.update(zip(new, self.encoder.encode([self.refs.outputs[i] for i in new])))
        vecs = self.encoder.encode([r.response for r in requests])
        n = self.encoder.tokens - before
        self.cost.tokens += n
        self.cost.flops += 2.0 * self.encoder.n_matmul_params * n
        return [cosine(v, self._ref_vecs[i]) for v, i in zip(vecs, idx)]


@dataclass
class RefSimParams(ReferenceParams):
    model: str = field(
        default="smollm2",
        metadata={
            "help": "the LM whose hidden states compare the texts (smollm2: "
            "the embedded SmolLM2-135M; a hub name, dir or .gguf)"
        },
    )
    max_tokens: int = field(default=256, metadata={"help": "tokens of each text encoded (its first ones)"})
    dtype: str = "auto"  # the LM's dtype (as generator.dtype)
    device: str = "auto"  # the LM's device (auto: the generator's)
    batch_tokens: int = 8192  # padded tokens per forward pass


def build_ref_sim(params: dict[str, Any], ctx: BuildContext) -> RefSimReward:
    from rodeco import load_model_and_tokenizer

    node = _node("ref_sim")
    p = take_params(node, params, RefSimParams)
    check_positive_int(f"{node}.max_tokens", p["max_tokens"], RefSimParams.max_tokens)
    check_positive_int(f"{node}.batch_tokens", p["batch_tokens"], RefSimParams.batch_tokens)
    refs = References.load(str(p["references"]), p["prompts"], node)
    device = p["device"]
    if device == "auto" and ctx.generator is not None:
        device = str(ctx.generator.device)
    try:
        lm, tok = load_model_and_tokenizer(str(p["model"]), None, dtype=str(p["dtype"]), device=str(device))
    except ConfigError as e:  # the loader speaks of generator.*; these values came from the judge's node
        raise ConfigError(e.key.replace("generator.", f"{node}."), e.value, e.problem, e.fix) from e
    encoder = HiddenStateEncoder(lm, tok, max_tokens=int(p["max_tokens"]), batch_tokens=int(p["batch_tokens"]))
    return RefSimReward(refs, encoder, model_name=str(p["model"]))
