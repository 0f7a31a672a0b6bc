"""``rodeco experiment=judge_train``: train and validate ``smollm_judge``, a length-controlled Bradley-Terry head on the
embedded SmolLM2-135M-Instruct's pooled hidden states (``rodeco_rewards.smollm_judge``), as an independent judge.

1. **Data**: AlpacaEval GPT-4-Turbo preference pairs (``alpaca_eval_prefs_train``) without any pair whose
   instruction is a prompt of an evaluation data option (``exclude_data``: by AlpacaEval index where the option
   indexes ``alpaca_eval_805``, and by text), then all pairs of randomly drawn instructions up to ``train_pairs``.
   Synthetic pairs (``augment_responses``): a chosen response of a training instruction preferred to each of its
   four corrupted copies (truncated, repeated, sentences shuffled, words shuffled).
2. **Features**: every pooling of every distinct (prompt, response), cached in ``$RODECO_CACHE/judge_features``
   (a rerun extracts only what is missing).
3. **Fit**: ``P(c > r) = sigmoid(w . (z_c - z_r) + beta * (log n_c - log n_r))`` with ``n`` the full response's
   SmolLM2 tokens, L2 on ``w``. ``length_control``: ``nuisance`` fits ``beta`` beside ``w`` and the judge drops it;
   ``balanced`` weighs the pairs so that those whose chosen response is shorter weigh as much as the others; ``none``
   is the naive fit. The synthetic pairs weigh ``augment_weight`` in all (no length term). Poolings, length control,
   penalty and synthetic weight are chosen by instruction-grouped cross-validation on the training data only: among
   the settings whose held-out corruption rates all reach ``min_corruption_rate``, the highest held-out accuracy on
   the pairs whose chosen response is the shorter one (ties: overall held-out accuracy).
4. **Report** (printed and written to ``judge_report.json`` in the run directory; ``install=true`` also writes the
   committed head with it): held-out accuracy on ``alpaca_eval_prefs_test`` beside the length-only baseline and on
   the shorter-chosen pairs (bootstrap 95% CIs over instructions); the correlation of the margin with the log length
   ratio; the rank correlation with ``compare_reward`` (``minilm_rm``) on the same held-out responses; a corruption
   check on held-out chosen responses cut to the judge's window (truncated, repeated, shuffled versions must score
   lower); the same figures for the best length-controlled head without synthetic pairs (``pairs_only``), the naive
   fit and ``compare_reward``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco import BuildContext, Compute, ConfigError, Plugins, RunOutput, ScoreRequest, node_dict, required
from rodeco.experiments.bootstrap import mean_ci, ratio_of_sums
from rodeco_rewards.prefs import Pair

if TYPE_CHECKING:
    from rodeco_rewards.smollm_judge import HiddenStateFeatures, JudgeHead

log = logging.getLogger(__name__)

LENGTH_CONTROLS = ("none", "nuisance", "balanced", "nuisance_balanced")
CORRUPTIONS = ("truncated", "repeated", "shuffled_sentences", "shuffled_words")
EVAL_FILE = "prompts/alpaca_eval_805.jsonl"  # the file whose positions are the pairs' alpaca_eval_idx
LIMITATION = (
    "The judge is trained on the same AlpacaEval GPT-4-Turbo preference pairs as minilm_rm (a different "
    "subsample, the same judge and length bias, only partly removed), and it reads SmolLM2-135M-Instruct's "
    "own hidden states: when SmolLM2 is also the generator, the judge shares the generator's "
    "representations and may favour the generator's own phrasing."
)


@dataclass
class JudgeTrainArgs:
    data_dir: Optional[str] = required("the folder with prefs/ and prompts/; null: the data root (data.root's rule)")
    exclude_data: list[str] = required("data options (evaluation sets) none of whose prompts may be trained on")
    train_pairs: int = required("training pairs: all pairs of seeded random instructions up to this many")
    augment_responses: int = required(
        "training responses (one per instruction) whose corrupted copies make "
        "synthetic pairs (the response preferred); 0: none"
    )
    augment_weights: list[float] = required("total weights of the synthetic pairs tried (the preference pairs weigh 1)")
    min_corruption_rate: float = required(
        "a setting is admissible when each corruption's held-out CV rate is at least this"
    )
    test_pairs: Optional[int] = required(
        "null: every alpaca_eval_prefs_test pair; n: all pairs of seeded random test instructions up to n"
    )
    model: str = required("the judge's base LM (smollm2: the embedded SmolLM2-135M-Instruct)")
    dtype: str = required("dtype of the feature extraction, and of the judge unless reward.dtype says otherwise")
    max_prompt_tokens: int = required("prompt tokens of context (the chat-rendered prompt's last ones)")
    max_response_tokens: int = required("response tokens read (the first ones)")
    batch_tokens: int = required("padded tokens per forward pass")
    threads: Optional[int] = required(
        "torch CPU threads while extracting (1 is fastest on a busy CPU); null: torch's default"
    )
    poolings: list[list[str]] = required("pooling sets tried (each a list of mean, last, mean_mid)")
    length_controls: list[str] = required("length controls tried: none, nuisance, balanced, nuisance_balanced")
    l2_grid: list[float] = required("L2 penalties on the head's weights tried (standardized features)")
    cv_folds: int = required("instruction-grouped cross-validation folds")
    bootstrap: int = required("bootstrap resamples of instructions (or corrupted responses) for the CIs")
    corruption_responses: int = required("held-out chosen responses (one per instruction) corrupted")
    compare_reward: Optional[str] = required("a reward option compared on the same responses (minilm_rm); null: none")
    install: bool = required("write the head to rodeco_rewards/assets/smollm_judge (the committed head)")
    out: Optional[str] = required("also write the head to this stem (.npz/.json); null: only with install")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Held:
    """The prompts of the evaluation data options: AlpacaEval positions and normalized texts."""

    indices: frozenset[str]
    texts: frozenset[str]
    options: tuple[str, ...]


def norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def option(group: str, name: str, plugins: Plugins) -> dict[str, Any] | None:
    """The file of ``<group>=<name>`` (rodeco's options first, then the plugins'), as a dict; None if none."""
    from importlib.resources import files

    for d in [Path(str(files("rodeco.conf"))), *map(Path, plugins.config_dirs())]:
        f = d / group / f"{name}.yaml"
        if f.is_file():
            return node_dict(OmegaConf.load(f))
    return None


def option_prompts(name: str, plugins: Plugins, key: str = "experiment_args.exclude_data") -> dict[str, Any]:
    """A data option's file, as a dict (``path``, ``indices``, ``prompts`` ...)."""
    d = option("data", name, plugins)
    if d is None:
        raise ConfigError(key, name, "no such data option", "name data options, e.g. [alpacafarm100, specrej100, demo]")
    return d


def _resolve(path: str, root: Path) -> Path:
    """A data option's ``path`` as a file: as given, or relative to the working directory, else to ``root``."""
    p = Path(path).expanduser()
    for c in [p] if p.is_absolute() else [Path.cwd() / p, root / p]:
        if c.is_file():
            return c
    raise ConfigError(
        "experiment_args.exclude_data",
        path,
        f"a data option's prompt file is missing (not under {root})",
        "point experiment_args.data_dir (or RODECO_DATA) at the folder that holds prompts/",
    )


def held_prompts(names: Sequence[str], plugins: Plugins, root: Path) -> Held:
    """Every prompt of the data options ``names``: by AlpacaEval index when the option picks positions of
    ``alpaca_eval_805``, and by text always."""
    from rodeco import prompts_of

    idx: set[str] = set()
    texts: set[str] = set()
    for name in names:
        d = option_prompts(name, plugins)
        path = d.get("path")
        node = OmegaConf.create(
            {
                "path": str(_resolve(path, root)) if path else None,
                "prompts": d.get("prompts"),
                "field": d.get("field", "prompt"),
                "offset": d.get("offset", 0),
                "limit": None,
                "indices": d.get("indices"),
            }
        )
        prompts = prompts_of(node)
        if path and Path(path).name == Path(EVAL_FILE).name:
            idx.update(str(p.index) for p in prompts)
        texts.update(norm(p.text) for p in prompts)
    return Held(frozenset(idx), frozenset(texts), tuple(names))


def exclude(pairs: Sequence[Any], held: Held) -> tuple[list[Any], dict[str, Any]]:
    """``pairs`` without those of a held-out prompt (by index or text), and what was removed."""
    kept = [p for p in pairs if p.group not in held.indices and norm(p.prompt) not in held.texts]
    gone = {p.group for p in pairs} - {p.group for p in kept}
    return kept, {
        "data_options": list(held.options),
        "pairs_removed": len(pairs) - len(kept),
        "instructions_removed": len(gone),
    }


def sample_by_instruction(pairs: Sequence[Any], n: int | None, seed: int) -> list[Any]:
    """All pairs of seeded random instructions until there are ``n`` (in file order); ``None``: all pairs."""
    if n is None or n >= len(pairs):
        return list(pairs)
    groups = sorted({p.group for p in pairs}, key=lambda g: (len(g), g))
    random.Random(seed).shuffle(groups)
    chosen: set[str] = set()
    total = 0
    for g in groups:
        if total >= n:
            break
        chosen.add(g)
        total += sum(p.group == g for p in pairs)
    return [p for p in pairs if p.group in chosen]


# --------------------------------------------------------------------------- features


class FeatureCache:
    """Pooled hidden states of (prompt, response) texts on disk (``$RODECO_CACHE/judge_features``), keyed by the
    extraction's settings; entries by the sha256 of the texts."""

    def __init__(self, extractor: Any, settings: dict[str, Any], path: Path | None = None) -> None:
        from rodeco import cache_dir
        from rodeco_rewards.smollm_judge import POOLINGS

        self.extractor, self.poolings = extractor, POOLINGS
        key = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:12]
        self.path = path or cache_dir() / "judge_features" / f"{key}.npz"
        self.table: dict[str, np.ndarray] = {}  # text key -> [len(POOLINGS), dim]
        if self.path.is_file():
            with np.load(self.path) as z:
                self.table = dict(zip(z["keys"].tolist(), z["x"]))
            log.info("%d cached feature rows in %s", len(self.table), self.path)

    @staticmethod
    def key(prompt: str, response: str) -> str:
        return hashlib.sha256(f"{prompt}\x00{response}".encode()).hexdigest()[:32]

    def get(self, prompts: Sequence[str], responses: Sequence[str], chunk: int = 48) -> np.ndarray:
        """``[n, len(POOLINGS), dim]`` for the pairs, extracting the missing ones (longest first, saved per chunk)."""
        keys = [self.key(p, r) for p, r in zip(prompts, responses)]
        todo = list({k: (p, r) for k, p, r in zip(keys, prompts, responses) if k not in self.table}.items())
        if todo:
            todo.sort(key=lambda kv: -len(kv[1][1]))
            log.info("extracting features of %d texts", len(todo))
            t0, before = time.perf_counter(), self.extractor.tokens
            for i in range(0, len(todo), chunk):
                part = todo[i : i + chunk]
                out = self.extractor.pooled([p for _, (p, _) in part], [r for _, (_, r) in part])
                for j, (k, _) in enumerate(part):
                    self.table[k] = np.stack([out[name][j] for name in self.poolings])
                self.save()
                secs = time.perf_counter() - t0
                done = min(i + chunk, len(todo))
                log.info(
                    "features %d/%d texts, %d tokens, %.0fs (%.0f tokens/s)",
                    done,
                    len(todo),
                    self.extractor.tokens - before,
                    secs,
                    (self.extractor.tokens - before) / max(secs, 1e-9),
                )
        return np.stack([self.table[k] for k in keys])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self.table)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, keys=np.array(keys, dtype="U32"), x=np.stack([self.table[k] for k in keys]))
        os.replace(tmp, self.path)  # atomic: an interrupted run keeps what it had


def select(x: np.ndarray, poolings: Sequence[str]) -> np.ndarray:
    """``[n, len(POOLINGS), dim]`` -> ``[n, len(poolings) * dim]``, in the order the judge concatenates them."""
    from rodeco_rewards.smollm_judge import POOLINGS

    return np.concatenate([x[:, POOLINGS.index(p)] for p in poolings], axis=1).astype(np.float64)


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class Fit:
    w: np.ndarray  # [F], on standardized features
    beta: float  # the length nuisance's coefficient (0 when not fitted); never used when judging


def pair_weights(u: np.ndarray, balanced: bool) -> np.ndarray:
    """Per-pair weights summing to 1: equal, or ``balanced`` (shorter-chosen and longer-chosen pairs weigh half
    each; ties weigh as an average pair)."""
    n = len(u)
    if not balanced:
        return np.full(n, 1.0 / n)
    pos, neg = u > 0, u < 0
    w = np.full(n, 1.0 / n)
    rest = 1.0 - (n - pos.sum() - neg.sum()) / n
    if pos.any():
        w[pos] = rest / 2 / pos.sum() if neg.any() else rest / pos.sum()
    if neg.any():
        w[neg] = rest / 2 / neg.sum() if pos.any() else rest / neg.sum()
    return w


def fit_bt(
    d: np.ndarray,
    u: np.ndarray,
    l2: float,
    *,
    nuisance: bool,
    balanced: bool,
    aug: np.ndarray | None = None,
    aug_weight: float = 0.0,
    max_iter: int = 500,
) -> Fit:
    """Minimize ``sum_i a_i softplus(-(d_i . w + beta u_i)) + l2 / 2 |w|^2`` (L-BFGS; ``beta`` unpenalized and
    fitted only with ``nuisance``): ``d`` chosen minus rejected standardized features, ``u`` the log length ratio,
    ``a`` the pair weights (summing to 1). ``aug``: synthetic pairs (original minus corrupted features) of total
    weight ``aug_weight``, with no length term (the nuisance models the annotator's length bias; they have none).
    The products run in torch (float64), so ``torch.set_num_threads`` bounds them."""
    import torch
    from scipy.optimize import minimize

    a = pair_weights(u, balanced)
    if aug is not None and len(aug) and aug_weight > 0:
        d = np.concatenate([d, aug])
        u = np.concatenate([u, np.zeros(len(aug))])
        a = np.concatenate([a, np.full(len(aug), aug_weight / len(aug))])
    at = torch.from_numpy(a)
    F = d.shape[1]
    X = torch.from_numpy(np.concatenate([d, u[:, None]], axis=1) if nuisance else np.ascontiguousarray(d))
    pen = torch.zeros(X.shape[1], dtype=torch.float64)
    pen[:F] = l2

    def f(theta: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.from_numpy(theta)
        m = X @ t
        loss = at @ torch.nn.functional.softplus(-m) + 0.5 * (pen * t * t).sum()
        g = -(X.T @ (at * torch.sigmoid(-m))) + pen * t
        return float(loss), g.numpy()

    res = minimize(f, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": max_iter})
    return Fit(w=res.x[:F].copy(), beta=float(res.x[F]) if nuisance else 0.0)


def standardization(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = x.mean(0), x.std(0)
    return mean, np.where(std > 1e-6, std, 1.0)


def folds_of(groups: Sequence[str], k: int, seed: int) -> np.ndarray:
    """Each pair's fold: its instruction's, instructions dealt out in a seeded order."""
    uniq = sorted(set(groups), key=lambda g: (len(g), g))
    random.Random(seed).shuffle(uniq)
    fold = {g: i % k for i, g in enumerate(uniq)}
    return np.array([fold[g] for g in groups])


@dataclass
class Problem:
    """Training pairs as arrays: features of each distinct text and the pairs' rows into them."""

    x: np.ndarray  # [texts, len(POOLINGS), dim]
    chosen: np.ndarray  # [pairs] rows of x
    rejected: np.ndarray
    u: np.ndarray  # [pairs] log tokens chosen - log tokens rejected (full responses)
    shorter: np.ndarray  # [pairs] bool: the chosen response has fewer characters
    groups: list[str]  # [pairs] instruction
    texts: list[tuple[str, str]] = field(default_factory=list)  # [texts] (prompt, response), the rows of x
    text_groups: list[str] = field(default_factory=list)  # [texts] instruction
    # synthetic pairs (a training response preferred to a corrupted copy of it): rows of x, kind, instruction
    aug_orig: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    aug_corr: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    aug_kind: list[str] = field(default_factory=list)
    aug_groups: list[str] = field(default_factory=list)


def accuracy(margin: np.ndarray) -> float:
    return float(np.mean(np.where(margin > 0, 1.0, np.where(margin == 0, 0.5, 0.0)))) if len(margin) else float("nan")


def train_head(
    prob: Problem,
    rows: np.ndarray,
    poolings: Sequence[str],
    control: str,
    l2: float,
    aug_rows: np.ndarray | None = None,
    aug_weight: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, Fit]:
    """(mean, std, fit) on the pairs ``rows`` and the synthetic pairs ``aug_rows``; the standardization is that of
    the pairs' distinct texts."""
    texts = np.unique(np.concatenate([prob.chosen[rows], prob.rejected[rows]]))
    X = select(prob.x, poolings)
    mean, std = standardization(X[texts])
    d = (X[prob.chosen[rows]] - X[prob.rejected[rows]]) / std
    aug = None
    if aug_rows is not None and len(aug_rows):
        aug = (X[prob.aug_orig[aug_rows]] - X[prob.aug_corr[aug_rows]]) / std
    fit = fit_bt(
        d,
        prob.u[rows],
        l2,
        nuisance="nuisance" in control,
        balanced="balanced" in control,
        aug=aug,
        aug_weight=aug_weight,
    )
    return mean, std, fit


@dataclass(frozen=True)
class Setting:
    poolings: tuple[str, ...]
    length_control: str
    l2: float
    augment_weight: float = 0.0

    def row(self) -> dict[str, Any]:
        return {
            "poolings": list(self.poolings),
            "length_control": self.length_control,
            "l2": self.l2,
            "augment_weight": self.augment_weight,
        }


def cross_validate(
    prob: Problem,
    poolings: Sequence[Sequence[str]],
    controls: Sequence[str],
    l2s: Sequence[float],
    k: int,
    seed: int,
    augment_weights: Sequence[float] = (0.0,),
) -> list[dict[str, Any]]:
    """Held-out accuracy (all pairs, shorter-chosen pairs) and held-out corruption rates (how often a held-out
    fold's corrupted copy scores below its original, per kind) of every setting; instruction-grouped ``k`` folds
    (a synthetic pair goes with its instruction); the judge's margin, without the length term."""
    fold = folds_of(prob.groups + prob.aug_groups, k, seed)
    fold, afold = fold[: len(prob.groups)], fold[len(prob.groups) :]
    kinds = sorted(set(prob.aug_kind), key=lambda c: CORRUPTIONS.index(c) if c in CORRUPTIONS else 99)
    table = []
    for pool in poolings:
        X = select(prob.x, pool)
        for control in controls:
            for l2 in l2s:
                for aw in augment_weights:
                    margin, amargin = np.zeros(len(prob.u)), np.zeros(len(prob.aug_kind))
                    for f in range(k):
                        tr, te = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
                        atr, ate = np.flatnonzero(afold != f), np.flatnonzero(afold == f)
                        mean, std, fit = train_head(prob, tr, pool, control, l2, atr, aw)
                        margin[te] = ((X[prob.chosen[te]] - X[prob.rejected[te]]) / std) @ fit.w
                        amargin[ate] = ((X[prob.aug_orig[ate]] - X[prob.aug_corr[ate]]) / std) @ fit.w
                    row = {
                        **Setting(tuple(pool), control, l2, aw).row(),
                        "cv_accuracy": round(accuracy(margin), 4),
                        "cv_accuracy_shorter_chosen": round(accuracy(margin[prob.shorter]), 4),
                        "cv_corruptions_lower": {
                            c: round(float(np.mean(amargin[np.array(prob.aug_kind) == c] > 0)), 4) for c in kinds
                        },
                    }
                    table.append(row)
                    log.info("cv %s", row)
    return table


def admissible(row: dict[str, Any], min_rate: float) -> bool:
    """Every corruption kind's held-out rate is at least ``min_rate`` (rows without synthetic data pass)."""
    return all(v >= min_rate for v in row.get("cv_corruptions_lower", {}).values())


def best_of(
    table: Sequence[dict[str, Any]],
    controls: Sequence[str] | None = None,
    augment_weights: Sequence[float] | None = None,
    min_corruption_rate: float = 0.0,
) -> dict[str, Any]:
    """The best row among ``controls`` and ``augment_weights`` (all if None): the admissible rows (every held-out
    corruption rate at least ``min_corruption_rate``) first, then shorter-chosen accuracy, then overall; ties: the
    larger penalty, the fewer poolings."""
    rows = [
        r
        for r in table
        if (controls is None or r["length_control"] in controls)
        and (augment_weights is None or r.get("augment_weight", 0.0) in augment_weights)
    ]
    return max(
        rows,
        key=lambda r: (
            admissible(r, min_corruption_rate),
            r["cv_accuracy_shorter_chosen"],
            r["cv_accuracy"],
            r["l2"],
            -len(r["poolings"]),
        ),
    )


# --------------------------------------------------------------------------- evaluation


def bootstrap_accuracy(margin: np.ndarray, groups: Sequence[str], n_boot: int, seed: int) -> dict[str, Any]:
    """Accuracy and its 95% CI from resampling instructions (their pairs go together)."""
    if not len(margin):
        return {"n": 0, "accuracy": None, "ci95": None}
    hit = np.where(margin > 0, 1.0, np.where(margin == 0, 0.5, 0.0))
    uniq = sorted(set(groups))
    gi = np.array([uniq.index(g) for g in groups])
    s, n = np.bincount(gi, hit, len(uniq)), np.bincount(gi, None, len(uniq))
    _, lo, hi = ratio_of_sums(s, n, n_boot, seed)
    return {
        "n": int(len(margin)),
        "instructions": len(uniq),
        "accuracy": round(float(hit.mean()), 4),
        "ci95": [round(float(lo), 4), round(float(hi), 4)],
    }


def bootstrap_rate(hits: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    lo, hi = mean_ci(hits, n_boot, seed)
    return {
        "n": int(len(hits)),
        "rate": round(float(hits.mean()), 4),
        "ci95": [round(float(lo), 4), round(float(hi), 4)],
    }


def sentence_units(text: str) -> list[str]:
    """``text`` as alternating units and separators (sentence ends, line breaks): ``[u0, s0, u1, s1, ..., un]``."""
    return re.split(r"((?<=[.!?])[ \t]+|\n+)", text)


def corrupt(text: str, kind: str, rng: random.Random) -> str:
    """A damaged copy of ``text``: ``truncated`` (its first half of words), ``repeated`` (its first paragraph, or its
    first sentence when it has one paragraph, three times), ``shuffled_sentences`` (sentences and lines in a random
    order, separators in place), ``shuffled_words`` (words in a random order, whitespace in place)."""
    if kind == "truncated":
        parts = re.split(r"(\s+)", text.strip())
        words = parts[0::2]
        keep = max(1, len(words) // 2)
        return "".join(parts[: 2 * keep - 1])
    if kind == "repeated":
        paras = re.split(r"(\n\s*\n)", text)
        if len(paras) >= 3:
            return paras[0] + paras[1] + paras[0] + paras[1] + text
        parts = sentence_units(text)
        sep = parts[1] if len(parts) > 1 else " "
        return (parts[0] + sep) * 2 + text
    if kind in ("shuffled_sentences", "shuffled_words"):
        parts = sentence_units(text) if kind == "shuffled_sentences" else re.split(r"(\s+)", text)
        units = parts[0::2]
        order = list(range(len(units)))
        for _ in range(10):  # a shuffle that moves something
            rng.shuffle(order)
            if [units[i] for i in order] != units:
                break
        parts[0::2] = [units[i] for i in order]
        return "".join(parts)
    raise ConfigError("corruption", kind, "unknown corruption", f"use one of {', '.join(CORRUPTIONS)}")


def in_window(text: str, n_tokens: Any, budget: int) -> str:
    """``text`` if it has at most ``budget`` tokens (``n_tokens(text)``), else its longest prefix of whole sentences
    (or lines) that does: what the judge sees of it, cut where a sentence ends."""
    if n_tokens(text) <= budget:
        return text
    parts = sentence_units(text)
    lo, hi = 0, len(parts[0::2])  # the number of whole units kept: lo fits (0 units), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if n_tokens("".join(parts[: 2 * mid - 1])) <= budget:
            lo = mid
        else:
            hi = mid
    return "".join(parts[: 2 * lo - 1]) if lo else ""


def corruption_set(pairs: Sequence[Any], n: int, n_tokens: Any, budget: int, seed: int) -> list[tuple[str, str]]:
    """Up to ``n`` held-out (prompt, chosen response), one per instruction (seeded), each cut to the judge's window
    at a sentence end (:func:`in_window`: every corruption is then visible to the judge), with at least four
    sentences and 20 words."""
    by_group: dict[str, list[tuple[str, str]]] = {}
    for p in pairs:
        if (p.prompt, p.chosen) not in by_group.setdefault(p.group, []):
            by_group[p.group].append((p.prompt, p.chosen))
    rng = random.Random(seed)
    groups = sorted(by_group, key=lambda g: (len(g), g))
    rng.shuffle(groups)
    out = []
    for g in groups:
        prompt, chosen = rng.choice(by_group[g])
        text = in_window(chosen, n_tokens, budget)
        if len(sentence_units(text)[0::2]) >= 4 and len(text.split()) >= 20:
            out.append((prompt, text))
        if len(out) == n:
            break
    return out


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")


def within_spearman(groups: Sequence[str], a: np.ndarray, b: np.ndarray) -> float:
    """The mean over instructions (with at least 3 responses) of the rank correlation within each."""
    vals = []
    for g in sorted(set(groups)):
        m = np.array([x == g for x in groups])
        if m.sum() >= 3 and np.ptp(a[m]) > 0 and np.ptp(b[m]) > 0:
            vals.append(spearman(a[m], b[m]))
    return float(np.mean(vals)) if vals else float("nan")


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def _command() -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        return " ".join(["rodeco", *HydraConfig.get().overrides.task])
    except (ImportError, ValueError):
        return "rodeco experiment=judge_train"


@dataclass
class Scored:
    """A scorer's view of the held-out data: pair margins, the responses' scores, the corruption hits."""

    margin: np.ndarray
    text_scores: np.ndarray
    corrupt_hits: dict[str, np.ndarray]


def evaluate(
    name: str, scored: Scored, test: Sequence[Any], u_test: np.ndarray, shorter: np.ndarray, n_boot: int, seed: int
) -> dict[str, Any]:
    groups = [p.group for p in test]
    sg = [g for g, s in zip(groups, shorter) if s]
    return {
        "name": name,
        "accuracy": bootstrap_accuracy(scored.margin, groups, n_boot, seed),
        "accuracy_shorter_chosen": bootstrap_accuracy(scored.margin[shorter], sg, n_boot, seed),
        "margin_vs_log_length_ratio": {
            "pearson": round(pearson(scored.margin, u_test), 4),
            "spearman": round(spearman(scored.margin, u_test), 4),
        },
        "corruptions_scored_lower": {k: bootstrap_rate(v, n_boot, seed) for k, v in scored.corrupt_hits.items()},
    }


# --------------------------------------------------------------------------- the run


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None) -> RunOutput:
    import json

    from rodeco import atomic_write
    from rodeco_rewards.smollm_judge import ASSET_STEM, head_stem

    a = node_dict(cfg.experiment_args)  # keys and types checked by JudgeTrainArgs
    seed = int(cfg.seed)
    check_grids(a)
    t0 = time.perf_counter()
    data = training_data(a, plugins, seed)
    feats = judge_features(a)
    tr = feats.problem(data.train)
    if int(a["augment_responses"]) > 0:  # synthetic pairs: training responses over corrupted copies of them
        augment(tr, data.train, feats, int(a["augment_responses"]), seed + 1)
    t_train_feat = time.perf_counter() - t0
    sel = select_settings(tr, a, seed)
    heads = fit_heads(tr, len(data.train), sel, a, feats.settings)
    te = feats.problem(data.test)
    check = corruption_check(data.test, feats, int(a["corruption_responses"]), seed)
    t_feat = time.perf_counter() - t0
    held = HeldOut(te, check, {label: scored_by_head(h, te, check) for label, h in heads.items()})
    if a["compare_reward"]:
        held.scored[a["compare_reward"]], held.compare = _compare(
            a["compare_reward"], plugins, te, check.originals, check.damaged, held.scored["judge"].text_scores
        )
    report = judge_report(a, data, tr, held, sel, heads["judge"])
    report["seconds"] = {"train_features": round(t_train_feat), "until_test_features": round(t_feat)}
    stems = []
    if a["install"]:
        stems.append(ASSET_STEM)
    if a["out"]:
        stems.append(head_stem(a["out"]))
    report["plumbing"] = _plumbing(plugins, heads["judge"], te.texts[:6], held.scored["judge"].text_scores[:6])
    report["seconds"]["total"] = round(time.perf_counter() - t0)
    head = heads["judge"]
    head.meta.update(head_record(report, sel, data.train, held.scored["judge"]))
    for stem in stems:
        head.save(stem)
    out = Path(out_dir) if out_dir else Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "judge_report.json", json.dumps(report, indent=1) + "\n")
    _print(report, out / "judge_report.json", stems)
    return RunOutput(
        results=[], compute=Compute(), out_dir=Path(out_dir) if out_dir else None, extra={"report": report}
    )


def check_grids(a: dict[str, Any]) -> None:
    """Every length control and pooling set of the grids is one the judge knows."""
    from rodeco_rewards.smollm_judge import POOLINGS

    for c in a["length_controls"]:
        if c not in LENGTH_CONTROLS:
            raise ConfigError(
                "experiment_args.length_controls",
                c,
                "unknown length control",
                f"use some of {', '.join(LENGTH_CONTROLS)}",
            )
    for pool in a["poolings"]:
        if not pool or any(p not in POOLINGS for p in pool):
            raise ConfigError(
                "experiment_args.poolings",
                pool,
                "not a list of poolings",
                f"each a non-empty list of {', '.join(POOLINGS)}",
            )


@dataclass
class TrainingData:
    """The preference pairs: training pairs (no evaluation prompt among them) and test pairs."""

    root: Path  # the data folder
    seed: int  # the run's seed: it draws the samples, the folds and the bootstrap
    kept: list[Pair]  # the training split without the evaluation prompts
    removed: dict[str, Any]  # what exclude() took away
    train: list[Pair]  # sampled from kept
    test: list[Pair]


def training_data(a: dict[str, Any], plugins: Plugins, seed: int) -> TrainingData:
    """The training split without any pair of an evaluation prompt, sampled by instruction; the test split sampled
    the same way."""
    from rodeco_rewards.prefs import data_dir, load_pairs

    root = data_dir(a["data_dir"])
    held = held_prompts(a["exclude_data"], plugins, root)
    kept, removed = exclude(load_pairs("alpaca_train", root), held)
    train = sample_by_instruction(kept, int(a["train_pairs"]), seed)
    test = sample_by_instruction(load_pairs("alpaca_test", root), a["test_pairs"], seed)
    leak = {p.group for p in train} & held.indices
    if leak:  # cannot happen after exclude(); a guard against a future edit
        raise ConfigError(
            "experiment_args.exclude_data",
            sorted(leak)[:5],
            "evaluation prompts in the training pairs",
            "exclude them before sampling",
        )
    log.info(
        "held out %s; training on %d pairs of %d instructions; testing on %d pairs",
        removed,
        len(train),
        len({p.group for p in train}),
        len(test),
    )
    return TrainingData(root, seed, kept, removed, train, test)


@dataclass
class JudgeFeatures:
    """The judge's features of (prompt, response) texts through the disk cache, and the responses' token counts."""

    extractor: HiddenStateFeatures
    settings: dict[str, Any]  # the extraction's settings (they key the cache, and go into the head's metadata)
    cache: FeatureCache
    n_tok: dict[str, int] = field(default_factory=dict)

    @property
    def budget(self) -> int:
        """The response tokens the judge reads."""
        return int(self.settings["max_response_tokens"])

    def tokens(self, text: str) -> int:
        """The full response's tokens: the nuisance regressor's length."""
        if text not in self.n_tok:
            self.n_tok[text] = max(1, len(self.extractor.tokenizer(text, add_special_tokens=False)["input_ids"]))
        return self.n_tok[text]

    def problem(self, pairs: Sequence[Pair]) -> Problem:
        group = {(p.prompt, r): p.group for p in pairs for r in (p.chosen, p.rejected)}
        texts = list(group)
        row = {t: i for i, t in enumerate(texts)}
        x = self.cache.get([t[0] for t in texts], [t[1] for t in texts])
        return Problem(
            x=x,
            chosen=np.array([row[(p.prompt, p.chosen)] for p in pairs]),
            rejected=np.array([row[(p.prompt, p.rejected)] for p in pairs]),
            u=np.array([np.log(self.tokens(p.chosen)) - np.log(self.tokens(p.rejected)) for p in pairs]),
            shorter=np.array([len(p.chosen) < len(p.rejected) for p in pairs]),
            groups=[p.group for p in pairs],
            texts=texts,
            text_groups=[group[t] for t in texts],
        )


def judge_features(a: dict[str, Any]) -> JudgeFeatures:
    """The base LM as a feature extractor, with its cache; ``threads`` bounds torch's CPU threads."""
    from rodeco_rewards.smollm_judge import POOLINGS, load_features

    settings = {
        "model": a["model"],
        "dtype": a["dtype"],
        "max_prompt_tokens": int(a["max_prompt_tokens"]),
        "max_response_tokens": int(a["max_response_tokens"]),
        "poolings": list(POOLINGS),
        "chat": True,
    }
    ex = load_features(
        a["model"],
        dtype=a["dtype"],
        device="cpu",
        max_prompt_tokens=settings["max_prompt_tokens"],
        max_response_tokens=settings["max_response_tokens"],
        batch_tokens=int(a["batch_tokens"]),
        key="experiment_args",
    )
    cache = FeatureCache(ex, settings)
    if a["threads"] is not None:
        import torch

        torch.set_num_threads(int(a["threads"]))
    return JudgeFeatures(ex, settings, cache)


def augment(tr: Problem, train: Sequence[Pair], feats: JudgeFeatures, n: int, seed: int) -> None:
    """Add to ``tr`` the synthetic pairs of ``n`` training responses (cut to the judge's window) over each of their
    corrupted copies."""
    group_of = {p.prompt: p.group for p in train}
    aug_src = corruption_set(train, n, feats.tokens, feats.budget, seed)
    rng = random.Random(seed)
    aug_texts = aug_src + [(p, corrupt(r, k, rng)) for k in CORRUPTIONS for p, r in aug_src]
    xa = feats.cache.get([p for p, _ in aug_texts], [r for _, r in aug_texts])
    n0, m = len(tr.x), len(aug_src)
    tr.x = np.concatenate([tr.x, xa])
    tr.aug_orig = np.tile(np.arange(n0, n0 + m), len(CORRUPTIONS))
    tr.aug_corr = np.arange(n0 + m, n0 + m * (1 + len(CORRUPTIONS)))
    tr.aug_kind = [k for k in CORRUPTIONS for _ in aug_src]
    tr.aug_groups = [group_of[p] for _ in CORRUPTIONS for p, _ in aug_src]


@dataclass
class Selection:
    """The cross-validation table and the settings chosen from it: ``judge`` and the heads it is compared with."""

    table: list[dict[str, Any]]
    chosen: dict[str, dict[str, Any]]  # judge, pairs_only, naive
    min_rate: float  # min_corruption_rate

    @property
    def best(self) -> dict[str, Any]:
        return self.chosen["judge"]


def select_settings(tr: Problem, a: dict[str, Any], seed: int) -> Selection:
    """Cross-validate the grids on the training data; the judge's setting is the best admissible one, the
    comparisons the best length-controlled one without synthetic pairs and the naive one."""
    table = cross_validate(
        tr,
        a["poolings"],
        a["length_controls"],
        a["l2_grid"],
        int(a["cv_folds"]),
        seed,
        a["augment_weights"] if len(tr.aug_kind) else [0.0],
    )
    min_rate = float(a["min_corruption_rate"])
    controlled = [c for c in a["length_controls"] if c != "none"] or ["none"]
    chosen = {
        "judge": best_of(table, min_corruption_rate=min_rate),
        "pairs_only": best_of(table, controlled, [0.0]),
        "naive": best_of(table, ["none"], [0.0]),
    }
    log.info("selected %s", chosen)
    return Selection(table, chosen, min_rate)


def fit_heads(
    tr: Problem, n_train: int, sel: Selection, a: dict[str, Any], settings: dict[str, Any]
) -> dict[str, JudgeHead]:
    """Each chosen setting fitted on all the training pairs (and synthetic pairs), as a head with its metadata."""
    from rodeco_rewards.smollm_judge import JudgeHead

    all_rows, all_aug = np.arange(n_train), np.arange(len(tr.aug_kind))
    heads: dict[str, JudgeHead] = {}
    for label, row in sel.chosen.items():
        mean, std, fit = train_head(
            tr, all_rows, row["poolings"], row["length_control"], row["l2"], all_aug, row["augment_weight"]
        )
        meta = {
            "model": a["model"],
            "dtype": a["dtype"],
            "poolings": row["poolings"],
            "max_prompt_tokens": settings["max_prompt_tokens"],
            "max_response_tokens": settings["max_response_tokens"],
            "length_control": row["length_control"],
            "l2": row["l2"],
            "augment_weight": row["augment_weight"],
            "length_nuisance_beta": round(fit.beta, 6),
        }
        heads[label] = JudgeHead(mean, std, fit.w, meta)
    return heads


@dataclass
class CorruptionCheck:
    """Held-out chosen responses cut to the judge's window, their corrupted copies, and the features of both."""

    originals: list[tuple[str, str]]
    damaged: dict[str, list[tuple[str, str]]]  # corruption kind -> the originals' corrupted copies
    xo: np.ndarray
    xd: dict[str, np.ndarray]


def corruption_check(test: Sequence[Pair], feats: JudgeFeatures, n: int, seed: int) -> CorruptionCheck:
    originals = corruption_set(test, n, feats.tokens, feats.budget, seed)
    rng = random.Random(seed)
    damaged = {k: [(p, corrupt(r, k, rng)) for p, r in originals] for k in CORRUPTIONS}
    xo = feats.cache.get([p for p, _ in originals], [r for _, r in originals])
    xd = {k: feats.cache.get([p for p, _ in v], [r for _, r in v]) for k, v in damaged.items()}
    return CorruptionCheck(originals, damaged, xo, xd)


@dataclass
class HeldOut:
    """The held-out evaluation: the test pairs, the corruption check, every scorer's view of them (the heads', and
    ``compare_reward``'s), and how ``compare_reward`` ranks the responses against the judge."""

    te: Problem
    check: CorruptionCheck
    scored: dict[str, Scored]
    compare: dict[str, Any] = field(default_factory=dict)


def scored_by_head(h: JudgeHead, te: Problem, check: CorruptionCheck) -> Scored:
    s = h(select(te.x, h.poolings))
    so = h(select(check.xo, h.poolings))
    return Scored(
        margin=s[te.chosen] - s[te.rejected],
        text_scores=s,
        corrupt_hits={k: (h(select(v, h.poolings)) < so).astype(float) for k, v in check.xd.items()},
    )


def data_record(data: TrainingData, held: HeldOut, budget: int) -> dict[str, Any]:
    """The report's (and the head's) account of the data: files, hashes, sizes, what was held out."""
    from rodeco_rewards.prefs import file_sha256, split_file

    train, test, root = data.train, data.test, data.root
    return {
        "train": {
            "file": f"prefs/{split_file('alpaca_train', root).name}",
            "sha256": file_sha256(split_file("alpaca_train", root)),
            "pairs": len(train),
            "instructions": len({p.group for p in train}),
            "held_out": data.removed,
            "pairs_after_exclusion": len(data.kept),
            "seed": data.seed,
        },
        "test": {
            "file": f"prefs/{split_file('alpaca_test', root).name}",
            "sha256": file_sha256(split_file("alpaca_test", root)),
            "pairs": len(test),
            "instructions": len({p.group for p in test}),
            "shorter_chosen_pairs": int(held.te.shorter.sum()),
        },
        "corruption_originals": {
            "responses": len(held.check.originals),
            "rule": "a held-out chosen response of each of "
            "seeded random test instructions, cut at the last sentence end inside "
            f"the judge's {budget}-token window (every "
            "corruption is then visible to it), at least 4 sentences and 20 words",
        },
    }


def judge_report(
    a: dict[str, Any], data: TrainingData, tr: Problem, held: HeldOut, sel: Selection, judge: JudgeHead
) -> dict[str, Any]:
    """``judge_report.json`` but for the timings and the plumbing check: the judge, the data, the selection and
    every scorer's held-out results."""
    from rodeco_rewards.prefs import length_baseline

    n_boot, seed, te = int(a["bootstrap"]), data.seed, held.te
    return {
        "command": _command(),
        "judge": {k: v for k, v in judge.meta.items()},
        "data": data_record(data, held, int(a["max_response_tokens"])),
        "selected": sel.best,
        "compared_settings": {k: v for k, v in sel.chosen.items() if k != "judge"},
        "selected_admissible": admissible(sel.best, sel.min_rate),
        "selection_rule": f"among settings whose held-out corruption rates (training responses, CV) are all >= "
        f"{sel.min_rate}: the highest CV accuracy on shorter-chosen pairs, then overall",
        "augment": {
            "responses": len(tr.aug_kind) // len(CORRUPTIONS),
            "kinds": list(CORRUPTIONS),
            "source": "chosen responses of training instructions, cut to the window like the check's",
        },
        "cv": sel.table,
        "length_only_baseline": {
            "accuracy": round(length_baseline(data.test), 4),
            "accuracy_shorter_chosen": 0.0,
            "chance_shorter_chosen": 0.5,
        },
        "results": {k: evaluate(k, v, data.test, te.u, te.shorter, n_boot, seed) for k, v in held.scored.items()},
        "compare": held.compare,
        "limitation": LIMITATION,
    }


def head_record(report: dict[str, Any], sel: Selection, train: Sequence[Pair], scored: Scored) -> dict[str, Any]:
    """What the judge's head carries besides its settings: how it was trained, chosen and checked."""
    ranked = sorted(
        sel.table,
        key=lambda r: (admissible(r, sel.min_rate), r["cv_accuracy_shorter_chosen"], r["cv_accuracy"]),
        reverse=True,
    )
    return {
        "trained_with": report["command"],
        "data": report["data"],
        "selected": sel.best,
        "selection_rule": report["selection_rule"],
        "compared_settings": report["compared_settings"],
        "augment": report["augment"],
        "cv_top": ranked[:8],
        "cv_settings_tried": len(sel.table),
        "metrics": report["results"]["judge"],
        "metrics_compared": {k: v for k, v in report["results"].items() if k != "judge"},
        "length_only_baseline": report["length_only_baseline"],
        "compare": report["compare"],
        "plumbing": report["plumbing"],
        "limitation": LIMITATION,
        "train_instructions": sorted({p.group for p in train}, key=lambda g: (len(g), g)),
        "score_stats": {"mean": float(scored.text_scores.mean()), "std": float(scored.text_scores.std())},
    }


def _compare(
    name: str,
    plugins: Plugins,
    te: Problem,
    originals: list[tuple[str, str]],
    damaged: dict[str, list[tuple[str, str]]],
    judge_scores: np.ndarray,
) -> tuple[Scored, dict[str, Any]]:
    """``name`` (a reward option, e.g. minilm_rm) on the same held-out responses, and its rank correlation with
    the judge's scores."""
    from rodeco_rewards.experiments.rm_eval import _attach_cache

    node = option("reward", name, plugins) or {"name": name}  # an option without a file is the registered name
    reward = plugins.build_reward(node, BuildContext(device="cpu", plugins=plugins))
    enc = _attach_cache(reward)

    def score(texts: Sequence[tuple[str, str]]) -> np.ndarray:
        out: list[float] = []
        for i in range(0, len(texts), 256):
            out += reward.score(
                [ScoreRequest(prompt=p, response=r, response_ids=(), partial=False) for p, r in texts[i : i + 256]]
            )
        return np.asarray(out, dtype=np.float64)

    s = score(te.texts)
    so = score(originals)
    hits = {k: (score(v) < so).astype(float) for k, v in damaged.items()}
    if enc is not None:
        enc.save()
    scored = Scored(margin=s[te.chosen] - s[te.rejected], text_scores=s, corrupt_hits=hits)
    compare = {
        "reward": name,
        "responses": len(te.texts),
        "spearman_all_responses": round(spearman(judge_scores, s), 4),
        "spearman_within_instruction_mean": round(within_spearman(te.text_groups, judge_scores, s), 4),
    }
    return scored, compare


def _plumbing(plugins: Plugins, head: JudgeHead, texts: list[tuple[str, str]], expected: np.ndarray) -> dict[str, Any]:
    """The head, written and built through the registry and called through ``score`` as a run does, gives the scores
    the experiment computed from cached features (a few held-out responses)."""
    from rodeco_rewards.smollm_judge import SmolLMJudge

    with tempfile.TemporaryDirectory() as d:
        stem = Path(d) / "smollm_judge"
        head.save(stem)
        reward = plugins.build_reward(
            {"name": "smollm_judge", "head": str(stem)}, BuildContext(device="cpu", plugins=plugins)
        )
        assert isinstance(reward, SmolLMJudge)  # the registry builds smollm_judge's own class
        got = np.asarray(
            reward.score([ScoreRequest(prompt=p, response=r, response_ids=(), partial=False) for p, r in texts])
        )
    return {
        "responses": len(texts),
        "max_abs_diff": float(np.abs(got - expected).max()),
        "cost": {"tokens": reward.cost.tokens, "flops": reward.cost.flops, "calls": reward.cost.calls},
    }


def _fmt(acc: dict[str, Any]) -> str:
    return f"{acc['accuracy']:.4f} [{acc['ci95'][0]:.4f}, {acc['ci95'][1]:.4f}] (n={acc['n']})"


def _print(report: dict[str, Any], path: Path, stems: list[Path]) -> None:
    base = report["length_only_baseline"]
    d = report["data"]
    print(
        f"train: {d['train']['pairs']} pairs of {d['train']['instructions']} instructions (held out: "
        f"{d['train']['held_out']}); test: {d['test']['pairs']} pairs of {d['test']['instructions']} instructions"
    )
    for label, s in {"judge": report["selected"], **report["compared_settings"]}.items():
        print(
            f"{label}: poolings={s['poolings']} length_control={s['length_control']} l2={s['l2']} "
            f"augment_weight={s['augment_weight']} cv_accuracy={s['cv_accuracy']} "
            f"cv_accuracy_shorter_chosen={s['cv_accuracy_shorter_chosen']} "
            f"cv_corruptions_lower={s.get('cv_corruptions_lower', {})}"
        )
    print(
        f"selection: {report['selection_rule']} (the judge's setting admissible: {report['selected_admissible']}); "
        f"synthetic pairs from {report['augment']['responses']} training "
        "responses x 4 corruptions"
    )
    print(f"length-only baseline: all {base['accuracy']:.4f}; shorter-chosen 0 (chance 0.5)")
    for name, r in report["results"].items():
        print(f"{name}: accuracy {_fmt(r['accuracy'])}; shorter-chosen {_fmt(r['accuracy_shorter_chosen'])}")
        m = r["margin_vs_log_length_ratio"]
        print(f"{name}: margin vs log length ratio: pearson {m['pearson']:.4f} spearman {m['spearman']:.4f}")
        cr = r["corruptions_scored_lower"]
        print(
            f"{name}: corrupted scored lower (n={next(iter(cr.values()))['n']}): "
            + "; ".join(f"{k} {v['rate']:.3f} [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]" for k, v in cr.items())
        )
    c = report["compare"]
    if c:
        print(
            f"rank correlation with {c['reward']} on {c['responses']} held-out responses: spearman "
            f"{c['spearman_all_responses']:.4f}; within instruction (mean) "
            f"{c['spearman_within_instruction_mean']:.4f}"
        )
    p = report["plumbing"]
    print(
        f"through the registry: max |score - cached-feature score| {p['max_abs_diff']:.2e} on {p['responses']} "
        f"responses"
    )
    print(f"limitation: {report['limitation']}")
    print(f"seconds: {report['seconds']}")
    print(f"report: {path}")
    for stem in stems:
        print(f"head: {stem}.npz")
