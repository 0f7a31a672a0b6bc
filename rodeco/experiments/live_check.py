"""The efficiency experiment's live check (``efficiency.report``): three policies and Best-of-N run for real, the
model and reward loaded, on a few report prompts, each compared with its replay on the pool: the same winners and
token counts make replay fair, and measured over modelled wall time checks the time model, per method."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco.core.contracts import Scorer
from rodeco.experiments import analysis
from rodeco.experiments.metrics import bon_sizes
from rodeco.plugins import BuildContext, Plugins
from rodeco.replays.pool import Pool
from rodeco.roles import RoleBuilder

log = logging.getLogger(__name__)


LIVE_CHECK = ("fixed_alpha_0.5", "adaptive_delta_0.05", "correlation")  # replayed and run live on a few prompts


def live_check(
    cfg: DictConfig,
    plugins: Plugins,
    pool: Pool,
    measurer: Any,
    records: dict[int, dict[str, Any]],
    indices: list[int],
    tm: analysis.TimeModel,
    bon_ns: list[int],
    gen=None,
) -> dict[str, Any]:
    """``measurer``: the ``efficiency.Measurer`` that replayed the prompts. Run three policies live (the real model
    and reward) on ``indices`` under the budget of Best-of-n, and
    Best-of-N for each of ``bon_ns`` (one batch of N, its first N candidates), and compare each with its replay:
    the same winners and token counts make replay fair; the wall times check the time model, per method."""
    from rodeco.core.loading import load_generator
    from rodeco.core.loop import decode_batch

    gen = gen or load_generator(cfg.generator)
    ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
    scorer = Scorer(RoleBuilder(plugins, gen.name, ctx).reward(measurer.choices.reward), measurer.reward_name)
    rows = []
    for index in indices:
        p, rec = pool.prompt(index), records[index]
        runs = [
            (
                label,
                measurer.policies[label],
                measurer.settings(label, "auto", rec["budget"]["1"]),
                rec["methods"][label]["1"],
            )
            for label in LIVE_CHECK
            if label in measurer.policies
        ]
        runs += [
            (
                f"best_of_{N}",
                measurer.none,
                measurer.settings("none", N, None),
                measurer.run(index, measurer.none, "none", N, None),
            )
            for N in bon_ns
        ]
        for label, policy, s, replayed in runs:
            t0 = time.perf_counter()
            (res,), c = decode_batch(gen, scorer, policy, [(index, p.text)], s)
            live_s = time.perf_counter() - t0
            rows.append(
                {
                    "prompt_index": index,
                    "policy": label,
                    "same_winner": res.best.candidate_id == replayed["best_id"],
                    "same_tokens": c.gen_decode_tokens == replayed["decode_tokens"],
                    "same_steps": c.decode_steps == replayed["steps"],
                    "live_seconds": live_s,
                    "model_seconds": tm.seconds(replayed, p.prefill_seconds),
                    "live_decode_tokens": c.gen_decode_tokens,
                    "replay_decode_tokens": replayed["decode_tokens"],
                }
            )
            log.info("live check %s", rows[-1])
    per = {}
    for label in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == label]
        per[label] = ratio(mine)
    return {
        "runs": rows,
        "same_winner": sum(r["same_winner"] for r in rows),
        "same_tokens": sum(r["same_tokens"] for r in rows),
        "n": len(rows),
        "live_over_model_seconds": ratio(rows),
        "live_over_model_seconds_by_method": per,
    }


def ratio(rows: list[dict[str, Any]]) -> float:
    """Measured over modelled wall time, summed over the runs."""
    return float(sum(r["live_seconds"] for r in rows) / max(1e-9, sum(r["model_seconds"] for r in rows)))


def matched_bon(summary: dict[str, Any], M: int) -> int:
    """The Best-of-N that matches fixed alpha 0.5 at the budget of Best-of-n on the report half: the power of two
    (at most M) nearest its ``n_match`` in log N."""
    nm = summary["methods"][f"{analysis.REF}@1"]["report"]["n_match"]
    return min(bon_sizes(M), key=lambda N: abs(np.log(N) - np.log(max(nm, 1.0))))
