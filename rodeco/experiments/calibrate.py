"""``rodeco experiment=calibrate pool=DIR``: how predictive the run's ``partial_reward`` is of its ``reward`` at
each decision length, measured on a pool of *training* prompts (``data``, default ``alpaca_train``; no prompt of
the data options in ``experiment_args.exclude_data`` may be among them). Writes the calibration file the
``calibrated`` policy reads (``rodeco.core.calibration``), and prints per length:

- the mean per-prompt Pearson r (bootstrap 95% CI over prompts) and Kendall tau between partial and final scores;
- the pooled regression of the standardized final score on the standardized partial score (slope) and its
  residual spread;
- the probability that the eventual best candidate is in the partial scores' top k.

At length ``L`` only candidates longer than ``L`` tokens count (the others finished before the decision point);
prompts with fewer than 3 such candidates or constant scores are skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError, check_positive_int, node_dict
from rodeco.compose import option_file
from rodeco.core.calibration import Calibration, standardize
from rodeco.core.data import HubSource, load_prompts
from rodeco.experiments.bootstrap import mean_ci
from rodeco.experiments.correlation import MIN_CANDIDATES, correlations, score_prompt
from rodeco.experiments.record import pool_dir, pool_roles, record, served
from rodeco.plugins import Plugins
from rodeco.replays.replay import open_pool
from rodeco.roles import ORACLE, choose_roles
from rodeco.tasks import prompts_of

log = logging.getLogger(__name__)


def check_training_prompts(prompts, exclude: list[str], plugins: Plugins) -> None:
    """No prompt of an evaluation data option may be calibrated on."""
    texts = {p.text.strip(): p.index for p in prompts}
    for name in exclude:
        f = option_file("data", name, plugins)
        if f is None:
            raise ConfigError("experiment_args.exclude_data", name, "no such data option", "e.g. [alpacafarm100]")
        d = node_dict(OmegaConf.load(f))
        held = load_prompts(
            d.get("path"),
            d.get("prompts"),
            d.get("field", "prompt"),
            d.get("offset", 0),
            None,
            d.get("indices"),
            d.get("root"),
            HubSource.of(d),
        )
        clash = [texts[h.text.strip()] for h in held if h.text.strip() in texts]
        if clash:
            raise ConfigError(
                "data",
                f"prompts {clash[:5]}",
                f"also in the evaluation set data={name} ({len(clash)} in all)",
                "calibrate on training prompts only (data=alpaca_train)",
            )


def final_link(partial: np.ndarray, final: np.ndarray) -> tuple[float, float]:
    """One prompt's finals against its partial scores (the same candidates): the finals' mean above the partials',
    and their spread, in partial-score spreads."""
    sd = float(partial.std())
    return float(final.mean() - partial.mean()) / sd, float(final.std()) / sd


def calibration_stats(
    rows: list[dict[str, Any]], lengths: list[int], top_k: list[int], bootstrap: int, seed: int
) -> dict[str, Any]:
    """Per length: pooled slope and residual spread of standardized finals on standardized partials, per-prompt
    Pearson/Kendall means (Pearson with a bootstrap CI), top-k hit rates of the eventual best, and where the finals
    sit against the partials (``final_link``)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {
        "slope": [],
        "resid_sd": [],
        "pearson": [],
        "pearson_ci": [],
        "kendall": [],
        "n_prompts": [],
        "top_k": {str(k): [] for k in top_k},
        "final_offset": [],
        "final_spread": [],
    }
    for L in lengths:
        zp_all, zf_all, rs, taus, links = [], [], [], [], []
        hits: dict[int, list[bool]] = {k: [] for k in top_k}
        for row in rows:
            cell = row["lengths"][str(L)]
            c = correlations(cell["partial"], cell["final"])
            if c is None:
                continue
            s, f = np.asarray(cell["partial"]), np.asarray(cell["final"])
            zp_all.append(standardize(s))
            zf_all.append(standardize(f))
            rs.append(c[0])
            taus.append(c[1])
            links.append(final_link(s, f))
            rank = int(np.sum(s > s[int(np.argmax(f))]))  # rows scored above the eventual best
            for k in top_k:
                hits[k].append(rank < k)
        if len(rs) < 2:
            raise ConfigError(
                "experiment_args.lengths",
                L,
                f"only {len(rs)} prompts have {MIN_CANDIDATES}+ candidates still active there",
                "drop the length, or use more prompts",
            )
        zp, zf = np.concatenate(zp_all), np.concatenate(zf_all)
        slope = float(zp @ zf / (zp @ zp))
        out["slope"].append(slope)
        out["resid_sd"].append(float(np.sqrt(np.mean((zf - slope * zp) ** 2))))
        out["pearson"].append(float(np.mean(rs)))
        out["pearson_ci"].append(mean_ci(rs, bootstrap, rng))
        out["kendall"].append(float(np.mean(taus)))
        out["n_prompts"].append(len(rs))
        out["final_offset"].append(float(np.mean([x[0] for x in links])))
        out["final_spread"].append(float(np.mean([x[1] for x in links])))
        for k in top_k:
            out["top_k"][str(k)].append(float(np.mean(hits[k])))
    return out


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    a = node_dict(cfg.experiment_args)  # keys and types checked by CalibrateArgs
    for key in ("candidates", "bootstrap"):
        check_positive_int(f"experiment_args.{key}", a[key], 32)
    lengths = sorted(set(a["lengths"]))
    if not lengths or lengths[0] < 1:
        raise ConfigError("experiment_args.lengths", a["lengths"], "need positive decision lengths", "e.g. [8, 16]")
    choices = choose_roles(cfg, plugins, live=False)
    p_name = choices.partial.name
    if p_name == ORACLE:
        raise ConfigError(
            "partial_reward",
            ORACLE,
            "the oracle is perfectly predictive by construction",
            "calibrate a real scorer: partial_reward=same, or a reward option",
        )
    prompts = prompts_of(cfg.data)
    check_training_prompts(prompts, a["exclude_data"], plugins)
    path = pool_dir(cfg, Path(out_dir) if out_dir is not None else None)
    record(cfg, plugins, path, prompts, a["candidates"], gen=gen)
    pool, rgen = open_pool(path)
    for p in prompts:
        rgen.add(pool.prompt(p.index))
    final_scorer, partial_scorer, ident = pool_roles(cfg, plugins, pool, rgen).scorers(choices)
    final = served(final_scorer.reward)
    partial = served(partial_scorer.reward) if partial_scorer is not None else final
    from tqdm.auto import tqdm

    rows = []
    for p in tqdm(prompts, desc="calibrate", unit="prompt", disable=not cfg.output.progress):
        rows.append(score_prompt(partial, rgen, pool, p.index, lengths, final_reward=final))
        for r in {id(final): final, id(partial): partial}.values():
            r.save()
    stats = calibration_stats(rows, lengths, sorted(set(a["top_k"])), a["bootstrap"], cfg.seed)
    cal = Calibration(
        generator=ident["generator"],
        partial_reward=ident["partial_reward"],
        reward=ident["reward"],
        lengths=lengths,
        **stats,
        source={
            "pool": str(path),
            "prompts": [p.index for p in prompts],
            "candidates": pool.candidates,
            "data": node_dict(cfg.data).get("path"),
            "command": f"rodeco experiment=calibrate partial_reward={p_name}",
        },
    )
    target = Path(a["output"]) if a["output"] else (Path(out_dir) / "calibration.json" if out_dir else None)
    if target is not None:
        cal.save(target)
        print(f"calibration: {target}")
    print(f"calibration_prompts: {len(prompts)} ({pool.candidates} candidates each)")
    for i, L in enumerate(lengths):
        ci = stats["pearson_ci"][i]
        tops = " ".join(f"top{k}={stats['top_k'][str(k)][i]:.2f}" for k in sorted(set(a["top_k"])))
        print(
            f"calibration_len{L}: pearson {stats['pearson'][i]:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] kendall "
            f"{stats['kendall'][i]:.3f} slope {stats['slope'][i]:.3f} resid_sd {stats['resid_sd'][i]:.3f} "
            f"{tops} final_offset {stats['final_offset'][i]:.2f} final_spread {stats['final_spread'][i]:.2f} "
            f"(prompts {stats['n_prompts'][i]})"
        )
    return RunOutput(
        [],
        Compute(),
        Path(out_dir) if out_dir else None,
        extra={"calibration": str(target) if target else None, **stats},
    )
