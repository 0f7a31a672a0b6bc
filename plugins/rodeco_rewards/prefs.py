"""Preference pairs (``instruction, chosen, rejected``) from the data root's ``prefs/`` and the baselines reported
next to any reward model's accuracy: length only, and the subset of pairs of similar length."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rodeco import ConfigError

SPLITS = {
    "alpaca_train": "alpaca_eval_prefs_train",
    "alpaca_test": "alpaca_eval_prefs_test",
    "hh_harmless_test": "hh_rlhf_harmless_test",
}


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str
    group: str  # pairs with the same group share an instruction (kept together in cross-validation)


def data_dir(path: str | Path | None = None, key: str = "experiment_args.data_dir") -> Path:
    """The folder that holds ``prefs/``: ``path`` (config key ``key``), else the data root (``RODECO_DATA``, else
    ``../shared/data``: ``rodeco.core.data.data_root``)."""
    from rodeco import data_root

    root = data_root(None if path is None else str(path), key)
    if not (root / "prefs").is_dir():
        raise ConfigError(
            key,
            str(root),
            "no prefs/ folder there",
            f"point {key} (or RODECO_DATA) at the folder that holds prefs/ and prompts/",
        )
    return root


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


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def held_out(
    pairs: Sequence[Pair],
    files: Sequence[str],
    prompts: Sequence[str],
    root: Path,
    key: str = "experiment_args.exclude_files",
) -> tuple[list[Pair], dict]:
    """``pairs`` without those whose instruction is an evaluation prompt: one of ``files``' records (JSON list or
    JSONL, relative to ``root``; matched by AlpacaEval index ``af_eval_idx``/``alpaca_eval_idx`` and by text) or one
    of ``prompts`` (by text). Returns the kept pairs and what was removed."""
    idx, texts = set(), {_norm(t) for t in prompts}
    for name in files:
        f = Path(name) if Path(name).is_absolute() else root / name
        if not f.is_file():
            raise ConfigError(key, name, f"no such file under {root}", "give prompt files relative to data_dir")
        raw = f.read_text(encoding="utf-8")
        recs = json.loads(raw) if f.suffix == ".json" else [json.loads(x) for x in raw.splitlines() if x.strip()]
        for r in recs:
            for k in ("af_eval_idx", "alpaca_eval_idx"):
                if k in r:
                    idx.add(str(r[k]))
            texts.update(_norm(r[k]) for k in ("prompt", "instruction") if r.get(k))
    kept = [p for p in pairs if p.group not in idx and _norm(p.prompt) not in texts]
    removed = {p.group for p in pairs} - {p.group for p in kept}
    return kept, {
        "files": list(files),
        "prompts": list(prompts),
        "pairs_removed": len(pairs) - len(kept),
        "instructions_removed": len(removed),
    }


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
