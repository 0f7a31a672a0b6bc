"""Fitting the Bradley-Terry head on preference pairs: ``-log sigmoid(head(chosen) - head(rejected))`` plus L2
penalties on the (standardized) first-layer weights, one for the encoder's features and one for the surface
statistics; full-batch Adam from a fixed seed (deterministic on CPU); grouped cross-validation picks the penalties.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from rodeco_rewards.minilm.head import BTHead, HeadShape

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    hidden: int = 0  # 0: linear head
    l2: float = 1e-4  # penalty on the weights of the surface statistics
    l2_embedding: float = 0.3  # penalty on the weights of the embedding features (the first n_embedding columns)
    lr: float = 0.01
    steps: int = 300
    seed: int = 0
    surface: bool = True  # False: the surface statistics' weights are held at 0 (an embedding-only head)


def penalty(in_dim: int, n_embedding: int, cfg: TrainConfig) -> torch.Tensor:
    return torch.tensor([cfg.l2_embedding] * n_embedding + [cfg.l2] * (in_dim - n_embedding))


def fit_bt(xc: np.ndarray, xr: np.ndarray, cfg: TrainConfig, n_embedding: int = 0) -> BTHead:
    """A head trained on chosen ``xc [n, F]`` against rejected ``xr [n, F]`` features."""
    torch.manual_seed(cfg.seed)
    head = BTHead(HeadShape(in_dim=xc.shape[1], hidden=cfg.hidden))
    tc, tr = torch.from_numpy(xc).float(), torch.from_numpy(xr).float()
    head.set_standardization(torch.cat([tc, tr]))
    first = head.first_layer.weight  # [out, F]
    pen = penalty(xc.shape[1], n_embedding, cfg)
    zc, zr = (tc - head.mu) / head.sigma, (tr - head.mu) / head.sigma  # standardized once, not per step
    opt = torch.optim.Adam(head.net.parameters(), lr=cfg.lr)
    for _ in range(cfg.steps):
        opt.zero_grad()
        margin = (head.net(zc) - head.net(zr))[:, 0]
        loss = torch.nn.functional.softplus(-margin).mean() + (first.pow(2) * pen).sum()
        loss.backward()
        opt.step()
        if not cfg.surface:
            with torch.no_grad():
                first[:, n_embedding:] = 0.0  # projected: the statistics never enter the score
    log.debug("final training loss %.4f", loss.item())
    return head.eval()


@torch.no_grad()
def scores(head: BTHead, x: np.ndarray) -> np.ndarray:
    return head(torch.from_numpy(x).float()).numpy().astype(np.float64)


def accuracy(head: BTHead, xc: np.ndarray, xr: np.ndarray) -> float:
    sc, sr = scores(head, xc), scores(head, xr)
    return float(np.mean(np.where(sc > sr, 1.0, np.where(sc == sr, 0.5, 0.0))))


def group_folds(groups: list[str], k: int, seed: int = 0) -> list[np.ndarray]:
    """``k`` boolean masks over pairs; all pairs of one group (instruction) fall in the same fold."""
    uniq = sorted(set(groups))
    rng = np.random.default_rng(seed)
    fold_of = {g: i % k for i, g in enumerate(rng.permutation(uniq).tolist())}
    f = np.array([fold_of[g] for g in groups])
    return [f == i for i in range(k)]


def cv_accuracy(
    xc: np.ndarray, xr: np.ndarray, groups: list[str], cfg: TrainConfig, k: int = 5, n_embedding: int = 0
) -> float:
    """Mean held-out accuracy over ``k`` instruction-grouped folds."""
    accs = []
    for test in group_folds(groups, k, cfg.seed):
        head = fit_bt(xc[~test], xr[~test], cfg, n_embedding)
        accs.append(accuracy(head, xc[test], xr[test]))
    return float(np.mean(accs))
