"""``smollm_judge``: a learned judge on another base model than the guide reward (``minilm_rm``), meant for the
``judge`` role (it scores winners after a decode; the search never sees it).

- **features**: the embedded SmolLM2-135M-Instruct (loaded as ``logprob`` loads ``smollm2``), frozen; the prompt is
  given as context through SmolLM2's chat template (its last ``max_prompt_tokens`` tokens) and the response's first
  ``max_response_tokens`` tokens follow it. A *pooling* reads the hidden states at the response's positions:
  ``mean`` (final layer, after the final norm, averaged over the response tokens), ``last`` (final layer at the last
  response token) or ``mean_mid`` (the middle layer's output, averaged). The head names the poolings it was trained
  on; their vectors are concatenated.
- **head**: linear, ``r = ((x - mean) / std) . w``, fitted as a Bradley-Terry model on AlpacaEval preference pairs
  with the log length ratio of each pair as a nuisance regressor (and/or pairs balanced by length), and on synthetic
  pairs (a training response over its truncated, repeated and shuffled copies), by ``rodeco experiment=judge_train``.
  The nuisance term is dropped when judging: the scoring path has no length input (a response's length beyond the
  window is invisible to it, and within the window only the hidden states carry it). No hand-made text statistics.

An empty response is read as SmolLM2's end-of-turn token alone (what the model emits for an empty answer).
The committed head lives in ``rodeco_rewards/assets/smollm_judge.{npz,json}``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, atomic_write, check_positive_int, take_params
from rodeco_rewards.batching import token_batches

log = logging.getLogger(__name__)

ASSET_STEM = Path(__file__).parent / "assets" / "smollm_judge"
POOLINGS = ("mean", "last", "mean_mid")
NODE = "judge.smollm_judge"  # what it is for: its errors name the judge's keys
TRAIN_FIX = "train one: rodeco experiment=judge_train experiment_args.install=true"


class HiddenStateFeatures:
    """Pooled hidden states of a causal LM at the response's positions, the prompt given as chat context.

    Batches are length-sorted and right-padded with attention masks, so a text's features do not depend on its batch
    neighbours beyond floating-point rounding."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_prompt_tokens: int,
        max_response_tokens: int,
        batch_tokens: int = 8192,
        max_batch_size: int = 64,
    ) -> None:
        import torch

        self.lm, self.tokenizer = model.eval(), tokenizer
        self.base = model.base_model  # the decoder stack without the LM head: hidden states are all we need
        self.max_prompt_tokens, self.max_response_tokens = max_prompt_tokens, max_response_tokens
        self.batch_tokens, self.max_batch_size = batch_tokens, max_batch_size
        self.device = next(model.parameters()).device
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self.n_layers = int(model.config.num_hidden_layers)
        self.dim = int(model.config.hidden_size)
        emb = self.base.get_input_embeddings().weight
        # the LM head is not run and the embedding is a lookup: the decoder's other weights are the matmul work
        self.n_matmul_params = sum(p.numel() for p in self.base.parameters()) - emb.numel()
        self.use_chat = getattr(tokenizer, "chat_template", None) is not None
        self.tokens = 0
        self._prompts: dict[str, list[int]] = {}

    def prompt_ids(self, prompt: str) -> list[int]:
        """The prompt as the model's chat template renders it, ready for the assistant's turn; its last
        ``max_prompt_tokens`` tokens (the turn's start stays next to the response)."""
        if prompt not in self._prompts:
            if self.use_chat:
                text = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            else:
                ids = self.tokenizer(prompt)["input_ids"]
            self._prompts[prompt] = [int(i) for i in ids][-self.max_prompt_tokens :]
        return self._prompts[prompt]

    def response_ids(self, response: str) -> list[int]:
        """The response's first ``max_response_tokens`` tokens; an empty one is the end-of-turn token alone."""
        ids = [int(i) for i in self.tokenizer(response, add_special_tokens=False)["input_ids"]]
        if not ids:
            ids = [int(self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0)]
        return ids[: self.max_response_tokens]

    def pooled(self, prompts: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
        """Every pooling of :data:`POOLINGS` for each (prompt, response): ``{pooling: [n, dim] float32}``."""
        import torch

        pairs = [(self.prompt_ids(p), self.response_ids(r)) for p, r in zip(prompts, responses)]
        out = {k: np.zeros((len(pairs), self.dim), dtype=np.float32) for k in POOLINGS}
        lengths = [len(p) + len(r) for p, r in pairs]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        mid = self.n_layers // 2
        with torch.inference_mode():
            for batch in token_batches(lengths, self.batch_tokens, self.max_batch_size):
                L = max(lengths[i] for i in batch)
                x = torch.full((len(batch), L), int(pad), dtype=torch.long)
                mask = torch.zeros((len(batch), L), dtype=torch.long)
                resp = torch.zeros((len(batch), L), dtype=torch.float32)  # 1 at the response's positions
                last = torch.zeros(len(batch), dtype=torch.long)
                for row, i in enumerate(batch):
                    p, r = pairs[i]
                    x[row, : lengths[i]] = torch.tensor(p + r)
                    mask[row, : lengths[i]] = 1
                    resp[row, len(p) : lengths[i]] = 1.0
                    last[row] = lengths[i] - 1
                o = self.base(
                    input_ids=x.to(self.device),
                    attention_mask=mask.to(self.device),
                    output_hidden_states=True,
                    use_cache=False,
                )
                final, middle = o.last_hidden_state.float(), o.hidden_states[mid].float()
                w = resp.to(self.device)[..., None]
                n = w.sum(1)
                pooled = {
                    "mean": (final * w).sum(1) / n,
                    "mean_mid": (middle * w).sum(1) / n,
                    "last": final[torch.arange(len(batch), device=self.device), last.to(self.device)],
                }
                for k, v in pooled.items():
                    out[k][batch] = v.cpu().numpy()
                self.tokens += int(mask.sum())
        return out

    def features(self, prompts: Sequence[str], responses: Sequence[str], poolings: Sequence[str]) -> np.ndarray:
        """``[n, len(poolings) * dim]``: the named poolings side by side."""
        if not responses:
            return np.zeros((0, len(poolings) * self.dim), dtype=np.float32)
        p = self.pooled(prompts, responses)
        return np.concatenate([p[k] for k in poolings], axis=1)


@dataclass
class JudgeHead:
    """A linear head on standardized pooled hidden states: ``r = ((x - mean) / std) . w``. Nothing else enters a
    score: the length nuisance fitted beside ``w`` is kept in ``meta`` for the record only."""

    mean: np.ndarray
    std: np.ndarray
    w: np.ndarray
    meta: dict[str, Any]

    def __post_init__(self) -> None:
        self.mean, self.std, self.w = (
            np.asarray(a, dtype=np.float64).reshape(-1) for a in (self.mean, self.std, self.w)
        )
        if not len(self.mean) == len(self.std) == len(self.w):
            raise ValueError(
                f"mean, std and w must have one length (got {len(self.mean)}, {len(self.std)}, {len(self.w)})"
            )

    @property
    def poolings(self) -> list[str]:
        return list(self.meta["poolings"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, dtype=np.float64) - self.mean) / self.std) @ self.w

    @property
    def identity(self) -> str:
        h = hashlib.sha256()
        for a in (self.mean, self.std, self.w):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        h.update(
            json.dumps(
                {k: self.meta[k] for k in ("model", "dtype", "poolings", "max_prompt_tokens", "max_response_tokens")},
                sort_keys=True,
            ).encode()
        )
        return h.hexdigest()[:16]

    def save(self, stem: Path) -> None:
        buf = io.BytesIO()
        np.savez(buf, mean=self.mean, std=self.std, w=self.w)
        atomic_write(stem.with_suffix(".npz"), buf.getvalue())
        atomic_write(stem.with_suffix(".json"), json.dumps({**self.meta, "identity": self.identity}, indent=1) + "\n")

    @classmethod
    def load(cls, stem: Path, key: str = f"{NODE}.head") -> JudgeHead:
        if not stem.with_suffix(".npz").is_file() or not stem.with_suffix(".json").is_file():
            raise ConfigError(key, str(stem), "no judge head there (.npz and .json)", TRAIN_FIX)
        meta = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
        bad = [p for p in meta.get("poolings", []) if p not in POOLINGS]
        if not meta.get("poolings") or bad:
            raise ConfigError(
                key, str(stem), f"its poolings {meta.get('poolings')} are not among {POOLINGS}", TRAIN_FIX
            )
        with np.load(stem.with_suffix(".npz")) as d:
            return cls(d["mean"], d["std"], d["w"], meta)


class SmolLMJudge:
    """The reward: SmolLM2's pooled hidden states of (prompt, response) through the committed linear head."""

    def __init__(self, features: HiddenStateFeatures, head: JudgeHead) -> None:
        want = len(head.poolings) * features.dim
        if len(head.w) != want:
            raise ConfigError(
                f"{NODE}.head",
                head.meta.get("path", "?"),
                f"the head has {len(head.w)} weights, this model's {head.poolings} give {want} features",
                TRAIN_FIX,
            )
        self.features, self.head = features, head
        self.cost = RewardCost()
        self.identity = head.identity  # what the scores depend on beyond the config node
        self.n_params = features.n_matmul_params + len(head.w)

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        if not requests:
            return []
        before = self.features.tokens
        x = self.features.features([r.prompt for r in requests], [r.response for r in requests], self.head.poolings)
        n = self.features.tokens - before
        self.cost.calls += 1
        self.cost.tokens += n
        self.cost.flops += 2.0 * self.features.n_matmul_params * n + 2.0 * len(self.head.w) * len(requests)
        return [float(s) for s in self.head(x)]


@dataclass
class JudgeParams:
    head: Optional[str] = field(
        default=None,
        metadata={
            "help": "null: the committed head (rodeco_rewards/assets/smollm_judge); or a path to another (.npz/.json)"
        },
    )
    device: str = field(default="auto", metadata={"help": "auto: the generator's device, else CUDA when present"})
    dtype: Optional[str] = field(
        default=None,
        metadata={"help": "null: the dtype the head's features were extracted in (its .json); or float32, bfloat16"},
    )
    batch_tokens: int = field(default=8192, metadata={"help": "padded tokens per forward pass"})


def head_stem(given: Any) -> Path:
    if given is None:
        return ASSET_STEM
    p = Path(str(given)).expanduser()
    return p.with_suffix("") if p.suffix in (".npz", ".json") else p


def load_features(
    model: str,
    *,
    dtype: str,
    device: str,
    max_prompt_tokens: int,
    max_response_tokens: int,
    batch_tokens: int = 8192,
    key: str = NODE,
) -> HiddenStateFeatures:
    """The scoring LM (``smollm2`` is the embedded one) wrapped as a feature extractor."""
    from rodeco import load_model_and_tokenizer

    try:
        lm, tok = load_model_and_tokenizer(model, None, dtype=dtype, device=device)
    except ConfigError as e:  # the loader speaks of generator.*; these values came from the judge's node
        raise ConfigError(e.key.replace("generator.", f"{key}."), e.value, e.problem, e.fix) from e
    return HiddenStateFeatures(
        lm, tok, max_prompt_tokens=max_prompt_tokens, max_response_tokens=max_response_tokens, batch_tokens=batch_tokens
    )


def build_smollm_judge(params: dict[str, Any], ctx: BuildContext) -> SmolLMJudge:
    p = take_params(NODE, params, JudgeParams)
    check_positive_int(f"{NODE}.batch_tokens", p["batch_tokens"], JudgeParams.batch_tokens)
    stem = head_stem(p["head"])
    head = JudgeHead.load(stem)
    head.meta["path"] = str(stem)
    device = p["device"]
    if device == "auto" and ctx.generator is not None:
        device = str(ctx.generator.device)
    feats = load_features(
        str(head.meta["model"]),
        dtype=str(p["dtype"] or head.meta["dtype"]),
        device=str(device),
        max_prompt_tokens=int(head.meta["max_prompt_tokens"]),
        max_response_tokens=int(head.meta["max_response_tokens"]),
        batch_tokens=int(p["batch_tokens"]),
    )
    return SmolLMJudge(feats, head)
