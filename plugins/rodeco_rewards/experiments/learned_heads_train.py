"""``rodeco experiment=value_train pool=TRAINING_POOL``: train the learned partial scorers (``value_head``,
``text_value``: ``rodeco_rewards.learned_heads``) on a pool of training prompts, and measure whether they beat ``same``.

- Examples: every candidate still active at each length ``L`` of ``experiment_args.lengths`` (longer than ``L``
  tokens), its features at ``L`` (the pool's hidden state, or the embedded RM's features of the partial text; both
  with the position), its target the final reward standardized within its prompt.
- Splits: the prompts are shuffled once (seeded) into three: *fit* (the weights), *choose* (``choose_fraction``:
  per length bucket the loss, ``mse`` or ``bt``, the penalty, or the MLP's epoch) and *verdict*
  (``verdict_fraction``: used once, to judge the chosen head). How a head is fitted: ``head_fit``. In short:
  features centred within each (prompt, length); one weight vector per bucket of ``length_buckets``;
  ``text_value`` anchored on the reward's own head (``w = a w_rm + delta``, penalty on ``delta``: with no data it
  *is* ``same``); ``value_head`` anchored on its own fit pooled over all lengths.
- Verdict: on the verdict prompts, per length, the mean per-prompt Pearson r with the final reward of the head and
  of ``same`` (the reward's own partial score), each with a bootstrap 95% CI over prompts, and their paired
  difference with its CI; then the difference averaged over ``verdict_lengths`` (8, 16, 32) per prompt, with its
  CI. A head *beats same* when that CI is above 0.

Features are computed once per prompt and kept in the run directory (a rerun resumes); training is seeded.
The experiment keeps its registered name ``value_train``; this module is named for what it trains.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco import (
    Compute,
    ConfigError,
    PoolReward,
    RunOutput,
    atomic_write,
    check_positive_int,
    check_training_prompts,
    node_dict,
    open_pool,
    pool_served,
    prompts_of,
)
from rodeco.experiments import bootstrap
from rodeco_rewards.experiments.head_fit import (
    LOSSES,
    Examples,
    fit_anchored,
    fit_mlp_buckets,
    fit_value_head,
)
from rodeco_rewards.learned_heads import (
    ASSETS,
    KINDS,
    Head,
    bucket_names,
    minilm_encoder,
    npz_bytes,
    pearson,
    position_features,
    text_features,
    text_value_anchor,
)

log = logging.getLogger(__name__)


@dataclass
class TrainingSet:
    """What every head kind is trained and judged on: the pool, its prompts split in three, the reward."""

    pool: Any  # rodeco's Pool
    gen: Any  # the pool's ReplayGenerator (decodes partial texts)
    cached: PoolReward  # the reward, served from the pool's score cache
    reward_name: str  # ``name:identity``, for the head's metadata
    prompts: list[int]
    fit: list[int]
    choose: list[int]
    verdict: list[int]
    lengths: list[int]
    max_new: int


@dataclass
class Targets:
    """``final[i]``: prompt ``i``'s final rewards standardized within the prompt, per candidate (``raw[i]``: in the
    reward's units); ``same[i][L]``: the reward's own partial score at length ``L`` of each candidate longer than
    ``L`` (verdict prompts only)."""

    final: dict[int, np.ndarray]
    same: dict[int, dict[int, np.ndarray]]
    raw: dict[int, np.ndarray] = field(default_factory=dict)


def check_args(cfg: DictConfig) -> dict[str, Any]:
    """The experiment's arguments as a dict, their values checked (keys and types are checked by ValueTrainArgs), and
    a pool given."""
    a = check_split_args(cfg, "value_train")
    for k in a["kinds"]:
        if k not in KINDS:
            raise ConfigError("experiment_args.kinds", k, "unknown head kind", f"use some of {list(KINDS)}")
    for k in a["losses"]:
        if k not in LOSSES:
            raise ConfigError("experiment_args.losses", k, "unknown loss", f"use some of {list(LOSSES)}")
    if sorted(set(a["length_buckets"])) != a["length_buckets"] or min(a["length_buckets"], default=1) < 1:
        raise ConfigError(
            "experiment_args.length_buckets",
            a["length_buckets"],
            "must be increasing positive lengths (each bucket's last length)",
            "e.g. [8, 16, 32, 64]",
        )
    if any(x <= 0 for x in a["ridge_alphas"]):
        raise ConfigError(
            "experiment_args.ridge_alphas",
            a["ridge_alphas"],
            "penalties must be > 0 (the anchor itself, an infinite penalty, is always a candidate)",
            "e.g. [0.001, 0.01, 0.1]",
        )
    return a


def check_split_args(cfg: DictConfig, task: str) -> dict[str, Any]:
    """What every experiment that trains on a pool's prompts checks: the bootstrap, the three-way split's fractions,
    the verdict lengths, and a pool given."""
    a = node_dict(cfg.experiment_args)
    check_positive_int("experiment_args.bootstrap", a["bootstrap"], 1000)
    for key in ("choose_fraction", "verdict_fraction"):
        if not 0 < a[key] < 1:
            raise ConfigError(f"experiment_args.{key}", a[key], "must be in (0, 1)", "e.g. 0.2")
    if a["choose_fraction"] + a["verdict_fraction"] >= 1:
        raise ConfigError(
            "experiment_args.choose_fraction",
            a["choose_fraction"],
            "choose_fraction + verdict_fraction leaves no prompt to fit on",
            "e.g. 0.2 and 0.2",
        )
    if not a["verdict_lengths"] or not set(a["verdict_lengths"]) <= set(a["lengths"]):
        raise ConfigError(
            "experiment_args.verdict_lengths",
            a["verdict_lengths"],
            f"must be some of experiment_args.lengths {a['lengths']}",
            "e.g. [8, 16, 32]",
        )
    if cfg.pool is None:
        raise ConfigError(
            "pool",
            None,
            f"{task} learns from a pool of training prompts",
            "record one: rodeco experiment=pool data=alpaca_train experiment_args.candidates=32 "
            "pool=DIR, then pass pool=DIR",
        )
    return a


def open_training_set(cfg: DictConfig, plugins, a: dict[str, Any]) -> TrainingSet:
    """The prompts (none from an evaluation set, all recorded in the pool), their seeded split, and the reward."""
    prompts = prompts_of(cfg.data)
    check_training_prompts(prompts, a["exclude_data"], plugins)
    pool, gen = open_pool(cfg.pool)
    missing = [p.index for p in prompts if not pool.has(p.index)]
    if missing:
        raise ConfigError(
            "pool",
            cfg.pool,
            f"{len(missing)} of the prompts are not recorded (e.g. {missing[:5]})",
            "record them first: rodeco experiment=pool with the same data and pool",
        )
    lengths, max_new = sorted(set(a["lengths"])), int(pool.settings["max_new_tokens"])
    fit, choose, verdict = split([p.index for p in prompts], a["choose_fraction"], a["verdict_fraction"], cfg.seed)
    node = node_dict(cfg.reward)
    cached = pool_served(plugins, pool, node)
    if "text_value" in a.get("kinds", ()) and (node["name"] != "minilm_rm" or node.get("head") is not None):
        log.warning(
            "text_value starts as the committed minilm_rm head's partial score; this run's reward is %s, "
            "so its `same` is another scorer",
            node["name"],
        )
    return TrainingSet(
        pool,
        gen,
        cached,
        f"{node['name']}:{getattr(cached.reward, 'identity', '')}",
        [p.index for p in prompts],
        fit,
        choose,
        verdict,
        lengths,
        max_new,
    )


def split(
    indices: list[int], choose_fraction: float, verdict_fraction: float, seed: int
) -> tuple[list[int], list[int], list[int]]:
    """(fit, choose, verdict): one seeded shuffle of the prompts; the last ``verdict_fraction`` of it is the verdict
    split, the ``choose_fraction`` before it the choose split (each at least one prompt), the rest fit."""
    order = list(indices)
    np.random.default_rng(seed).shuffle(order)
    kv = max(1, round(len(order) * verdict_fraction))
    kc = max(1, round(len(order) * choose_fraction))
    if len(order) - kv - kc < 1:
        raise ConfigError(
            "data",
            f"{len(order)} prompts",
            "too few to split into fit, choose and verdict prompts",
            "use more prompts (data.limit) or smaller experiment_args fractions",
        )
    return sorted(order[: -kv - kc]), sorted(order[-kv - kc : -kv]), sorted(order[-kv:])


def compute_targets(ts: TrainingSet, progress: bool) -> Targets:
    """Every prompt's standardized final rewards, and ``same`` (the reward's own partial scores at each length) on
    the verdict prompts; the scores are cached in the pool."""
    from tqdm.auto import tqdm

    final, same, raw = {}, {}, {}
    for i in tqdm(ts.prompts, desc="targets", unit="prompt", disable=not progress):
        pp = ts.pool.prompt(i)
        ts.gen.add(pp)
        f = np.asarray(ts.cached.score(pp.final_requests()))
        final[i], raw[i] = (f - f.mean()) / (f.std() or 1.0), f
        if i in ts.verdict:
            same[i] = {
                L: np.asarray(
                    ts.cached.score(
                        [
                            pp.request(c, L, ts.gen.decode_text(cand.token_ids[:L]))
                            for c, cand in enumerate(pp.candidates)
                            if len(cand.token_ids) > L
                        ]
                    )
                )
                for L in ts.lengths
            }
    ts.cached.save()
    return Targets(final, same, raw)


class Featurizer:
    """Features of one prompt's active candidates at each length, cached as ``features_<kind>/<index>.npz``."""

    def __init__(self, kind: str, pool, gen, cache: Path | None, max_new: int) -> None:
        self.kind, self.pool, self.gen, self.cache, self.max_new = kind, pool, gen, cache, max_new
        self.encoder = minilm_encoder() if kind == "text_value" else None

    def __call__(self, index: int, lengths: list[int]) -> dict[str, np.ndarray]:
        """Prompt ``index``'s examples, from the cache when it was computed for the same lengths."""
        f = self.cache / f"{index}.npz" if self.cache is not None else None
        if f is not None and f.is_file():
            d = dict(np.load(f))
            if list(d["lengths_asked"]) == list(lengths):
                return d
        d = self.compute(index, lengths)
        if f is not None:
            atomic_write(f, npz_bytes(**d))
        return d

    def compute(self, index: int, lengths: list[int]) -> dict[str, np.ndarray]:
        """``x`` [E, F]: the features of each candidate longer than each length, at that length; ``candidate``,
        ``length`` [E]: which example each row is; ``lengths_asked``: the lengths, for the cache to check."""
        p = self.pool.prompt(index)
        cand, L = [], []
        for length in lengths:
            idx = [i for i, c in enumerate(p.candidates) if len(c.token_ids) > length]
            cand += idx
            L += [length] * len(idx)
        cand_a, L_a = np.asarray(cand, dtype=np.int64), np.asarray(L, dtype=np.int64)
        if self.kind == "value_head":
            h = self.pool.hidden(index)
            x = (
                np.concatenate(
                    [np.asarray(h[cand_a, L_a - 1], dtype=np.float64), position_features(L_a, self.max_new)], axis=1
                )
                if cand
                else np.zeros((0, 1))
            )
        else:
            reqs = [p.request(i, n, self.gen.decode_text(p.candidates[i].token_ids[:n])) for i, n in zip(cand, L)]
            x = text_features(self.encoder, reqs, self.max_new) if reqs else np.zeros((0, 1))
        return {"x": x.astype(np.float32), "candidate": cand_a, "length": L_a, "lengths_asked": np.asarray(lengths)}


def compute_features(kind: str, ts: TrainingSet, out: Path | None, progress: bool) -> dict[int, dict[str, np.ndarray]]:
    """Each prompt's examples for head ``kind`` (features, candidate, length), cached under ``out``."""
    from tqdm.auto import tqdm

    feat = Featurizer(kind, ts.pool, ts.gen, out / f"features_{kind}" if out else None, ts.max_new)
    return {
        i: feat(i, ts.lengths) for i in tqdm(ts.prompts, desc=f"features {kind}", unit="prompt", disable=not progress)
    }


def stack(data: dict[int, dict[str, np.ndarray]], targets: Targets, ids: list[int]) -> Examples:
    """The examples of prompts ``ids``, each with its target (prompts without an active candidate add none)."""
    ids = [i for i in ids if len(data[i]["length"])]
    if not ids:
        f = next(iter(data.values()))["x"].shape[1] if data else 0
        return Examples(np.zeros((0, f)), np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return Examples(
        x=np.concatenate([data[i]["x"] for i in ids]).astype(np.float64),
        y=np.concatenate([targets.final[i][data[i]["candidate"]] for i in ids]),
        prompt=np.concatenate([np.full(len(data[i]["length"]), i, dtype=np.int64) for i in ids]),
        length=np.concatenate([data[i]["length"] for i in ids]),
    )


def train_head(
    kind: str,
    data: dict[int, dict[str, np.ndarray]],
    targets: Targets,
    ts: TrainingSet,
    a: dict[str, Any],
    seed: int,
    progress: bool,
) -> tuple[Head, dict[str, Any]]:
    """The head of ``kind`` and what was chosen for it, from the fit and choose prompts only."""
    from rodeco_rewards.minilm.head import load_head
    from rodeco_rewards.minilm.reward import ASSET_STEM

    fit, choose = stack(data, targets, ts.fit), stack(data, targets, ts.choose)
    edges = a["length_buckets"]
    if kind == "text_value":
        if a["hidden_units"]:
            log.info("text_value stays linear (anchored on the reward's head); hidden_units is value_head's")
        anchor = text_value_anchor(load_head(ASSET_STEM)[0], ts.max_new)
        head, recs = fit_anchored(fit, choose, anchor, edges, a["ridge_alphas"], a["losses"])
        return head, {"anchor": anchor.meta["anchor"], "buckets": recs}
    if a["hidden_units"]:
        return fit_mlp_buckets(fit, choose, edges, a["losses"], a["hidden_units"], a["epochs"], seed, progress)
    return fit_value_head(fit, choose, edges, a["ridge_alphas"], a["losses"])


def per_prompt_pearsons(
    pred: np.ndarray, ver: Examples, targets: Targets, ids: list[int], L: int
) -> tuple[dict[int, float], dict[int, float]]:
    """At length ``L``, each verdict prompt's Pearson r with the final reward, of the head and of ``same``: prompts
    with at least 3 active candidates whose rewards differ and where both are defined."""
    hr, sr = {}, {}
    for i in ids:
        m = (ver.prompt == i) & (ver.length == L)
        s = targets.same[i][L]
        if m.sum() >= 3 and np.ptp(ver.y[m]) > 0 and np.ptp(s) > 0 and np.ptp(pred[m]) > 0:
            hr[i], sr[i] = pearson(pred[m], ver.y[m]), pearson(s, ver.y[m])
    return hr, sr


def bootstrap_means(cols: np.ndarray, resamples: int, rng: np.random.Generator) -> list[list[float]]:
    """Per column of ``cols [prompts, C]``: the bootstrap 95% CI of its mean over prompts (prompts resampled
    together, so that differences are paired)."""
    boot = cols[bootstrap.draws(len(cols), resamples, rng)].mean(1)  # [resamples, C]
    return [bootstrap.ci(boot[:, c]) for c in range(cols.shape[1])]


def judge(
    head: Head, data: dict[int, dict[str, np.ndarray]], targets: Targets, ts: TrainingSet, a: dict[str, Any], seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The verdict on the verdict prompts: per length, the head's and ``same``'s mean per-prompt r and their
    difference, each with a bootstrap CI; and the difference averaged over ``verdict_lengths``, with its CI."""
    ver = stack(data, targets, ts.verdict)
    pred = head(ver.x, ver.length)
    rng = np.random.default_rng(seed)
    per_len: dict[str, Any] = {}
    diffs: dict[int, dict[int, float]] = {}
    for L in ts.lengths:
        hr, sr = per_prompt_pearsons(pred, ver, targets, ts.verdict, L)
        diffs[L] = {i: hr[i] - sr[i] for i in hr}
        if not hr:
            per_len[str(L)] = {"prompts": 0}
            continue
        cols = np.array([[hr[i], sr[i], hr[i] - sr[i]] for i in hr])
        ci = bootstrap_means(cols, a["bootstrap"], rng)
        per_len[str(L)] = {
            "head": float(cols[:, 0].mean()),
            "head_ci": ci[0],
            "same": float(cols[:, 1].mean()),
            "same_ci": ci[1],
            "diff": float(cols[:, 2].mean()),
            "diff_ci": ci[2],
            "prompts": len(hr),
        }
    return averaged_verdict(diffs, a["verdict_lengths"], a["bootstrap"], rng), per_len


def averaged_verdict(
    diffs: dict[int, dict[int, float]], lengths: list[int], resamples: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Head minus same averaged over ``lengths`` per prompt (prompts defined at every one of them), its mean and
    bootstrap 95% CI over prompts; the head beats same when the CI is above 0."""
    common = sorted(set.intersection(*(set(diffs[L]) for L in lengths)))
    if not common:
        return {
            "mean_diff": float("nan"),
            "diff_ci": [float("nan")] * 2,
            "prompts": 0,
            "lengths": lengths,
            "beats_same": False,
        }
    D = np.array([[diffs[L][i] for L in lengths] for i in common]).mean(1, keepdims=True)
    ci = bootstrap_means(D, resamples, rng)[0]
    return {
        "mean_diff": float(D.mean()),
        "diff_ci": ci,
        "prompts": len(common),
        "lengths": lengths,
        "beats_same": ci[0] > 0,
    }


def save_head(
    head: Head,
    kind: str,
    ts: TrainingSet,
    a: dict[str, Any],
    chosen: dict[str, Any],
    verdict: dict[str, Any],
    per_len: dict[str, Any],
    seed: int,
    out: Path | None,
) -> None:
    """The head with what it was trained on, what was chosen and its verdict, into the run directory and
    (``install``) the assets. Every prompt it saw is listed: ``fit_prompts``, ``choose_prompts``,
    ``verdict_prompts``."""
    head.meta = {
        "kind": kind,
        "max_new_tokens": ts.max_new,
        "lengths": ts.lengths,
        "length_buckets": bucket_names(a["length_buckets"]),
        "chosen": chosen,
        "generator": str(ts.pool.settings["generator"].get("model", "")),
        "reward": ts.reward_name,
        "verdict": verdict,
        "verdict_by_length": per_len,
        "fit_prompts": ts.fit,
        "choose_prompts": ts.choose,
        "verdict_prompts": ts.verdict,
        "trained_with": "rodeco experiment=value_train",
        "pool": str(ts.pool.path),
        "seed": seed,
    }
    if out is not None:
        head.save(out / kind)
    if a["install"]:
        head.save(ASSETS / kind)


def print_verdict(kind: str, verdict: dict[str, Any], per_len: dict[str, Any], task: str = "value_train") -> None:
    """One line per length (head r vs same r, their difference, with CIs), then the verdict."""
    for L, r in per_len.items():
        if not r["prompts"]:
            print(f"{task}_{kind}_len{L}: no verdict prompt with a defined r")
            continue
        print(
            f"{task}_{kind}_len{L}: pearson head {r['head']:.3f} {_ci(r['head_ci'])} vs same "
            f"{r['same']:.3f} {_ci(r['same_ci'])}, head - same {r['diff']:+.3f} {_ci(r['diff_ci'], '+')} "
            f"({r['prompts']} verdict prompts)"
        )
    print(
        f"{task}_{kind}_minus_same: {verdict['mean_diff']:+.3f} {_ci(verdict['diff_ci'], '+')} "
        f"(mean over lengths {verdict['lengths']}, {verdict['prompts']} verdict prompts) "
        f"-> {'beats' if verdict['beats_same'] else 'does not beat'} same"
    )


def _ci(ci: list[float], sign: str = "") -> str:
    return f"[{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]"


def run(cfg: DictConfig, plugins, out_dir: str | Path | None) -> RunOutput:
    """Train, choose and judge each head kind of ``experiment_args.kinds``; the report is ``value_train.json``."""
    a = check_args(cfg)
    ts = open_training_set(cfg, plugins, a)
    targets = compute_targets(ts, cfg.output.progress)
    out = Path(out_dir) if out_dir is not None else None
    report: dict[str, Any] = {
        "fit_prompts": len(ts.fit),
        "choose_prompts": len(ts.choose),
        "verdict_prompts": len(ts.verdict),
        "lengths": ts.lengths,
        "candidates": ts.pool.candidates,
        "pool": str(ts.pool.path),
        "kinds": {},
    }
    for kind in a["kinds"]:
        data = compute_features(kind, ts, out, cfg.output.progress)
        head, chosen = train_head(kind, data, targets, ts, a, cfg.seed, cfg.output.progress)
        verdict, per_len = judge(head, data, targets, ts, a, cfg.seed)
        save_head(head, kind, ts, a, chosen, verdict, per_len, cfg.seed, out)
        report["kinds"][kind] = {**verdict, "by_length": per_len, "chosen": chosen}
        print_verdict(kind, verdict, per_len)
    if out is not None:
        (out / "value_train.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return RunOutput([], Compute(), out, extra=report)
