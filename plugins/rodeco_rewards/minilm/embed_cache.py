"""A disk cache of sentence embeddings under ``$RODECO_CACHE/minilm_emb`` (outside the repository), so that
``rm_train`` and ``rm_eval`` encode the preference data once (about 10 minutes on 2 CPU cores) and then take seconds.

``CachingEncoder`` has the ``SentenceEncoder`` interface; the reward's scoring path runs unchanged on top of it. The
cache file is keyed by the encoder's weights (size, mtime) and ``max_length``; entries by the sha256 of the text.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rodeco import cache_dir
from rodeco_rewards.minilm.encoder import Encoder

log = logging.getLogger(__name__)


def encoder_key(model_dir: Path, max_length: int) -> str:
    parts = [str(max_length)]
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def text_key(text: str, side: str = "right") -> str:
    tag = "" if side == "right" else f"{side}\x00"
    return hashlib.sha256((tag + text).encode("utf-8")).hexdigest()[:32]


class CachingEncoder:
    """Looks texts up in the cache, encodes the rest with ``inner``; ``save()`` writes new entries to disk."""

    def __init__(self, inner: Encoder, path: Path | None = None) -> None:
        self.inner = inner
        self.path = path or cache_dir() / "minilm_emb" / f"{encoder_key(inner.model_dir, inner.max_length)}.npz"
        self.table: dict[str, np.ndarray] = {}
        self.dirty = False
        if self.path.is_file():
            with np.load(self.path) as z:
                self.table = dict(zip(z["keys"].tolist(), z["emb"]))
            log.info("%d cached embeddings in %s", len(self.table), self.path)

    def __getattr__(self, name: str):  # device, dim, max_length, n_params, tokens, tokenizer ... of the encoder
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def encode(self, texts: Sequence[str], side: str = "right") -> np.ndarray:
        keys = [text_key(t, side) for t in texts]
        missing = list(dict.fromkeys(t for t, k in zip(texts, keys) if k not in self.table))
        if missing:
            log.info("encoding %d texts not in the cache", len(missing))
            for t, e in zip(missing, self.inner.encode(missing, side)):
                self.table[text_key(t, side)] = e
            self.dirty = True
        if not texts:
            return np.zeros((0, self.inner.dim), dtype=np.float32)
        return np.stack([self.table[k] for k in keys])

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self.table)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, keys=np.array(keys, dtype="U32"), emb=np.stack([self.table[k] for k in keys]))
        os.replace(tmp, self.path)  # atomic: an interrupted run never leaves half a cache
        self.dirty = False
        log.info("saved %d embeddings to %s", len(keys), self.path)
