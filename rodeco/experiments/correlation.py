"""``rodeco experiment=correlation``: how well partial rewards predict final rewards (Speculative Rejection,
Appendix B), on a recorded pool (``pool=DIR``, recorded first where the run's prompts are missing).

For each reward in ``experiment_args.rewards`` (with its config option's parameters), every pool candidate's
prefix of ``L`` generator tokens (``L`` in ``experiment_args.lengths``) is scored as a partial response and its full
response as a final one (by the same reward, or by ``experiment_args.final``: how well a decision-time scorer
predicts another reward's final score); the scores come from the pool's cache, computed on first use (a candidate's
partial
score at ``L`` is what a live run scores at a decision point at ``L``). Per prompt and length, Pearson r and
Kendall tau (scipy.stats) between partial and final scores are computed over the candidates *longer than L tokens*
(shorter ones finished before the decision point). Prompts with fewer than 3 such candidates, or with constant
scores, are skipped; the mean over the remaining prompts is reported per length with a bootstrap 95% CI over
prompts and how many prompts it used. Writes ``correlation.json`` and ``correlation.png``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco.common.state import Compute, RunOutput, ScoreRequest
from rodeco.common.validation import ConfigError, check_positive_int, node_dict
from rodeco.compose import option_node
from rodeco.core.results import ResultsWriter
from rodeco.experiments.bootstrap import mean_ci
from rodeco.experiments.record import pool_dir, record
from rodeco.plugins import Plugins
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.replays.pool_session import ReplayGenerator
from rodeco.replays.replay import open_pool
from rodeco.roles import pool_served
from rodeco.tasks import prompts_of

log = logging.getLogger(__name__)

MIN_CANDIDATES = 3  # a correlation over fewer candidates is not reported


def _args(cfg: DictConfig) -> dict[str, Any]:
    a = node_dict(cfg.experiment_args)  # keys and types checked by CorrelationArgs
    for key in ("candidates", "bootstrap"):
        check_positive_int(f"experiment_args.{key}", a[key], 32)
    if not a["lengths"] or any(not isinstance(x, int) or x < 1 for x in a["lengths"]):
        raise ConfigError(
            "experiment_args.lengths",
            a["lengths"],
            "must be a non-empty list of positive integers",
            "e.g. [8, 16, 32, 64]",
        )
    if not a["rewards"]:
        raise ConfigError(
            "experiment_args.rewards", a["rewards"], "must name at least one reward", "e.g. [minilm_rm, logprob]"
        )
    return a


def check_reward(name: str, plugins: Plugins) -> None:
    try:
        plugins.rewards.get(name)
    except ConfigError as e:
        raise ConfigError("experiment_args.rewards", name, e.problem, "use a registered reward, e.g. logprob") from None


def pool_reward_named(name: str, plugins: Plugins, pool: Pool) -> PoolReward:
    """Reward ``name`` with its config option's parameters, served from the pool's cache."""
    check_reward(name, plugins)
    return pool_served(plugins, pool, option_node("reward", name, plugins))


def score_prompt(
    reward: PoolReward,
    gen: ReplayGenerator,
    pool: Pool,
    index: int,
    lengths: Sequence[int],
    final_reward: PoolReward | None = None,
) -> dict[str, Any]:
    """Partial scores (by ``reward``) at each length (candidates longer than L) and final scores (by
    ``final_reward``, default ``reward``) of one prompt's candidates. A reward that needs hidden states gets the
    pool's."""
    p = pool.prompt(index)
    hidden = pool.hidden(index) if reward.needs_hidden_states else None

    def req(i: int, L: int) -> ScoreRequest:
        return p.request(
            i,
            L,
            gen.decode_text(p.candidates[i].token_ids[:L]),
            hidden=None if hidden is None else np.asarray(hidden[i, L - 1], dtype=np.float32),
        )

    final = [float(x) for x in (final_reward or reward).score(p.final_requests())]
    per_len = {}
    for L in lengths:
        idx = [i for i, c in enumerate(p.candidates) if len(c.token_ids) > L]
        partial = [float(x) for x in reward.score([req(i, L) for i in idx])] if idx else []
        per_len[str(L)] = {"candidates": idx, "partial": partial, "final": [final[i] for i in idx]}
    return {"prompt_index": index, "final": final, "lengths": per_len}


def correlations(partial: Sequence[float], final: Sequence[float]) -> tuple[float, float] | None:
    """(Pearson r, Kendall tau), or None with fewer than ``MIN_CANDIDATES`` candidates or constant scores."""
    from scipy import stats

    if len(partial) < MIN_CANDIDATES or np.ptp(partial) == 0 or np.ptp(final) == 0:
        return None
    r = float(stats.pearsonr(partial, final).statistic)
    tau = float(stats.kendalltau(partial, final).statistic)
    return (r, tau) if math.isfinite(r) and math.isfinite(tau) else None


def summarize(
    prompts: list[dict[str, Any]], lengths: Sequence[int], bootstrap: int = 1000, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per length: each prompt's (r, tau) in place, and the mean over the prompts that have one with a bootstrap
    95% CI over those prompts."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, Any]] = {}
    for L in lengths:
        rs, taus = [], []
        for p in prompts:
            cell = p["lengths"][str(L)]
            c = correlations(cell["partial"], cell["final"])
            cell["pearson"], cell["kendall"] = c if c else (None, None)
            if c:
                rs.append(c[0])
                taus.append(c[1])
        out[str(L)] = {
            "pearson": float(np.mean(rs)) if rs else None,
            "kendall": float(np.mean(taus)) if taus else None,
            "prompts_used": len(rs),
            "prompts": len(prompts),
        }
        for key, xs in (("pearson", rs), ("kendall", taus)):
            out[str(L)][f"{key}_ci"] = mean_ci(xs, bootstrap, rng) if xs else None
    return out


def plot(summary: dict[str, dict[str, dict[str, Any]]], lengths: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, per_len in summary.items():
        for stat, style in (("pearson", "-o"), ("kendall", "--s")):
            ys = [per_len[str(L)][stat] for L in lengths]
            ys = [np.nan if y is None else y for y in ys]
            ax.plot(list(lengths), ys, style, label=f"{name} ({stat})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), [str(L) for L in lengths])
    ax.set_xlabel("decision length (generator tokens)")
    ax.set_ylabel("mean correlation, partial vs final reward")
    ax.set_ylim(-1.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    a = _args(cfg)
    lengths = sorted(set(a["lengths"]))
    for name in a["rewards"]:  # unknown names fail before any model is loaded
        check_reward(name, plugins)
    prompts = prompts_of(cfg.data)
    path = pool_dir(cfg, Path(out_dir) if out_dir is not None else None)
    record(cfg, plugins, path, prompts, a["candidates"], gen=gen)
    pool, rgen = open_pool(path)
    for p in prompts:
        rgen.add(pool.prompt(p.index))
    per_reward: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, dict[str, Any]] = {}
    final = pool_reward_named(a["final"], plugins, pool) if a["final"] else None
    for name in a["rewards"]:
        reward = pool_reward_named(name, plugins, pool)
        rows = [score_prompt(reward, rgen, pool, p.index, lengths, final_reward=final) for p in prompts]
        reward.save()
        per_reward[name] = rows
        summary[name] = summarize(rows, lengths, a["bootstrap"], cfg.seed)
        log.info("scored %d prompts with %s (%d requests computed, the rest cached)", len(rows), name, reward.computed)
    res = {
        "lengths": lengths,
        "candidates": pool.candidates,
        "prompts": len(prompts),
        "pool": str(path),
        "final": a["final"] or "each reward's own",
        "max_new_tokens": pool.settings["max_new_tokens"],
        "note": "at length L only candidates with more than L response tokens count; prompts with fewer than "
        f"{MIN_CANDIDATES} such candidates or constant scores are skipped (prompts_used)",
        "summary": summary,
        "per_prompt": per_reward,
    }
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("correlation.json", res)
        plot(summary, lengths, Path(out_dir) / "correlation.png")
    for name, per_len in summary.items():
        for L in lengths:
            s = per_len[str(L)]
            print(f"correlation_{name}_prompts_used_len{L}: {s['prompts_used']}/{s['prompts']}")
            for stat in ("pearson", "kendall"):
                v, ci = s[stat], s[f"{stat}_ci"]
                print(
                    f"correlation_{name}_{stat}_len{L}: {'nan' if v is None else f'{v:.3f}'}"
                    + ("" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]")
                )
    return RunOutput([], Compute(), Path(out_dir) if out_dir else None, extra=res)
