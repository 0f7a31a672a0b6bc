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
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco import (
    BuildContext,
    Compute,
    ConfigError,
    PoolReward,
    RunOutput,
    atomic_write,
    check_positive_int,
    check_training_prompts,
    open_pool,
    prompts_of,
    reward_key,
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


def split(indices: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation): a seeded shuffle of the prompts, the last ``fraction`` held out."""
    order = list(indices)
    np.random.default_rng(seed).shuffle(order)
    k = max(1, round(len(order) * fraction))
    return sorted(order[:-k]), sorted(order[-k:])


class Featurizer:
    """Features of one prompt's active candidates at each length, cached as ``features_<kind>/<index>.npz``."""

    def __init__(self, kind: str, pool, gen, cache: Path | None, max_new: int) -> None:
        self.kind, self.pool, self.gen, self.cache, self.max_new = kind, pool, gen, cache, max_new
        self.encoder = minilm_encoder() if kind == "text_value" else None

    def __call__(self, index: int, lengths: list[int]) -> dict[str, np.ndarray]:
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


def group_pearsons(pred: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    out = []
    for g in np.unique(groups):
        m = groups == g
        if m.sum() >= 3 and np.ptp(y[m]) > 0 and np.ptp(pred[m]) > 0:
            out.append(pearson(pred[m], y[m]))
    return np.asarray(out)


def fit_ridge(X: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
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


def run(cfg: DictConfig, plugins, out_dir: str | Path | None) -> RunOutput:
    a = OmegaConf.to_container(cfg.experiment_args, resolve=True)  # keys and types checked by ValueTrainArgs
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
    reward = plugins.build_reward(node, BuildContext(device="cpu", plugins=plugins))
    cached = PoolReward(pool, reward, reward_key(node, getattr(reward, "identity", None)))
    out = Path(out_dir) if out_dir is not None else None
    from tqdm.auto import tqdm

    y_of, same_of = {}, {}
    for p in tqdm(prompts, desc="targets", unit="prompt", disable=not cfg.output.progress):
        gen.add(pool.prompt(p.index))
        f = np.asarray(cached.score(pool.prompt(p.index).final_requests()))
        y_of[p.index] = (f - f.mean()) / (f.std() or 1.0)
        if p.index in val:  # `same`: the reward's own partial score at each length
            pp = pool.prompt(p.index)
            same_of[p.index] = {L: np.asarray(cached.score([pp.request(i, L, gen.decode_text(c.token_ids[:L]))
                                                            for i, c in enumerate(pp.candidates)
                                                            if len(c.token_ids) > L])) for L in lengths}
    cached.save()
    report: dict[str, Any] = {"train_prompts": len(train), "validation_prompts": len(val), "lengths": lengths,
                              "candidates": pool.candidates, "pool": str(pool.path), "kinds": {}}
    for kind in a["kinds"]:
        feat = Featurizer(kind, pool, gen, out / f"features_{kind}" if out else None, max_new)
        data = {i: feat(i, lengths) for i in tqdm([p.index for p in prompts], desc=f"features {kind}",
                                                  unit="prompt", disable=not cfg.output.progress)}

        def stack(ids: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            X = np.concatenate([data[i]["x"] for i in ids]).astype(np.float64)
            y = np.concatenate([y_of[i][data[i]["candidate"]] for i in ids])
            g = np.concatenate([i * 1000 + data[i]["length"] for i in ids])
            L = np.concatenate([data[i]["length"] for i in ids])
            return X, y, g, L

        X, y, _, _ = stack(train)
        Xv, yv, gv, Lv = stack(val)
        mean, std = X.mean(0), X.std(0)
        std[std == 0] = 1.0
        Z, Zv = (X - mean) / std, (Xv - mean) / std

        def val_score(f) -> float:
            return float(np.nanmean(group_pearsons(f(Zv), yv, gv)))

        if a["hidden_units"] == 0:
            fits = []
            for alpha in a["ridge_alphas"]:
                w, b = fit_ridge(Z, y, alpha)
                fits.append((val_score(lambda M, w=w, b=b: M @ w + b), alpha, w, b))
            s, alpha, w, b = max(fits, key=lambda t: t[0])
            head = Head(mean, std, np.zeros((0, 0)), np.zeros(0), w, b, {})
            chosen = {"ridge_alpha": alpha}
        else:
            P, s, ep = fit_mlp(Z, y, Zv, val_score, a["hidden_units"], a["epochs"], cfg.seed, cfg.output.progress)
            head = Head(mean, std, P[0].T, P[1], P[2][0], float(P[3][0]), {})
            chosen = {"epochs": ep, "hidden_units": a["hidden_units"]}
        pred = head(Xv)
        per_len: dict[str, Any] = {}
        diffs = []  # [val prompt, length] head r - same r
        for L in lengths:
            hr, sr = {}, {}
            for i in val:
                m = (gv == i * 1000 + L)
                if m.sum() >= 3 and np.ptp(yv[m]) > 0:
                    hr[i] = pearson(pred[m], yv[m])
                    sr[i] = pearson(same_of[i][L], yv[m]) if np.ptp(same_of[i][L]) > 0 else float("nan")
            both = [i for i in hr if math.isfinite(hr[i]) and math.isfinite(sr[i])]
            per_len[str(L)] = {"head": float(np.mean([hr[i] for i in both])),
                               "same": float(np.mean([sr[i] for i in both])), "prompts": len(both)}
            diffs.append({i: hr[i] - sr[i] for i in both})
        common = sorted(set.intersection(*(set(d) for d in diffs)))
        D = np.array([[d[i] for d in diffs] for i in common]).mean(1)  # per prompt, averaged over lengths
        rng = np.random.default_rng(cfg.seed)
        boot = [rng.choice(D, size=len(D)).mean() for _ in range(a["bootstrap"])]
        ci = [float(np.percentile(boot, q)) for q in (2.5, 97.5)]
        verdict = {"mean_diff": float(D.mean()), "diff_ci": ci, "prompts": len(common), "beats_same": ci[0] > 0}
        head.meta = {"kind": kind, "max_new_tokens": max_new, "lengths": lengths, **chosen,
                     "generator": str(pool.settings["generator"].get("model", "")),
                     "reward": f"{node['name']}:{getattr(reward, 'identity', '')}", "validation": verdict,
                     "validation_by_length": per_len, "train_prompts": train, "validation_prompts": val,
                     "trained_with": "rodeco experiment=value_train", "pool": str(pool.path), "seed": cfg.seed}
        if out is not None:
            head.save(out / kind)
        if a["install"]:
            head.save(ASSETS / kind)
        report["kinds"][kind] = {**verdict, "by_length": per_len, **chosen}
        for L in lengths:
            r = per_len[str(L)]
            print(f"value_train_{kind}_len{L}: pearson head {r['head']:.3f} vs same {r['same']:.3f} "
                  f"({r['prompts']} validation prompts)")
        print(f"value_train_{kind}_minus_same: {verdict['mean_diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] "
              f"-> {'beats' if verdict['beats_same'] else 'does not beat'} same")
    if out is not None:
        import json

        (out / "value_train.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return RunOutput([], Compute(), out, extra=report)
