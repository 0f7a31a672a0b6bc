"""How ``value_train`` fits a head (``rodeco_rewards.learned_heads.Head``): to order the candidates of one prompt at
one decision length, the only order a rejection policy uses.

- Groups: one per (prompt, length). Features and targets are centred within each group when fitting (``centre``):
  a shift common to a group's rows (what the prompt alone contributes, the position) changes no order within it, so
  it is not fitted. The fitted weights then score uncentred features, one request at a time.
- Anchor: a linear head ``w0`` (``text_value``: the reward's own head, so that it starts as ``same``;
  ``value_head``: its own fit pooled over all lengths). Each length bucket fits ``w = a * w0 + delta`` with the
  penalty ``alpha * ||delta||^2`` and a free scale ``a`` (the target, standardized within the prompt, is not in the
  anchor's units, and a positive scale changes no order). With no data, or ``alpha = inf``, a bucket *is* the
  anchor (``a = 1``, ``delta = 0``).
- Losses: ``mse``, the squared error of the centred score against the centred target (closed form); ``bt``,
  Bradley-Terry on every within-group pair whose targets differ, each group weighing the same (L-BFGS, started at
  the anchor). Both with the same penalty.
- Choice, per bucket: the (loss, penalty), or the anchor itself, whose mean within-group Pearson r on the *choose*
  prompts is highest (ties: the anchor, then the earlier in the grid). Only the fit and choose examples reach this
  module: the verdict prompts are judged elsewhere, once.
- ``hidden_units > 0`` (``value_head`` only): one MLP per bucket on standardized features, its loss (centred MSE or
  Bradley-Terry, both blind to a group's common shift) and its epoch chosen on the choose prompts the same way; a
  bucket without examples takes the nearest fitted bucket's MLP.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rodeco_rewards.learned_heads import Head, bucket_names, bucket_of, pearson

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

LOSSES = ("mse", "bt")


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

    def take(self, m: np.ndarray) -> Examples:
        return Examples(self.x[m], self.y[m], self.prompt[m], self.length[m])


def group_ids(prompt: np.ndarray, length: np.ndarray) -> np.ndarray:
    """A group number per example: one group per (prompt, length) pair, numbered in the pairs' sorted order."""
    if len(prompt) == 0:
        return np.zeros(0, dtype=np.int64)
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


def centre(v: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``v`` ([E] or [E, F]) minus its mean within each group (``groups`` numbered 0..G-1)."""
    if len(v) == 0:
        return np.array(v, dtype=np.float64)
    sums = np.zeros((int(groups.max()) + 1,) + v.shape[1:])
    np.add.at(sums, groups, v)
    n = np.bincount(groups, minlength=len(sums)).reshape(-1, *[1] * (v.ndim - 1))
    return v - (sums / np.maximum(n, 1))[groups]


def standardization(fit: Examples) -> tuple[np.ndarray, np.ndarray]:
    """``value_head``'s feature mean and scale on the fit examples; the scale is that of the within-group centred
    features (what the penalty sees), 1 where a feature does not vary within groups."""
    if len(fit.x) == 0:
        return np.zeros(fit.x.shape[1]), np.ones(fit.x.shape[1])
    std = centre(fit.x, fit.groups).std(0)
    std[std < 1e-12] = 1.0
    return fit.x.mean(0), std


@dataclass
class Prepared:
    """One bucket's fit examples: standardized by the anchor's mean and scale, centred within their groups."""

    Zc: np.ndarray  # [E, F]
    yc: np.ndarray  # [E] the centred target
    y: np.ndarray  # [E] the target (Bradley-Terry needs its order only)
    groups: np.ndarray  # [E] numbered 0..G-1
    u: np.ndarray | None  # [E] the anchor's centred scores; None: no anchor (w0 = 0)
    gram: np.ndarray  # [1 + F, 1 + F] of the design [u, Zc] (u's row and column 0 without an anchor)
    rhs: np.ndarray  # [1 + F] the design's products with yc


def prepare(ex: Examples, anchor: Head) -> Prepared:
    groups = np.unique(ex.groups, return_inverse=True)[1].reshape(-1) if len(ex.y) else ex.groups
    Zc = centre((ex.x - anchor.mean) / anchor.std, groups)
    yc = centre(ex.y, groups)
    w0 = anchor.w2[0]
    u = Zc @ w0 if np.any(w0) else None
    D = np.concatenate([(u if u is not None else np.zeros(len(Zc)))[:, None], Zc], axis=1)
    return Prepared(Zc, yc, ex.y, groups, u, D.T @ D, D.T @ yc)


def fit_mse(p: Prepared, alpha: float) -> tuple[float, np.ndarray]:
    """``(a, delta)`` minimizing ``mean((yc - Zc (a w0 + delta))^2) + alpha ||delta||^2`` (``a`` unpenalized)."""
    n, f = p.Zc.shape
    A = p.gram.copy()
    A[1:, 1:] += alpha * n * np.eye(f)
    if p.u is None:
        return 1.0, np.linalg.solve(A[1:, 1:], p.rhs[1:])
    A[0, 0] += 1e-9 * n  # solvable when the anchor does not vary within the groups
    theta = np.linalg.solve(A, p.rhs)
    return float(theta[0]), theta[1:]


def padded(groups: np.ndarray) -> np.ndarray:
    """``[G, K]`` the rows of each group (``K`` the largest group), -1 where a group has fewer."""
    counts = np.bincount(groups)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    pos = np.arange(len(g)) - np.concatenate([[0], np.cumsum(counts)[:-1]])[g]
    out = np.full((len(counts), int(counts.max())), -1, dtype=np.int64)
    out[g, pos] = order
    return out


def group_loss(s, y, pads, loss: str):
    """The mean loss of scores ``s [E]`` against targets ``y [E]`` (torch) over groups ``pads [G, K]``: ``mse``, the
    squared error of the within-group centred score against the centred target, per example; ``bt``, the
    Bradley-Terry loss ``log(1 + exp(s_j - s_i))`` of each pair with ``y_i > y_j``, averaged within each group, then
    over groups."""
    import torch

    m = pads >= 0
    S, Y = s[pads.clamp(min=0)], y[pads.clamp(min=0)]  # [G, K]
    if loss == "mse":
        n = m.sum(1, keepdim=True).clamp(min=1)
        r = (S - (S * m).sum(1, keepdim=True) / n) - (Y - (Y * m).sum(1, keepdim=True) / n)
        return ((r * m) ** 2).sum() / m.sum().clamp(min=1)
    pair = (Y[:, :, None] > Y[:, None, :]) & m[:, :, None] & m[:, None, :]  # [G, K, K]
    n = pair.sum((1, 2))
    if not bool((n > 0).any()):
        return s.sum() * 0.0
    per = (torch.nn.functional.softplus(S[:, None, :] - S[:, :, None]) * pair).sum((1, 2))
    return (per[n > 0] / n[n > 0]).mean()


def minimize_lbfgs(params: list[torch.Tensor], loss: Callable[[], torch.Tensor], max_iter: int) -> None:
    """Minimize ``loss()`` over ``params`` in place: full-batch L-BFGS with a strong-Wolfe line search and tight
    tolerances (a fit runs until it converges or ``max_iter`` iterations)."""
    import torch

    opt = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)


def fit_bt(p: Prepared, alpha: float, max_iter: int = 300) -> tuple[float, np.ndarray]:
    """``(a, delta)`` minimizing the within-group Bradley-Terry loss of ``Zc (a w0 + delta)`` plus
    ``alpha ||delta||^2`` (``a`` unpenalized), by L-BFGS from the anchor (``a = 1``, ``delta = 0``)."""
    import torch

    Z, y = torch.from_numpy(p.Zc), torch.from_numpy(np.asarray(p.y, dtype=np.float64))
    pads = torch.from_numpy(padded(p.groups))
    u = torch.from_numpy(p.u) if p.u is not None else None
    delta = torch.zeros(Z.shape[1], dtype=torch.float64, requires_grad=True)
    a = torch.ones((), dtype=torch.float64, requires_grad=u is not None)

    def loss() -> torch.Tensor:
        s = Z @ delta + (a * u if u is not None else 0.0)
        return group_loss(s, y, pads, "bt") + alpha * (delta @ delta)

    minimize_lbfgs([delta, a] if u is not None else [delta], loss, max_iter)
    return float(a.detach()), delta.detach().numpy().copy()


FITS: dict[str, Callable[[Prepared, float], tuple[float, np.ndarray]]] = {"mse": fit_mse, "bt": fit_bt}


def mean_group_r(pred: np.ndarray, ex: Examples) -> float:
    """The mean within-group Pearson r of ``pred`` with the examples' targets (NaN where no group has one)."""
    r = group_pearsons(pred, ex.y, ex.groups) if len(ex.y) else np.zeros(0)
    return float(r.mean()) if r.size else float("nan")


def fit_bucket(
    fit: Examples, choose: Examples, anchor: Head, alphas: Sequence[float], losses: Sequence[str]
) -> tuple[np.ndarray, float, dict[str, Any]]:
    """One bucket's weights and intercept around the anchor, and what was chosen: each (loss, penalty) fitted on
    ``fit``, the anchor itself a candidate too, the best on ``choose`` kept."""
    w0, b0 = anchor.w2[0], float(anchor.b2[0])
    p = prepare(fit, anchor)
    cands: list[tuple[str, float | None, float, np.ndarray]] = []
    if p.u is not None or not len(fit.y):
        cands.append(("anchor", None, 1.0, np.zeros_like(w0)))
    if len(fit.y):
        cands += [(loss, alpha, *FITS[loss](p, alpha)) for loss in losses for alpha in alphas]
    Zch = (choose.x - anchor.mean) / anchor.std
    scores = [mean_group_r(Zch @ (a * w0 + d), choose) for _, _, a, d in cands]
    finite = [s if math.isfinite(s) else -math.inf for s in scores]
    best = int(np.argmax(finite))  # the first of the best; all NaN: the first candidate
    loss, alpha, a, d = cands[best]
    grid: dict[str, Any] = {}
    for (lo, al, _, _), s in zip(cands, scores):
        grid.setdefault(lo, {})["inf" if al is None else str(al)] = s if math.isfinite(s) else None
    rec = {
        "loss": loss,
        "alpha": alpha,
        "scale": a,
        "fit_rows": len(fit.y),
        "choose_groups": len(np.unique(choose.groups)),
        "choose_pearson": finite[best] if math.isfinite(finite[best]) else None,
        "grid": grid,
    }
    return a * w0 + d, a * b0, rec


def fit_anchored(
    fit: Examples, choose: Examples, anchor: Head, edges: Sequence[int], alphas: Sequence[float], losses: Sequence[str]
) -> tuple[Head, list[dict[str, Any]]]:
    """A linear head with one weight vector per length bucket, each anchored on ``anchor`` (a one-bucket linear
    head whose mean and scale it keeps), and per bucket what was chosen."""
    kf, kc = bucket_of(fit.length, edges), bucket_of(choose.length, edges)
    W, B, recs = [], [], []
    for k, name in enumerate(bucket_names(edges)):
        w, b, rec = fit_bucket(fit.take(kf == k), choose.take(kc == k), anchor, alphas, losses)
        W.append(w)
        B.append(b)
        recs.append({"lengths": name, **rec})
        log.info("bucket %s: %s alpha=%s (choose r %s)", name, rec["loss"], rec["alpha"], rec["choose_pearson"])
    return Head.linear(anchor.mean, anchor.std, np.stack(W), np.asarray(B), {}, edges), recs


def fit_value_head(
    fit: Examples, choose: Examples, edges: Sequence[int], alphas: Sequence[float], losses: Sequence[str]
) -> tuple[Head, dict[str, Any]]:
    """``value_head`` (linear): a fit pooled over all lengths (anchored at zero), then each bucket around it."""
    mean, std = standardization(fit)
    zero = Head.linear(mean, std, np.zeros(len(mean)), 0.0, {})
    pooled, prec = fit_anchored(fit, choose, zero, (), alphas, losses)
    head, recs = fit_anchored(fit, choose, pooled, edges, alphas, losses)
    return head, {"pooled": prec[0], "buckets": recs}


def fit_mlp_buckets(
    fit: Examples,
    choose: Examples,
    edges: Sequence[int],
    losses: Sequence[str],
    hidden: int,
    epochs: int,
    seed: int,
    progress: bool,
) -> tuple[Head, dict[str, Any]]:
    """``value_head`` with a hidden layer: one MLP per bucket, its loss and epoch chosen on the choose examples."""
    mean, std = standardization(fit)
    kf, kc = bucket_of(fit.length, edges), bucket_of(choose.length, edges)
    names = bucket_names(edges)
    fitted: dict[int, tuple[list[np.ndarray], dict[str, Any]]] = {}
    for k, name in enumerate(names):
        f, c = fit.take(kf == k), choose.take(kc == k)
        if not len(f.y):
            continue
        Zc = (c.x - mean) / std
        best: tuple[float, Any, dict[str, Any]] = (-math.inf, None, {})
        for loss in losses:
            P, s, ep = fit_mlp(
                (f.x - mean) / std,
                f.y,
                f.groups,
                lambda fn, c=c, Zc=Zc: mean_group_r(fn(Zc), c),
                hidden,
                epochs,
                loss,
                seed,
                progress,
            )
            if best[1] is None or s > best[0]:
                best = (s, P, {"loss": loss, "epochs": ep, "choose_pearson": s if math.isfinite(s) else None})
        fitted[k] = (best[1], {"lengths": name, "fit_rows": len(f.y), **best[2]})
    if not fitted:
        raise ValueError("no fit examples in any length bucket")
    params, recs = [], []
    for k, name in enumerate(names):
        near = min(fitted, key=lambda j: (abs(j - k), j))
        params.append(fitted[near][0])
        recs.append(fitted[k][1] if k == near else {"lengths": name, "copied_from": names[near]})
    w1, b1, w2, b2 = (np.stack([P[i] for P in params]) for i in range(4))
    head = Head(mean, std, w1.transpose(0, 2, 1), b1, w2[:, 0], b2[:, 0], {}, np.asarray(edges, dtype=np.int64))
    return head, {"hidden_units": hidden, "buckets": recs}


def fit_mlp(
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray,
    score_choose,
    hidden: int,
    epochs: int,
    loss: str,
    seed: int,
    progress: bool,
) -> tuple[list[np.ndarray], float, int]:
    """A one-hidden-layer MLP (Adam, weight decay) on a within-group loss, 16 groups a step, seeded; the parameters
    ``[W1 [H, F], b1 [H], W2 [1, H], b2 [1]]`` of the epoch whose ``score_choose`` is best, that score, that epoch."""
    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-3)
    Xt, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    pads = torch.from_numpy(padded(np.unique(groups, return_inverse=True)[1].reshape(-1)))
    gen = torch.Generator().manual_seed(seed)
    best: tuple[float, Any, int] = (-math.inf, None, 0)
    for ep in tqdm(range(epochs), desc=f"value_train mlp ({loss})", unit="epoch", disable=not progress):
        for b in torch.randperm(len(pads), generator=gen).split(16):
            rows = pads[b][pads[b] >= 0]
            s = torch.zeros(len(Xt)).index_put((rows,), net(Xt[rows])[:, 0])
            opt.zero_grad()
            group_loss(s, yt, pads[b], loss).backward()
            opt.step()
        with torch.no_grad():
            P = [t.detach().numpy().astype(np.float64) for t in net.parameters()]
        s = score_choose(lambda Z, P=P: np.maximum(Z @ P[0].T + P[1], 0) @ P[2][0] + P[3][0])
        if best[1] is None or s > best[0] or not (math.isfinite(s) or math.isfinite(best[0])):  # none: the last
            best = (s, P, ep + 1)
    return best[1], best[0], best[2]
