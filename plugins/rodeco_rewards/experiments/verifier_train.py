"""``rodeco experiment=verifier_train``: train the ``verifier`` reward (``rodeco_rewards.verifier``) on pools of
training problems whose candidates the task's own checker labelled, and measure it on problems it never saw.

- Data: ``experiment_args.pools``, one pool per task, recorded on training seeds with hidden states and top-k
  log-probs (``rodeco experiment=pool ... experiment_args.hidden_states=true experiment_args.top_logprobs=5``). A
  problem whose text is one of the held-out sets' (``experiment_args.holdout``: each task's selection and report
  problems, regenerated from the pool's own task settings) is dropped, and so is a repeated text: reasoning-gym's
  problem ``i`` of seed ``s`` is problem ``i - 1`` of seed ``s + 1``, so nearby seeds share problems.
- Labels: each candidate's final answer checked by its task (the ``gold`` judge); a right answer is 1.
- Examples: every candidate at each prefix of ``experiment_args.prefixes`` it is still decoding at (more tokens
  than the prefix: its tokens so far, the state that sampled the last of them), and at its end (the state of its
  last step), each labelled with its final answer's correctness. The features are computed by the reward's own code
  from the requests a live run would send.
- Splits: each task's problems shuffled once (seeded) into *fit*, *choose* and *report*. For each objective of
  ``experiment_args.objectives`` (``pointwise``, ``pairwise``: ``fit_head``), feature set of
  ``experiment_args.features`` and L2 penalty of ``experiment_args.l2``, a head with one weight vector per length
  bucket (``experiment_args.prefixes`` are the buckets' upper bounds) is fitted on the fit problems; the one with the
  highest mean AUC within problems over (task, prefix) on the choose problems is the verifier. The report problems
  are used once (``rodeco_rewards.experiments.verifier_metrics``): AUC within problems, AUC per task and prefix (95%
  bootstrap CIs over problems), calibration (expected calibration error, 10 bins), the pick among a problem's
  candidates against ``logprob``'s, and each objective and feature set beside the chosen one (the ablation).
- Leave-one-task-out: the chosen setting refitted on the other tasks' fit problems, measured on the task's report
  problems.

The head is written to the run directory (``verifier.npz``/``.json``, with its provenance: pools, seeds, tasks,
counts, the choice and every figure); ``experiment_args.install=true`` also writes it to
``rodeco_rewards/assets/verifier``, the committed one ``reward=verifier`` loads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco import (
    BuildContext,
    Compute,
    ConfigError,
    RunOutput,
    atomic_write,
    node_dict,
    open_pool,
)
from rodeco_rewards.experiments.learned_heads_train import split
from rodeco_rewards.experiments.verifier_metrics import (
    END,
    Examples,
    auc_cis,
    best_of_pool,
    by_cell,
    calibration,
    groups,
    mean_auc,
    within_auc,
)
from rodeco_rewards.learned_heads import ASSETS, Head, bucket_names, bucket_of
from rodeco_rewards.verifier import FEATURES, features

log = logging.getLogger(__name__)

OBJECTIVES = ("pointwise", "pairwise")


def columns(kind: str, hidden: int, n_stats: int) -> np.ndarray:
    """The columns of ``Examples.x`` a feature set reads."""
    if kind == "hidden":
        return np.arange(hidden)
    if kind == "stats":
        return np.arange(hidden, hidden + n_stats)
    return np.arange(hidden + n_stats)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float, max_iter: int = 200) -> tuple[np.ndarray, float]:
    """Weights and bias minimising the mean logistic loss plus ``l2 * |w|^2`` on standardized ``x`` (L-BFGS)."""
    import torch

    X, Y = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y.astype(np.float64))
    w = torch.zeros(X.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(X @ w + b, Y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy(), float(b.detach())


def fit_head(
    ex: Examples,
    kind: str,
    l2: float,
    edges: Sequence[int],
    hidden: int,
    n_stats: int,
    meta: dict,
    objective: str = "pointwise",
) -> Head:
    """A logistic head on ``kind``'s columns, one weight vector per length bucket.

    ``pointwise``: each bucket's weights fitted to its examples' labels (a bucket without both classes takes the
    pooled fit). ``pairwise``: one weight vector fitted to tell the right row from the wrong among rows of the same
    problem at the same point (every right-wrong pair of a problem at a prefix, or at the end: the ranking a decision
    point and the winner's pick need; Bradley-Terry, so a difference of scores is a log-odds), then, per bucket, an
    offset that makes the mean predicted probability the bucket's rate of right answers (calibration in the large:
    what makes one problem easier than another is what this head does not learn)."""
    cols = columns(kind, hidden, n_stats)
    x = ex.x[:, cols].astype(np.float64)
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 1e-8, std, 1.0)
    z = (x - mean) / std
    k = bucket_of(ex.length, edges)
    ws, bs = [], []
    if objective == "pairwise":
        d = pair_differences(z, ex)
        direction, _ = fit_logistic(np.concatenate([d, -d]), np.r_[np.ones(len(d)), np.zeros(len(d))], l2)
        s = z @ direction
        pooled_offset = offset(s, ex.y)
        for b in range(len(edges) + 1):
            m = k == b
            ws.append(direction)
            bs.append(offset(s[m], ex.y[m]) if m.any() and 0 < ex.y[m].sum() < m.sum() else pooled_offset)
    else:
        pooled = fit_logistic(z, ex.y, l2)
        for b in range(len(edges) + 1):
            m = k == b
            w, c = fit_logistic(z[m], ex.y[m], l2) if m.any() and 0 < ex.y[m].sum() < m.sum() else pooled
            ws.append(w)
            bs.append(c)
    info = {**meta, "features": kind, "l2": l2, "objective": objective}
    return Head.linear(mean, std, np.stack(ws), np.array(bs), info, edges)


def offset(s: np.ndarray, y: np.ndarray) -> float:
    """The ``c`` whose ``mean(sigmoid(s + c))`` is ``mean(y)`` (bisection; ``y`` holds both classes)."""
    lo, hi = -50.0 - float(s.max()), 50.0 - float(s.min())
    for _ in range(100):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if np.mean(1 / (1 + np.exp(-(s + c)))) < y.mean() else (lo, c)
    return (lo + hi) / 2


def pair_differences(z: np.ndarray, ex: Examples, cap: int = 64) -> np.ndarray:
    """[pairs, F] right row's features minus wrong row's, within each group (at most ``cap`` pairs a group, drawn
    seeded, so that no problem outweighs the rest)."""
    rng = np.random.default_rng(0)
    out = []
    for idx in groups(ex).values():
        right, wrong = idx[ex.y[idx] == 1], idx[ex.y[idx] == 0]
        if not len(right) or not len(wrong):
            continue
        pairs = np.array([(r, w) for r in right for w in wrong])
        if len(pairs) > cap:
            pairs = pairs[rng.choice(len(pairs), cap, replace=False)]
        out.append(z[pairs[:, 0]] - z[pairs[:, 1]])
    return np.concatenate(out) if out else np.zeros((0, z.shape[1]))


def scores(head: Head, ex: Examples, hidden: int, n_stats: int) -> np.ndarray:
    return head(ex.x[:, columns(str(head.meta["features"]), hidden, n_stats)], ex.length)


def held_out_texts(plugins, prompt_meta: dict[str, Any], holdout: list[dict[str, int]]) -> set[str]:
    """The texts of a task's held-out problem sets (regenerated with the pool's task settings)."""
    source = plugins.source(str(prompt_meta["source"]))
    texts: set[str] = set()
    for h in holdout:
        for q, _ in source.generate(str(prompt_meta["task"]), int(h["size"]), int(h["seed"]), prompt_meta["config"]):
            texts.add(q)
    return texts


def collect(a: dict[str, Any], plugins) -> tuple[Examples, dict[str, Any], int, int]:
    """Every pool's examples (see the module doc), the provenance, the hidden size and the statistics' count."""
    gold = plugins.build_reward({"name": "gold"}, BuildContext(plugins=plugins))
    prefixes = sorted(int(t) for t in a["prefixes"])
    xs, ys, tasks, probs, lens, ats = [], [], [], [], [], []
    prov: dict[str, Any] = {"pools": [], "dropped_held_out": 0, "dropped_repeated": 0}
    seen: set[str] = set()
    generator = None
    for path in a["pools"]:
        pool, _ = open_pool(path)
        max_new = int(pool.settings["max_new_tokens"])
        generator = generator or str(pool.settings["generator"].get("model", ""))
        indices = pool.indices()
        held: set[str] | None = None
        kept = 0
        for i in indices:
            p = pool.prompt(i)
            if held is None:
                held = held_out_texts(plugins, p.meta, a["holdout"])
            if p.text in held:
                prov["dropped_held_out"] += 1
                continue
            if p.text in seen:
                prov["dropped_repeated"] += 1
                continue
            seen.add(p.text)
            kept += 1
            H = pool.hidden(i)
            labels = gold.score(p.final_requests())
            reqs, at = [], []
            for c, cand in enumerate(p.candidates):
                n = len(cand.token_ids)
                for t in prefixes:
                    if t < n:
                        reqs.append(p.request(c, t, "", np.asarray(H[c, t - 1], dtype=np.float32)))
                        at.append(str(t))
                last = n if cand.stop is not None and n < max_new else n - 1
                end = np.asarray(H[c, max(last, 0)], dtype=np.float32)
                reqs.append(dataclasses.replace(p.request(c), hidden_state=end))
                at.append(END)
            xs.append(features(reqs, "hidden+stats", max_new).astype(np.float32))
            ys.append(np.array([labels[r.candidate_id] >= 1.0 for r in reqs], dtype=np.float64))
            tasks += [str(p.meta["task"])] * len(reqs)
            probs += [f"{Path(path).name}/{i}"] * len(reqs)
            lens += [len(r.response_ids) for r in reqs]
            ats += at
        prov["pools"].append(
            {
                "pool": Path(path).name,  # the pool's directory name, not this machine's path
                "task": str(p.meta["task"]) if indices else None,
                "seed": int(p.meta.get("seed", -1)) if indices else None,
                "task_config": p.meta.get("config") if indices else None,
                "sampling": pool.settings.get("sampling"),
                "problems": len(indices),
                "kept": kept,
                "candidates": pool.candidates,
                "max_new_tokens": max_new,
            }
        )
        log.info("%s: %d problems kept of %d", path, kept, len(indices))
    x = np.concatenate(xs)
    hidden = x.shape[1] - 9
    ex = Examples(x, np.concatenate(ys), np.array(tasks), np.array(probs), np.array(lens), np.array(ats))
    prov["generator"] = generator
    return ex, prov, hidden, 9


def splits(ex: Examples, a: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks (fit, choose, report) over the examples: each task's problems split once, seeded."""
    fit, choose, report = (np.zeros(len(ex.y), bool) for _ in range(3))
    for task in sorted(set(ex.task.tolist())):
        probs = sorted(set(ex.problem[ex.task == task].tolist()))
        keys = list(range(len(probs)))
        f, c, r = split(keys, a["choose_fraction"], a["report_fraction"], seed)
        for mask, part in ((fit, f), (choose, c), (report, r)):
            mask |= np.isin(ex.problem, [probs[k] for k in part])
    return fit, choose, report


def choose_head(
    ex: Examples,
    fit: np.ndarray,
    choose: np.ndarray,
    a: dict[str, Any],
    prefixes: list[int],
    hidden: int,
    n_stats: int,
    meta: dict[str, Any],
) -> tuple[Head, dict[tuple[str, str, float], Head], list[dict[str, Any]]]:
    """Every (objective, feature set, penalty) fitted on the fit problems; the one with the highest mean AUC within
    problems on the choose problems, every head, and what each scored."""
    tried: list[dict[str, Any]] = []
    best: tuple[float, Head] | None = None
    heads: dict[tuple[str, str, float], Head] = {}
    for objective in a["objectives"]:
        for kind in a["features"]:
            for l2 in a["l2"]:
                head = fit_head(ex.take(fit), kind, float(l2), prefixes, hidden, n_stats, meta, objective)
                heads[objective, kind, float(l2)] = head
                s_choose = scores(head, ex.take(choose), hidden, n_stats)
                m = mean_auc(within_auc(s_choose, ex.take(choose), prefixes))
                pooled = mean_auc(by_cell(s_choose, ex.take(choose), prefixes))
                row = {"objective": objective, "features": kind, "l2": float(l2), "choose_within_auc": m}
                tried.append({**row, "choose_auc": pooled})
                log.info("%s, %s, l2 %g: choose AUC within problems %.4f, pooled %.4f", objective, kind, l2, m, pooled)
                if best is None or m > best[0]:
                    best = (m, head)
    assert best is not None
    return best[1], heads, tried


def learning_curve(
    ex: Examples,
    fit: np.ndarray,
    report: np.ndarray,
    chosen: tuple[str, float, str],
    prefixes: list[int],
    hidden: int,
    n_stats: int,
    meta: dict[str, Any],
    full: dict[str, float],
) -> dict[str, dict[str, float]]:
    """The chosen head refitted on the first quarter and half of each task's fit problems, beside ``full`` (the
    chosen head's own, fitted on all of them): its AUC within problems on the report problems, pooled over tasks.
    Flat: more problems of the same kind would not help it."""
    kind, l2, objective = chosen
    rep = ex.take(report)
    out = {}
    for share in (0.25, 0.5):
        keep = np.zeros(len(ex.y), bool)
        for task in sorted(set(ex.task[fit].tolist())):
            probs = sorted(set(ex.problem[fit & (ex.task == task)].tolist()))
            keep |= np.isin(ex.problem, probs[: max(1, round(share * len(probs)))])
        h = fit_head(ex.take(fit & keep), kind, l2, prefixes, hidden, n_stats, meta, objective)
        problems = len(set(ex.problem[fit & keep].tolist()))
        out[f"{problems} problems"] = within_auc(scores(h, rep, hidden, n_stats), rep, prefixes)["pooled"]
    out[f"{len(set(ex.problem[fit].tolist()))} problems"] = full
    return out


def run(cfg: DictConfig, plugins, out_dir: str | Path | None) -> RunOutput:
    a = node_dict(cfg.experiment_args)
    bad = [k for k in a["features"] if k not in FEATURES]
    if bad or not a["features"]:
        raise ConfigError("experiment_args.features", bad, "unknown feature sets", f"use some of {', '.join(FEATURES)}")
    bad = [k for k in a["objectives"] if k not in OBJECTIVES]
    if bad or not a["objectives"]:
        raise ConfigError(
            "experiment_args.objectives", bad, "unknown objectives", f"use some of {', '.join(OBJECTIVES)}"
        )
    if not a["pools"]:
        raise ConfigError(
            "experiment_args.pools",
            a["pools"],
            "no training pools",
            "record one per task on training seeds (experiment_args.hidden_states=true experiment_args.top_logprobs=5)",
        )
    prefixes = sorted(int(t) for t in a["prefixes"])
    ex, prov, hidden, n_stats = collect(a, plugins)
    fit, choose, report = splits(ex, a, int(cfg.seed))
    meta = {"max_new_tokens": int(max(p["max_new_tokens"] for p in prov["pools"])), **prov, "prefixes": prefixes}
    head, heads, tried = choose_head(ex, fit, choose, a, prefixes, hidden, n_stats, meta)
    rep = ex.take(report)
    s_rep = scores(head, rep, hidden, n_stats)
    boot, seed = int(a["bootstrap"]), int(cfg.seed)
    objective, kind, l2 = str(head.meta["objective"]), str(head.meta["features"]), float(head.meta["l2"])
    figures: dict[str, Any] = {
        "chosen": {"objective": objective, "features": kind, "l2": l2},
        "tried": tried,
        "report_within_auc": within_auc(s_rep, rep, prefixes),
        "report_auc": auc_cis(s_rep, rep, prefixes, boot, seed),
        "report_ece": calibration(s_rep, rep, prefixes),
        "best_of_pool": best_of_pool(s_rep, rep, hidden, boot, seed),
        "ablation": {},
        "leave_one_task_out": {},
        "examples": {"fit": int(fit.sum()), "choose": int(choose.sum()), "report": int(report.sum())},
        "problems": {
            k: len(set(ex.problem[m].tolist())) for k, m in (("fit", fit), ("choose", choose), ("report", report))
        },
        "right_rate": float(ex.y.mean()),
        "buckets": bucket_names(prefixes),
    }
    for obj in a["objectives"]:  # each objective and feature set at its own best penalty on the choose problems
        for other in a["features"]:
            row = max(
                (t for t in tried if t["features"] == other and t["objective"] == obj),
                key=lambda t: t["choose_within_auc"],
            )
            s_other = scores(heads[obj, other, row["l2"]], rep, hidden, n_stats)
            figures["ablation"][f"{obj}/{other}"] = {
                "within": within_auc(s_other, rep, prefixes)["pooled"],
                "pooled": by_cell(s_other, rep, prefixes)["pooled"],
                "best_of_pool": best_of_pool(s_other, rep, hidden, 0, seed)["pooled"]["verifier"][0],
            }
    for task in sorted(set(ex.task.tolist())):
        h = fit_head(ex.take(fit & (ex.task != task)), kind, l2, prefixes, hidden, n_stats, meta, objective)
        own = ex.take(report & (ex.task == task))
        s_own = scores(h, own, hidden, n_stats)
        figures["leave_one_task_out"][task] = {
            "within": within_auc(s_own, own, prefixes)[task],
            "pooled": by_cell(s_own, own, prefixes)[task],
            "best_of_pool": best_of_pool(s_own, own, hidden, boot, seed)[task],
        }
    full = figures["report_within_auc"]["pooled"]
    chosen = (kind, l2, objective)
    figures["learning_curve"] = learning_curve(ex, fit, report, chosen, prefixes, hidden, n_stats, meta, full)
    head.meta["figures"] = figures
    out = Path(out_dir) if out_dir is not None else Path(".")
    head.save(out / "verifier")
    if a["install"]:
        head.save(ASSETS / "verifier")
    print_figures(figures, prefixes)
    atomic_write(out / "verifier_train.json", json.dumps(figures, indent=1) + "\n")
    return RunOutput([], Compute(), out, figures)


def print_figures(f: dict[str, Any], prefixes: Sequence[int]) -> None:
    cols = [*map(str, prefixes), END]
    c = f["chosen"]
    print(f"verifier: {c['objective']}, features {c['features']}, l2 {c['l2']:g} (chosen on the choose problems)")

    def grid(title: str, rows: dict[str, Any], cell: Any) -> None:
        print(title)
        print("task".ljust(22) + "".join(c.rjust(22) for c in cols))
        for name, row in rows.items():
            print(name.ljust(22) + "".join(cell(row, c).rjust(22) for c in cols))

    grid(
        "held-out AUC within problems (right-wrong pairs of a problem at the same point):",
        f["report_within_auc"],
        lambda r, c: f"{r[c]:.3f}",
    )
    grid(
        "held-out AUC [95% CI] by task and prefix, pooled over problems:",
        f["report_auc"],
        lambda r, c: f"{r[c]['auc']:.3f} [{r[c]['ci'][0]:.3f}, {r[c]['ci'][1]:.3f}]",
    )
    grid("calibration error (ECE) by task and prefix:", f["report_ece"], lambda r, c: f"{r[c]:.3f}")
    grid(
        "ablation, AUC within problems, pooled over tasks:",
        {k: v["within"] for k, v in f["ablation"].items()},
        lambda r, c: f"{r[c]:.3f}",
    )
    grid(
        "leave-one-task-out AUC within problems (trained without the task):",
        {k: v["within"] for k, v in f["leave_one_task_out"].items()},
        lambda r, c: f"{r[c]:.3f}",
    )
    grid(
        "leave-one-task-out AUC pooled over problems:",
        {k: v["pooled"] for k, v in f["leave_one_task_out"].items()},
        lambda r, c: f"{r[c]:.3f}",
    )
    print("the pick among a report problem's candidates (all 16: Best-of-16), gold accuracy [95% CI]:")
    for task, row in f["best_of_pool"].items():
        cells = [f"{n} {v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for n, v in row.items() if n != "problems"]
        print(task.ljust(18) + f"({row['problems']} problems) " + "  ".join(cells))
    print(
        "ablation, the head's Best-of-16 pick (pooled): "
        + ", ".join(f"{k} {v['best_of_pool']:.3f}" for k, v in f["ablation"].items())
    )
    grid(
        "learning curve: the chosen head fitted on some of the fit problems, AUC within problems (report problems):",
        f.get("learning_curve", {}),
        lambda r, c: f"{r[c]:.3f}",
    )
    print(
        "leave-one-task-out, the head's Best-of-16 pick: "
        + ", ".join(f"{k} {v['best_of_pool']['verifier'][0]:.3f}" for k, v in f["leave_one_task_out"].items())
    )
