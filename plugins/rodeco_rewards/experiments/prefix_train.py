"""``rodeco experiment=prefix_train pool=TRAINING_POOL``: a prefix-trained head for the embedded reward (TCRM,
arXiv 2604.22981; Controlled Decoding's prefix scorer), shipped as ``partial_reward=minilm_prefix``.

The head is the embedded RM's own kind (a linear Bradley-Terry head on the MiniLM features, same standardization),
started at the committed head's weights ``w0`` and fitted on three terms:

- **Bradley-Terry** on the AlpacaEval training preference pairs (full texts, as ``rm_train``), with ``rm_train``'s
  chosen penalties: what keeps the final-text accuracy;
- **lookahead consistency** (Monte Carlo), weight ``mc``: the squared error between a prefix's score and the final
  reward of its own response (the committed head on the finished text), both centred within each (prompt, length)
  group of the training pool's prefixes at ``lengths``, since a rejection policy only uses the order within one
  prompt at one length;
- **smoothness** (temporal difference), weight ``td``: the squared difference of a candidate's scores at adjacent
  lengths.

Splits: the pool's prompts fall in three (``value_train``'s seeded split, the same prompts): *fit*, *choose* (picks
``(mc, td)`` by mean within-prompt Pearson r with the final reward at ``verdict_lengths``) and *verdict* (used once).
The pairs' instructions fall in two: ``pair_holdout`` of them are kept out of the fit and give each candidate's
final-text accuracy; a ``(mc, td)`` is admissible only when that accuracy is within ``max_accuracy_drop`` of the
Bradley-Terry-only fit on the same pairs. ``w0`` itself is always a candidate (with no data the head *is* ``same``).
The verdict, per length with bootstrap CIs, is ``value_train``'s.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco import Compute, ConfigError, RunOutput, check_positive_int
from rodeco_rewards.experiments import learned_heads_train as lht
from rodeco_rewards.experiments.head_fit import group_ids, group_loss, group_pearsons, minimize_lbfgs, padded

log = logging.getLogger(__name__)

ASSET_NAME = "minilm_prefix_head"


@dataclass
class PairSet:
    """Standardized features of the training pairs: ``fit`` (chosen, rejected) and ``held`` (kept out)."""

    fit: tuple[np.ndarray, np.ndarray]
    held: tuple[np.ndarray, np.ndarray]
    counts: dict[str, int]


@dataclass
class Prefixes:
    """The fit prompts' prefixes in the anchor's standardized feature space."""

    Z: np.ndarray  # [E, F]
    final: np.ndarray  # [E] the final reward of the row's candidate
    groups: np.ndarray  # [E] one per (prompt, length)
    td: np.ndarray  # [P, 2] rows of one candidate at adjacent lengths


def check_args(cfg: DictConfig) -> dict[str, Any]:
    a = lht.check_split_args(cfg, "prefix_train")
    check_positive_int("experiment_args.max_iter", a["max_iter"], 200)
    for key in ("mc_weights", "td_weights"):
        if not a[key] or any(w < 0 for w in a[key]):
            raise ConfigError(
                f"experiment_args.{key}", a[key], "must be a non-empty list of weights >= 0", "e.g. [0.1, 1.0]"
            )
    if not a["anchor_weights"] or any(k < 0 for k in a["anchor_weights"]):
        raise ConfigError(
            "experiment_args.anchor_weights",
            a["anchor_weights"],
            "must be a non-empty list of "
            "weights >= 0 (0: the penalty on the weights, as rm_train; k > 0: k times it on their "
            "distance from the committed head's)",
            "e.g. [0, 10, 100]",
        )
    check_positive_int("experiment_args.pair_limit", a["pair_limit"], 1000, allow_none=True)
    if not 0 < a["pair_holdout"] < 1:
        raise ConfigError("experiment_args.pair_holdout", a["pair_holdout"], "must be in (0, 1)", "e.g. 0.2")
    if cfg.reward.name != "minilm_rm" or cfg.reward.get("head") is not None:
        raise ConfigError(
            "reward",
            cfg.reward.name,
            "prefix_train refits the committed minilm_rm head and takes its final scores as the lookahead target",
            "leave reward at its default (minilm_rm)",
        )
    return a


def load_pair_set(a: dict[str, Any], encoder, anchor, seed: int) -> PairSet:
    """The training pairs without evaluation prompts, featurized (cached embeddings) and standardized by the anchor;
    ``pair_holdout`` of their instructions held out (seeded)."""
    from rodeco_rewards.minilm.reward import features
    from rodeco_rewards.prefs import data_dir, held_out, load_pairs

    root = data_dir(a["data_dir"])
    pairs, removed = held_out(load_pairs("alpaca_train", root), a["exclude_files"], a["exclude_prompts"], root)
    pairs = pairs[: a["pair_limit"]] if a["pair_limit"] else pairs
    prompts = [p.prompt for p in pairs]
    xc = features(encoder, prompts, [p.chosen for p in pairs])
    xr = features(encoder, prompts, [p.rejected for p in pairs])
    encoder.save()
    groups = sorted({p.group for p in pairs})
    rng = np.random.default_rng(seed)
    held_groups = set(rng.permutation(groups)[: max(1, round(len(groups) * a["pair_holdout"]))].tolist())
    held = np.array([p.group in held_groups for p in pairs])
    mu, sigma = anchor.mu.double().numpy(), anchor.sigma.double().numpy()

    def z(x: np.ndarray) -> np.ndarray:
        return (x - mu) / sigma

    zc, zr = z(xc.astype(np.float64)), z(xr.astype(np.float64))
    return PairSet(
        (zc[~held], zr[~held]),
        (zc[held], zr[held]),
        {
            "pairs": len(pairs),
            "held_out_pairs": int(held.sum()),
            "instructions": len(groups),
            "held_out_instructions": len(held_groups),
            "evaluation_pairs_removed": removed["pairs_removed"],
        },
    )


def prefixes(
    data: dict[int, dict[str, np.ndarray]], finals: dict[int, np.ndarray], ids: list[int], anchor, lengths: list[int]
) -> Prefixes:
    """The prefixes of prompts ``ids`` at ``lengths`` (``value_train``'s text features without the two position
    columns); ``td`` pairs a candidate's rows at adjacent ones."""
    n = anchor.shape.in_dim
    mu, sd = anchor.mu.double().numpy(), anchor.sigma.double().numpy()
    Z, f, pr, L, td, start = [], [], [], [], [], 0
    nxt = dict(zip(lengths, lengths[1:]))
    for i in ids:
        d = {k: v[np.isin(data[i]["length"], lengths)] if k != "lengths_asked" else v for k, v in data[i].items()}
        Z.append((d["x"][:, :n].astype(np.float64) - mu) / sd)
        f.append(finals[i][d["candidate"]])
        pr.append(np.full(len(d["length"]), i))
        L.append(d["length"])
        row = {(int(c), int(l)): start + k for k, (c, l) in enumerate(zip(d["candidate"], d["length"]))}
        td += [(r, row[(c, nxt[l])]) for (c, l), r in row.items() if l in nxt and (c, nxt[l]) in row]
        start += len(d["length"])
    prompt, length = np.concatenate(pr), np.concatenate(L)
    return Prefixes(
        np.concatenate(Z), np.concatenate(f), group_ids(prompt, length), np.asarray(td, dtype=np.int64).reshape(-1, 2)
    )


def fit_prefix_head(
    w0: np.ndarray,
    pen: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray],
    pre: Prefixes,
    mc: float,
    td: float,
    max_iter: int,
    anchor: float = 0.0,
) -> np.ndarray:
    """The weights (standardized space) minimizing Bradley-Terry on ``pairs`` + the ``pen``-weighted L2 + ``mc`` x
    the centred lookahead error + ``td`` x the adjacent-length error, by L-BFGS from ``w0``. The L2 is on ``w``
    (``anchor = 0``: ``rm_train``'s own penalty) or, ``anchor > 0`` times, on ``w - w0`` (the head moves from the
    committed one only as far as the data pays for)."""
    import torch

    zc, zr = (torch.from_numpy(x) for x in pairs)
    dz = zc - zr
    Z, f = torch.from_numpy(pre.Z), torch.from_numpy(pre.final)
    pads = torch.from_numpy(padded(pre.groups)) if len(pre.groups) else None
    D = (Z[pre.td[:, 0]] - Z[pre.td[:, 1]]) if len(pre.td) else None
    p = torch.from_numpy(pen)
    w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    W0, k = torch.from_numpy(np.asarray(w0, dtype=np.float64)), (anchor if anchor > 0 else 1.0)

    def objective() -> torch.Tensor:
        loss = torch.nn.functional.softplus(-(dz @ w)).mean() + k * ((w - W0 if anchor > 0 else w).pow(2) * p).sum()
        if mc and pads is not None:
            loss = loss + mc * group_loss(Z @ w, f, pads, "mse")
        if td and D is not None:
            loss = loss + td * (D @ w).pow(2).mean()
        return loss

    minimize_lbfgs([w], objective, max_iter)
    return w.detach().numpy().copy()


def pair_accuracy(w: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> float:
    m = (pairs[0] - pairs[1]) @ w
    return float(np.mean(np.where(m > 0, 1.0, np.where(m == 0, 0.5, 0.0))))


def choose_r(w: np.ndarray, pre: Prefixes) -> float:
    r = group_pearsons(pre.Z @ w, pre.final, pre.groups)
    return float(r.mean()) if r.size else float("nan")


def choose(
    w0: np.ndarray, pen: np.ndarray, ps: PairSet, fit: Prefixes, cho: Prefixes, a: dict[str, Any], progress: bool
) -> tuple[np.ndarray, dict[str, Any]]:
    """Every ``(mc, td)`` fitted, the Bradley-Terry-only fit as the accuracy reference, ``w0`` a candidate too; the
    admissible one with the best choose-split r kept (ties: the anchor, then the earlier)."""
    from tqdm.auto import tqdm

    ref = fit_prefix_head(w0, pen, ps.fit, fit, 0.0, 0.0, a["max_iter"])
    ref_acc = pair_accuracy(ref, ps.held)
    cands = [("anchor", None, None, None, w0)]
    grid = [(mc, td, k) for k in a["anchor_weights"] for mc in a["mc_weights"] for td in a["td_weights"]]
    for mc, td, k in tqdm(grid, desc="prefix_train fits", disable=not progress):
        cands.append(("fit", mc, td, k, fit_prefix_head(w0, pen, ps.fit, fit, mc, td, a["max_iter"], k)))
    rows, best = [], None
    for kind, mc, td, k, w in cands:
        acc, r, rf = pair_accuracy(w, ps.held), choose_r(w, cho), choose_r(w, fit)
        ok = kind == "anchor" or acc >= ref_acc - a["max_accuracy_drop"]
        rows.append(
            {
                "candidate": kind,
                "mc": mc,
                "td": td,
                "anchor": k,
                "held_out_pair_accuracy": round(acc, 4),
                "choose_pearson": r if math.isfinite(r) else None,
                "admissible": ok,
                "fit_pearson": rf if math.isfinite(rf) else None,
            }
        )  # in sample: how much it overfits
        log.info(
            "prefix_train %s mc=%s td=%s anchor=%s: held-out pair accuracy %.4f, choose r %.4f, fit r %.4f%s",
            kind,
            mc,
            td,
            k,
            acc,
            r,
            rf,
            "" if ok else " (inadmissible)",
        )
        if ok and math.isfinite(r) and (best is None or r > best[0]):
            best = (r, w, rows[-1])
    w, rec = (w0, rows[0]) if best is None else best[1:]
    return w, {"chosen": rec, "bt_only_held_out_pair_accuracy": round(ref_acc, 4), "grid": rows}


def run(cfg: DictConfig, plugins, out_dir: str | Path | None) -> RunOutput:
    """Fit, choose and judge the prefix head; the report is ``prefix_train.json``, the head ``minilm_prefix_head``
    in the run directory (and in the assets with ``install``)."""
    import torch

    from rodeco_rewards.learned_heads import ASSETS, minilm_encoder, text_value_anchor
    from rodeco_rewards.minilm.embed_cache import CachingEncoder
    from rodeco_rewards.minilm.features import n_embedding
    from rodeco_rewards.minilm.head import BTHead, load_head, save_head
    from rodeco_rewards.minilm.reward import ASSET_STEM
    from rodeco_rewards.minilm.train import TrainConfig, penalty

    a = check_args(cfg)
    ts = lht.open_training_set(cfg, plugins, a)
    targets = lht.compute_targets(ts, cfg.output.progress)
    finals = targets.raw
    out = Path(out_dir) if out_dir is not None else None
    data = lht.compute_features("text_value", ts, out, cfg.output.progress)  # value_train's cache, shared
    anchor, meta0 = load_head(ASSET_STEM)
    if anchor.shape.hidden:
        raise ConfigError(
            "reward.head",
            f"hidden={anchor.shape.hidden}",
            "prefix_train refits a linear head",
            "use the committed minilm_rm head (hidden 0)",
        )
    sel = meta0["train"]["selected"]
    encoder = CachingEncoder(minilm_encoder())
    n_emb = n_embedding(encoder.dim)
    pen = penalty(anchor.shape.in_dim, n_emb, TrainConfig(l2=sel["l2"], l2_embedding=sel["l2_embedding"])).double()
    w0 = anchor.first_layer.weight.detach().double().numpy()[0]
    ps = load_pair_set(a, encoder, anchor, int(cfg.seed))
    fit = prefixes(data, finals, ts.fit, anchor, ts.lengths)
    cho = prefixes(data, finals, ts.choose, anchor, [L for L in ts.lengths if L in a["verdict_lengths"]])
    w, chosen = choose(w0, pen.numpy(), ps, fit, cho, a, cfg.output.progress)
    head = BTHead(anchor.shape)
    head.load_state_dict(anchor.state_dict())
    with torch.no_grad():
        head.first_layer.weight.copy_(torch.from_numpy(w[None]).float())
    verdict, per_len = lht.judge(text_value_anchor(head, ts.max_new), data, targets, ts, a, cfg.seed)
    meta = {k: meta0[k] for k in ("max_length", "encoder", "features", "held_out")}
    meta.update(
        {
            "trained_with": "rodeco experiment=prefix_train",
            "anchor": str(ASSET_STEM.name),
            "pool": str(ts.pool.path),
            "pairs": ps.counts,
            "lengths": ts.lengths,
            **chosen,
            "verdict": verdict,
            "verdict_by_length": per_len,
            "fit_prompts": ts.fit,
            "choose_prompts": ts.choose,
            "verdict_prompts": ts.verdict,
            "seed": int(cfg.seed),
        }
    )
    if out is not None:
        save_head(head, out / ASSET_NAME, meta)
    if a["install"]:
        save_head(head, ASSETS / ASSET_NAME, meta)
    lht.print_verdict("minilm_prefix", verdict, per_len, task="prefix_train")
    c = chosen["chosen"]
    print(
        f"prefix_train_chosen: {c['candidate']} mc={c['mc']} td={c['td']} anchor={c['anchor']} held-out pair accuracy "
        f"{c['held_out_pair_accuracy']} (Bradley-Terry only: {chosen['bt_only_held_out_pair_accuracy']})"
    )
    report = {
        "verdict": verdict,
        "by_length": per_len,
        **chosen,
        "pairs": ps.counts,
        "fit_prompts": len(ts.fit),
        "choose_prompts": len(ts.choose),
        "verdict_prompts": len(ts.verdict),
    }
    if out is not None:
        (out / "prefix_train.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return RunOutput([], Compute(), out, extra=report)
