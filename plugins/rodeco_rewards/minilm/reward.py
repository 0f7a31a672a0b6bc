"""``minilm_rm``, rodeco's default reward: frozen all-MiniLM-L6-v2 sentence embeddings of the prompt and the
response, a few surface statistics of the response, and a Bradley-Terry head trained on AlpacaEval preference pairs
(GPT-4-Turbo judge) by ``rodeco experiment=rm_train``. The committed head lives in ``rodeco_rewards/assets``.

Partial responses are scored exactly like finished ones. Prompt embeddings are cached (every candidate of a prompt
shares it, and it is scored again at every decision point).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from rodeco import BuildContext, ConfigError, RewardCost, ScoreRequest, check_positive_int, take_params
from rodeco_rewards.minilm.encoder import Encoder, SentenceEncoder, minilm_dir
from rodeco_rewards.minilm.features import STAT_NAMES, build_features, feature_dim, n_embedding, text_stats
from rodeco_rewards.minilm.head import BTHead, head_identity, load_head

log = logging.getLogger(__name__)

ASSET_STEM = Path(__file__).resolve().parents[1] / "assets" / "minilm_bt_head"


@dataclass
class MiniLMParams:
    head: Optional[str] = field(
        default=None,
        metadata={
            "help": "null: the committed head "
            "(rodeco_rewards/assets/minilm_bt_head); another "
            "committed head by name; or a path"
        },
    )
    encoder: Optional[str] = field(
        default=None, metadata={"help": "null: the embedded all-MiniLM-L6-v2; or a directory holding another"}
    )
    device: str = field(default="auto", metadata={"help": "auto: the generator's device"})
    batch_tokens: int = field(default=8192, metadata={"help": "padded encoder tokens per forward pass"})


def head_stem(path: str) -> Path:
    """``x``, ``x.json`` or ``x.safetensors`` -> ``x``; a bare name that is a committed head (``minilm_prefix_head``)
    -> that head in ``rodeco_rewards/assets``."""
    p = Path(path).expanduser()
    p = p.with_suffix("") if p.suffix in (".json", ".safetensors") else p
    committed = ASSET_STEM.parent / p.name
    if len(p.parts) == 1 and not p.with_suffix(".json").exists() and committed.with_suffix(".json").is_file():
        return committed
    return p


def features(
    encoder: Encoder, prompts: Sequence[str], responses: Sequence[str], prompt_emb: np.ndarray | None = None
) -> np.ndarray:
    """``[n, F]`` head inputs for (prompt, response) pairs; ``prompt_emb`` if the prompts are already encoded."""
    ep = encoder.encode(prompts) if prompt_emb is None else prompt_emb
    er = encoder.encode(responses)
    stats = (
        np.stack([text_stats(p, r) for p, r in zip(prompts, responses)])
        if responses
        else np.zeros((0, len(STAT_NAMES)), np.float32)
    )
    return build_features(ep, er, stats)


class MiniLMReward:
    def __init__(self, encoder: Encoder, head: BTHead, meta: dict[str, Any], *, prompt_cache: int = 1024) -> None:
        if head.shape.in_dim != feature_dim(encoder.dim):
            raise ConfigError(
                "reward.head",
                meta.get("path", "?"),
                f"the head expects {head.shape.in_dim} features, this encoder gives {feature_dim(encoder.dim)}",
                "retrain: rodeco experiment=rm_train",
            )
        self.encoder, self.head, self.meta = encoder, head.to(encoder.device), meta
        stats = meta.get("score_stats")
        self.score_stats = (float(stats["mean"]), float(stats["std"])) if stats else None  # for composite
        self._prompts: OrderedDict[str, np.ndarray] = OrderedDict()
        self._prompt_cache = prompt_cache
        self.n_params = encoder.n_params + sum(p.numel() for p in head.parameters())
        self.cost = RewardCost()
        # what the scores depend on beyond the config node: a pool's score cache is keyed by it
        self.identity = head_identity(head)

    def _prompt_embeddings(self, prompts: Sequence[str]) -> np.ndarray:
        new = [p for p in dict.fromkeys(prompts) if p not in self._prompts]
        if new:
            for p, e in zip(new, self.encoder.encode(new)):
                self._prompts[p] = e
        for p in prompts:
            self._prompts.move_to_end(p)
        out = np.stack([self._prompts[p] for p in prompts])
        while len(self._prompts) > self._prompt_cache:
            self._prompts.popitem(last=False)
        return out

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        if not requests:
            return []
        before = self.encoder.tokens
        ep = self._prompt_embeddings([r.prompt for r in requests])
        x = features(self.encoder, [r.prompt for r in requests], [r.response for r in requests], prompt_emb=ep)
        out = self.head(torch.from_numpy(x).to(self.encoder.device)).float().cpu().tolist()
        n = self.encoder.tokens - before
        self.cost.tokens += n
        self.cost.flops += 2.0 * self.encoder.n_matmul_params * n
        self.cost.calls += 1
        return out

    @torch.inference_mode()
    def parts(self, requests: Sequence[ScoreRequest]) -> dict[str, list[float]]:
        """Each request's score split exactly into the head's terms (a linear head only): ``embedding`` (the
        encoder's features: response embedding, prompt x response, cosine), ``surface`` (the text statistics) and
        ``bias``; they sum to ``score``'s value up to float32 rounding. Free of cost accounting (a diagnostic)."""
        if self.head.shape.hidden:
            raise ValueError(
                f"minilm_rm's head has a hidden layer ({self.head.shape.hidden} units): its score does "
                "not split into feature terms; only a linear head (hidden=0) does"
            )
        ep = self._prompt_embeddings([r.prompt for r in requests])
        x = features(self.encoder, [r.prompt for r in requests], [r.response for r in requests], prompt_emb=ep)
        z = (torch.from_numpy(x).double() - self.head.mu.double().cpu()) / self.head.sigma.double().cpu()
        w = self.head.first_layer.weight[0].detach().double().cpu()
        ne = n_embedding(self.encoder.dim)
        return {
            "embedding": (z[:, :ne] @ w[:ne]).tolist(),
            "surface": (z[:, ne:] @ w[ne:]).tolist(),
            "bias": [float(self.head.first_layer.bias[0])] * len(requests),
        }


def build_minilm_rm(params: dict[str, Any], ctx: BuildContext) -> MiniLMReward:
    from rodeco_rewards.preference_rm import reward_device

    p = take_params("reward", params, MiniLMParams)
    check_positive_int("reward.batch_tokens", p["batch_tokens"], MiniLMParams.batch_tokens)
    stem = ASSET_STEM if p["head"] is None else head_stem(str(p["head"]))
    if not Path(str(stem) + ".json").is_file() or not Path(str(stem) + ".safetensors").is_file():
        raise ConfigError(
            "reward.head",
            p["head"],
            f"no head at {stem}.json/.safetensors",
            "train one with `rodeco experiment=rm_train`, or leave reward.head=null for the committed head",
        )
    head, meta = load_head(stem)
    meta["path"] = str(stem)
    enc_dir = minilm_dir() if p["encoder"] is None else Path(str(p["encoder"])).expanduser()
    if not (enc_dir / "config.json").is_file():
        raise ConfigError(
            "reward.encoder",
            p["encoder"],
            "no config.json in that directory",
            "leave reward.encoder=null for the embedded all-MiniLM-L6-v2",
        )
    device = reward_device(str(p["device"]), ctx)
    enc = SentenceEncoder(enc_dir, max_length=int(meta["max_length"]), batch_tokens=p["batch_tokens"], device=device)
    log.info("minilm_rm: head %s (trained %s)", stem.name, meta.get("trained_with", "?"))
    return MiniLMReward(enc, head, meta)
