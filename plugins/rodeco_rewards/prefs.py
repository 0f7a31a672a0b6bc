"""Preference pairs (``instruction, chosen, rejected``) from ``../shared/data/prefs`` and the baselines reported
next to any reward model's accuracy: length only, and the subset of pairs of similar length."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rodeco import ConfigError

DATA_DIR = "../shared/data"  # relative to the repository root (or the working directory)
SPLITS = {"alpaca_train": "alpaca_eval_prefs_train", "alpaca_test": "alpaca_eval_prefs_test",
          "hh_harmless_test": "hh_rlhf_harmless_test"}


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    group: str  # pairs with the same group share an instruction (kept together in cross-validation)


def data_dir(path: str | Path = DATA_DIR, key: str = "experiment_args.data_dir") -> Path:
    """``path`` as given, else relative to the repository root this package runs from."""
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, Path(__file__).resolve().parents[2] / p]
    for c in candidates:
        if (c / "prefs").is_dir():
            return c.resolve()
    raise ConfigError(key, str(path), f"no prefs/ folder there (looked in {[str(c) for c in candidates]})",
                      "run from the repository root next to ../shared/data, or give the data folder's path")


def split_file(split: str, root: Path) -> Path:
    if split not in SPLITS:
        raise ConfigError("experiment_args.split", split, "unknown preference split", f"use one of {sorted(SPLITS)}")
    f = root / "prefs" / f"{SPLITS[split]}.jsonl.gz"
    if not f.is_file():
        raise ConfigError("experiment_args.data_dir", str(root), f"missing {f.name}", "check the shared data folder")
    return f


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_pairs(split: str, root: Path) -> list[Pair]:
    out = []
    with gzip.open(split_file(split, root), "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            group = str(r.get("alpaca_eval_idx", r.get("hh_index", r["instruction"])))
            out.append(Pair(r["instruction"], r["chosen"], r["rejected"], group))
    return out


def similar_length(p: Pair, tolerance: float = 0.2) -> bool:
    """The two responses are within +-``tolerance`` of each other in characters."""
    a, b = len(p.chosen), len(p.rejected)
    return abs(a - b) <= tolerance * max(a, b, 1)


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """Share of pairs where the chosen response scores higher; a tie counts one half."""
    if not chosen:
        return float("nan")
    wins = sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected))
    return wins / len(chosen)


def length_baseline(pairs: Sequence[Pair]) -> float:
    """Accuracy of "the longer response (in characters) wins"."""
    return pairwise_accuracy([len(p.chosen) for p in pairs], [len(p.rejected) for p in pairs])
