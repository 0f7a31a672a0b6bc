"""``rodeco experiment=value_train pool=TRAINING_POOL``: train the learned partial scorers (``value_head``,
``text_value``: ``rodeco_rewards.learned_heads``) on a pool of training prompts, and measure whether they beat ``same``.

- Examples: every candidate still active at each length ``L`` of ``experiment_args.lengths`` (longer than ``L``
  tokens), its features at ``L`` (the pool's hidden state, or the embedded RM's features of the partial text; both
  with the position), its target the final reward standardized within its prompt.
- Split: a seeded ``validation_fraction`` of the prompts is held out; the training prompts fit the head (ridge
  with its penalty chosen on validation, or a one-hidden-layer MLP with its epoch chosen on validation).
- Verdict: on the validation prompts, the mean per-prompt Pearson r with the final reward at each length, for the
  head and for ``same`` (the reward's own partial score), with a bootstrap 95% CI of the difference. A head *beats
  same* when the difference averaged over lengths has a CI above 0.

Features are computed once per prompt and kept in the run directory (a rerun resumes); training is seeded.
The experiment keeps its registered name ``value_train``; this module is named for what it trains.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco import (
    Compute,
    ConfigError,
    PoolReward,
    RunOutput,
    atomic_write,
    check_positive_int,
    check_training_prompts,
    open_pool,
    pool_served,
    prompts_of,
)
from rodeco_rewards.learned_heads import (
    ASSETS,
    KINDS,
    Head,
    minilm_encoder,
    npz_bytes,
    pearson,
    position_features,
    text_features,
)

log = logging.getLogger(__name__)


@dataclass
class TrainingSet:
    """What every head kind is trained and judged on: the pool, its prompts split in two, the reward."""

    pool: Any  # rodeco's Pool
    gen: Any  # the pool's ReplayGenerator (decodes partial texts)
    cached: PoolReward  # the reward, served from the pool's score cache
    reward_name: str  # ``name:identity``, for the head's metadata
    prompts: list[int]
    train: list[int]
    val: list[int]
    lengths: list[int]
    max_new: int


@dataclass
class Targets:
    """``final[i]``: prompt ``i``'s final rewards standardized within the prompt, per candidate; ``same[i][L]``: the
    reward's own partial score at length ``L`` of each candidate longer than ``L`` (validation prompts only)."""

    final: dict[int, np.ndarray]
    same: dict[int, dict[int, np.ndarray]]


@dataclass
class Examples:
    """Examples of some prompts stacked: one row per (candidate, length) where the candidate is still active."""

    x: np.ndarray  # [E, F] features
    y: np.ndarray  # [E] the candidate's final reward, standardized within its prompt
    prompt: np.ndarray  # [E] prompt index
    length: np.ndarray  # [E] decision length

    @property
    def groups(self) -> np.ndarray:
        return group_ids(self.prompt, self.length)


def check_args(cfg: DictConfig) -> dict[str, Any]:
    """The experiment's arguments as a dict, their values checked (keys and types are checked by ValueTrainArgs), and
    a pool given."""
    a = OmegaConf.to_container(cfg.experiment_args, resolve=True)
    for k in a["kinds"]:
        if k not in KINDS:
            raise ConfigError("experiment_args.kinds", k, "unknown head kind", f"use some of {list(KINDS)}")
    check_positive_int("experiment_args.bootstrap", a["bootstrap"], 1000)
    if not 0 < a["validation_fraction"] < 1:
        raise ConfigError("experiment_args.validation_fraction", a["validation_fraction"], "must be in (0, 1)",
                          "e.g. 0.2")
    if cfg.pool is None:
        raise ConfigError("pool", None, "value_train learns from a pool of training prompts",
                          "record one: rodeco experiment=pool data=alpaca_train experiment_args.candidates=32 "
                          "pool=DIR, then pass pool=DIR")
    return a


def open_training_set(cfg: DictConfig, plugins, a: dict[str, Any]) -> TrainingSet:
    """The prompts (none from an evaluation set, all recorded in the pool), their seeded split, and the reward."""
    prompts = prompts_of(cfg.data)
    check_training_prompts(prompts, a["exclude_data"], plugins)
    pool, gen = open_pool(cfg.pool)
    missing = [p.index for p in prompts if not pool.has(p.index)]
    if missing:
        raise ConfigError("pool", cfg.pool, f"{len(missing)} of the prompts are not recorded (e.g. {missing[:5]})",
                          "record them first: rodeco experiment=pool with the same data and pool")
    lengths, max_new = sorted(set(a["lengths"])), int(pool.settings["max_new_tokens"])
    train, val = split([p.index for p in prompts], a["validation_fraction"], cfg.seed)
    node = OmegaConf.to_container(cfg.reward, resolve=True)
    cached = pool_served(plugins, pool, node)
    return TrainingSet(pool, gen, cached, f"{node['name']}:{getattr(cached.reward, 'identity', '')}",
                       [p.index for p in prompts], train, val, lengths, max_new)


def split(indices: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation): a seeded shuffle of the prompts, the last ``fraction`` held out."""
    order = list(indices)
    np.random.default_rng(seed).shuffle(order)
    k = max(1, round(len(order) * fraction))
    return sorted(order[:-k]), sorted(order[-k:])


def compute_targets(ts: TrainingSet, progress: bool) -> Targets:
    """Every prompt's standardized final rewards, and ``same`` (the reward's own partial scores at each length) on
    the validation prompts; the scores are cached in the pool."""
    from tqdm.auto import tqdm

    final, same = {}, {}
    for i in tqdm(ts.prompts, desc="targets", unit="prompt", disable=not progress):
        pp = ts.pool.prompt(i)
        ts.gen.add(pp)
        f = np.asarray(ts.cached.score(pp.final_requests()))
        final[i] = (f - f.mean()) / (f.std() or 1.0)
        if i in ts.val:
            same[i] = {L: np.asarray(ts.cached.score([pp.request(c, L, ts.gen.decode_text(cand.token_ids[:L]))
                                                      for c, cand in enumerate(pp.candidates)
                                                      if len(cand.token_ids) > L])) for L in ts.lengths}
    ts.cached.save()
    return Targets(final, same)


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
            x = np.concatenate([np.asarray(h[cand_a, L_a - 1], dtype=np.float64),
                                position_features(L_a, self.max_new)], axis=1) if cand else np.zeros((0, 1))
        else:
            reqs = [p.request(i, n, self.gen.decode_text(p.candidates[i].token_ids[:n])) for i, n in zip(cand, L)]
            x = text_features(self.encoder, reqs, self.max_new) if reqs else np.zeros((0, 1))
        return {"x": x.astype(np.float32), "candidate": cand_a, "length": L_a, "lengths_asked": np.asarray(lengths)}


def compute_features(kind: str, ts: TrainingSet, out: Path | None, progress: bool) -> dict[int, dict[str, np.ndarray]]:
    """Each prompt's examples for head ``kind`` (features, candidate, length), cached under ``out``."""
    from tqdm.auto import tqdm

    feat = Featurizer(kind, ts.pool, ts.gen, out / f"features_{kind}" if out else None, ts.max_new)
    return {i: feat(i, ts.lengths) for i in tqdm(ts.prompts, desc=f"features {kind}", unit="prompt",
                                                 disable=not progress)}


def stack(data: dict[int, dict[str, np.ndarray]], targets: Targets, ids: list[int]) -> Examples:
    """The examples of prompts ``ids``, each with its target."""
    return Examples(x=np.concatenate([data[i]["x"] for i in ids]).astype(np.float64),
                    y=np.concatenate([targets.final[i][data[i]["candidate"]] for i in ids]),
                    prompt=np.concatenate([np.full(len(data[i]["length"]), i, dtype=np.int64) for i in ids]),
                    length=np.concatenate([data[i]["length"] for i in ids]))


def group_ids(prompt: np.ndarray, length: np.ndarray) -> np.ndarray:
    """A group number per example: one group per (prompt, length) pair, numbered in the pairs' sorted order."""
    pairs = np.stack([np.asarray(prompt, dtype=np.int64), np.asarray(length, dtype=np.int64)], axis=1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1)


def group_pearsons(pred: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Pearson r of ``pred`` with ``y`` within each group of at least 3 examples where neither is constant."""
    out = []
    for g in np.unique(groups):
        m = groups == g
        if m.sum() >= 3 and np.ptp(y[m]) > 0 and np.ptp(pred[m]) > 0:
            out.append(pearson(pred[m], y[m]))
    return np.asarray(out)


def fit_head(train: Examples, val: Examples, a: dict[str, Any], seed: int,
             progress: bool) -> tuple[Head, dict[str, Any]]:
    """The head and what was chosen for it: features standardized on the training examples; ridge with the penalty,
    or the MLP with the epoch, whose mean per-(prompt, length) Pearson r on the validation examples is best."""
    mean, std = train.x.mean(0), train.x.std(0)
    std[std == 0] = 1.0
    Z, Zv = (train.x - mean) / std, (val.x - mean) / std
    gv = val.groups

    def val_score(f) -> float:
        return float(np.nanmean(group_pearsons(f(Zv), val.y, gv)))

    if a["hidden_units"] == 0:
        fits = []
        for alpha in a["ridge_alphas"]:
            w, b = fit_ridge(Z, train.y, alpha)
            fits.append((val_score(lambda M, w=w, b=b: M @ w + b), alpha, w, b))
        _, alpha, w, b = max(fits, key=lambda t: t[0])
        return Head(mean, std, np.zeros((0, 0)), np.zeros(0), w, b, {}), {"ridge_alpha": alpha}
    P, _, ep = fit_mlp(Z, train.y, Zv, val_score, a["hidden_units"], a["epochs"], seed, progress)
    head = Head(mean, std, P[0].T, P[1], P[2][0], float(P[3][0]), {})
    return head, {"epochs": ep, "hidden_units": a["hidden_units"]}


def fit_ridge(X: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """Ridge regression on standardized features ``X``: weights (penalty ``alpha`` per example) and the intercept."""
    A = X.T @ X + alpha * len(X) * np.eye(X.shape[1])
    w = np.linalg.solve(A, X.T @ (y - y.mean()))
    return w, float(y.mean())


def fit_mlp(X: np.ndarray, y: np.ndarray, Xv: np.ndarray, score_val, hidden: int, epochs: int, seed: int,
            progress: bool) -> tuple[list[np.ndarray], float, int]:
    """A one-hidden-layer MLP (MSE, Adam, weight decay), seeded; the epoch with the best validation score."""
    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-3)
    Xt, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    best = (-math.inf, None, 0)
    for ep in tqdm(range(epochs), desc="value_train mlp", unit="epoch", disable=not progress):
        for b in torch.randperm(len(Xt), generator=gen).split(512):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(Xt[b])[:, 0], yt[b])
            loss.backward()
            opt.step()
        with torch.no_grad():
            params = [t.detach().numpy().copy() for t in net.parameters()]
        s = score_val(lambda Z, P=params: np.maximum(Z @ P[0].T + P[1], 0) @ P[2][0] + P[3][0])
        if s > best[0]:
            best = (s, params, ep + 1)
    return best[1], best[0], best[2]


def pearsons_by_length(pred: np.ndarray, val: Examples, targets: Targets, val_ids: list[int],
                       lengths: list[int]) -> tuple[dict[str, Any], list[dict[int, float]]]:
    """Per length: the mean per-prompt Pearson r of the head and of ``same`` with the final reward (prompts where both
    are defined); and per length, each such prompt's head r minus same r."""
    per_len: dict[str, Any] = {}
    diffs = []
    for L in lengths:
        hr, sr = {}, {}
        for i in val_ids:
            m = (val.prompt == i) & (val.length == L)
            if m.sum() >= 3 and np.ptp(val.y[m]) > 0:
                s = targets.same[i][L]
                hr[i] = pearson(pred[m], val.y[m])
                sr[i] = pearson(s, val.y[m]) if np.ptp(s) > 0 else float("nan")
        both = [i for i in hr if math.isfinite(hr[i]) and math.isfinite(sr[i])]
        per_len[str(L)] = {"head": float(np.mean([hr[i] for i in both])),
                           "same": float(np.mean([sr[i] for i in both])), "prompts": len(both)}
        diffs.append({i: hr[i] - sr[i] for i in both})
    return per_len, diffs


def bootstrap_verdict(diffs: list[dict[int, float]], resamples: int, seed: int) -> dict[str, Any]:
    """Head minus same averaged over lengths per prompt (prompts defined at every length), its mean and seeded
    bootstrap 95% CI over prompts; the head beats same when the CI is above 0."""
    common = sorted(set.intersection(*(set(d) for d in diffs)))
    D = np.array([[d[i] for d in diffs] for i in common]).mean(1)  # per prompt, averaged over lengths
    rng = np.random.default_rng(seed)
    boot = [rng.choice(D, size=len(D)).mean() for _ in range(resamples)]
    ci = [float(np.percentile(boot, q)) for q in (2.5, 97.5)]
    return {"mean_diff": float(D.mean()), "diff_ci": ci, "prompts": len(common), "beats_same": ci[0] > 0}


def save_head(head: Head, kind: str, ts: TrainingSet, chosen: dict[str, Any], verdict: dict[str, Any],
              per_len: dict[str, Any], seed: int, out: Path | None, install: bool) -> None:
    """The head with what it was trained on and its verdict, into the run directory and (``install``) the assets."""
    head.meta = {"kind": kind, "max_new_tokens": ts.max_new, "lengths": ts.lengths, **chosen,
                 "generator": str(ts.pool.settings["generator"].get("model", "")), "reward": ts.reward_name,
                 "validation": verdict, "validation_by_length": per_len, "train_prompts": ts.train,
                 "validation_prompts": ts.val, "trained_with": "rodeco experiment=value_train",
                 "pool": str(ts.pool.path), "seed": seed}
    if out is not None:
        head.save(out / kind)
    if install:
        head.save(ASSETS / kind)


def print_verdict(kind: str, verdict: dict[str, Any], per_len: dict[str, Any]) -> None:
    """One line per length (head r vs same r), then the verdict."""
    for L, r in per_len.items():
        print(f"value_train_{kind}_len{L}: pearson head {r['head']:.3f} vs same {r['same']:.3f} "
              f"({r['prompts']} validation prompts)")
    ci = verdict["diff_ci"]
    print(f"value_train_{kind}_minus_same: {verdict['mean_diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] "
          f"-> {'beats' if verdict['beats_same'] else 'does not beat'} same")


def run(cfg: DictConfig, plugins, out_dir: str | Path | None) -> RunOutput:
    """Train and judge each head kind of ``experiment_args.kinds``; the report is ``value_train.json``."""
    a = check_args(cfg)
    ts = open_training_set(cfg, plugins, a)
    targets = compute_targets(ts, cfg.output.progress)
    out = Path(out_dir) if out_dir is not None else None
    report: dict[str, Any] = {"train_prompts": len(ts.train), "validation_prompts": len(ts.val),
                              "lengths": ts.lengths, "candidates": ts.pool.candidates, "pool": str(ts.pool.path),
                              "kinds": {}}
    for kind in a["kinds"]:
        data = compute_features(kind, ts, out, cfg.output.progress)
        train, val = stack(data, targets, ts.train), stack(data, targets, ts.val)
        head, chosen = fit_head(train, val, a, cfg.seed, cfg.output.progress)
        per_len, diffs = pearsons_by_length(head(val.x), val, targets, ts.val, ts.lengths)
        verdict = bootstrap_verdict(diffs, a["bootstrap"], cfg.seed)
        save_head(head, kind, ts, chosen, verdict, per_len, cfg.seed, out, a["install"])
        report["kinds"][kind] = {**verdict, "by_length": per_len, **chosen}
        print_verdict(kind, verdict, per_len)
    if out is not None:
        (out / "value_train.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return RunOutput([], Compute(), out, extra=report)
