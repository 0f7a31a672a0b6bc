"""``rodeco experiment=rm_eval``: held-out pairwise accuracy of a reward on ``alpaca_eval_prefs_test`` and
``hh_rlhf_harmless_test``, next to the length-only baseline and on the AlpacaEval pairs of similar length (+-20%).

The reward is the configured one (the default ``minilm_rm`` unless ``reward=...`` says otherwise), built through the
registry and called through its ``score`` like in a decoding run; every pair is scored as a complete response.
With ``experiment_args.cache=true`` the embedded RM's encoder reads the embedding cache that ``rm_train`` filled.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rodeco import BuildContext, Compute, Plugins, RunOutput, node_dict

log = logging.getLogger(__name__)


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    from rodeco_rewards.minilm.evaluate import accuracy, sample_pairs, score_pairs
    from rodeco_rewards.prefs import data_dir, load_pairs

    args = node_dict(cfg.experiment_args)  # keys and types checked by RMEvalArgs
    root = data_dir(args["data_dir"])
    params = node_dict(cfg.reward)
    name = params.pop("name")
    reward = plugins.build_reward(cfg.reward, BuildContext(device="cpu", plugins=plugins))
    cache = _attach_cache(reward) if args["cache"] else None
    results: dict[str, dict[str, Any]] = {}
    for split in ("alpaca_test", "hh_harmless_test"):
        pairs = load_pairs(split, root)
        if args["limit"]:
            pairs = sample_pairs(pairs, int(args["limit"]))
        t0 = time.perf_counter()
        acc = accuracy(pairs, score_pairs(reward, pairs))
        results[split] = {**acc.as_dict(), "seconds": round(time.perf_counter() - t0, 1)}
        log.info("%s: %s", split, results[split])
    if cache is not None:
        cache.save()
    a, h = results["alpaca_test"], results["hh_harmless_test"]
    print(f"reward: {name} {params}")
    for split, r in results.items():
        print(
            f"{split}: {r['n']} pairs, rm {r['rm']:.4f}, length-only {r['length_baseline']:.4f}; "
            f"{r['n_similar']} similar-length pairs: rm {r['rm_similar']:.4f}, length-only {r['length_similar']:.4f}"
        )
    print(f"rm_accuracy_alpaca_test: {a['rm']:.4f}")
    print(f"length_baseline_alpaca_test: {a['length_baseline']:.4f}")
    print(f"rm_accuracy_alpaca_test_similar_length: {a['rm_similar']:.4f}")
    print(f"rm_accuracy_hh_harmless_test: {h['rm']:.4f}")
    return RunOutput(
        results=[], compute=Compute(), out_dir=Path(out_dir) if out_dir else None, extra={"accuracy": results}
    )


def _attach_cache(reward: Any):
    """Route the embedded RM's encoder through the disk cache; other rewards are left as they are."""
    from rodeco_rewards.minilm.embed_cache import CachingEncoder
    from rodeco_rewards.minilm.reward import MiniLMReward

    if not isinstance(reward, MiniLMReward) or isinstance(reward.encoder, CachingEncoder):
        return None
    reward.encoder = CachingEncoder(reward.encoder)
    return reward.encoder
