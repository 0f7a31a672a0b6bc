"""``rodeco experiment=perplexity``: maximize the generator's own likelihood (Sun et al. 2024, Section 5.3).

The reward is ``logprob`` in its ``perplexity`` form (``-exp(mean negative log-likelihood)``), so the chosen
response is the one with the lowest perplexity under the generator. The pool, the replays and the analysis are
those of ``experiment=efficiency`` (the same pool serves both: this reward's scores are computed from the pool's
stored log-probabilities and cached beside the other reward's). The table compares each method's mean perplexity
of the chosen responses with Best-of-N's at the same FLOPs (its curve, linear in log FLOPs between points; ``-``
beyond it), on the report half of the prompts. The alpha the headline reports is chosen on the selection half
(the largest perplexity reduction over Best-of-N at the same FLOPs).

Writes ``perplexity_prompts.jsonl``, ``perplexity.json``, ``perplexity.md`` and ``perplexity.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError
from rodeco.core.config import split_node
from rodeco.core.results import ResultsWriter
from rodeco.experiments import analysis, efficiency, render
from rodeco.plugins import Plugins


def _check_reward(cfg: DictConfig) -> None:
    name, params = split_node(cfg.reward, "reward")
    if name != "logprob" or params.get("form") != "perplexity" or params.get("model"):
        raise ConfigError(
            "reward",
            f"{name} (form {params.get('form')}, model {params.get('model')})",
            "the perplexity experiment scores with the generator's own log-probabilities",
            "use reward=logprob reward.form=perplexity reward.model=null (the experiment's default)",
        )


def at_compute(flops: float, curve_flops: list[float], curve_y: list[float]) -> float | None:
    """Best-of-N's value at ``flops``, linear in log FLOPs between curve points; None outside the curve."""
    x = np.log(np.asarray(curve_flops, dtype=np.float64))
    if not x[0] <= np.log(flops) <= x[-1]:
        return None
    return float(np.interp(np.log(flops), x, np.asarray(curve_y, dtype=np.float64)))


def table(summary: dict[str, Any], half: str) -> list[dict[str, Any]]:
    """One row per Best-of-N point and per method of one half: FLOPs, mean perplexity of the chosen responses, and
    for the methods Best-of-N's perplexity at the same FLOPs."""
    c = summary["curve"][half]
    ppl = [-r for r in c["reward"]]
    rows = [
        {"method": f"Best-of-{int(N)}", "flops": f, "perplexity": y, "bon_perplexity_same_flops": y}
        for N, f, y in zip(c["N"], c["flops"], ppl)
    ]
    for key, row in summary["methods"].items():
        if "infeasible" in row:
            continue
        label, scale = key.split("@")
        r = row[half]
        rows.append(
            {
                "method": f"SR {label} (budget x{scale})",
                "label": label,
                "scale": int(scale),
                "flops": r["flops"],
                "perplexity": -r["reward"],
                "bon_perplexity_same_flops": at_compute(r["flops"], c["flops"], ppl),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], n_prompts: int) -> str:
    out = [
        f"Report half: {n_prompts} prompts.",
        "",
        "| method | TFLOPs | mean perplexity of chosen | Best-of-N at the same FLOPs |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        same = r["bon_perplexity_same_flops"]
        out.append(
            f"| {r['method']} | {r['flops'] / 1e12:.3f} | {r['perplexity']:.3f} | "
            f"{'-' if same is None else f'{same:.3f}'} |"
        )
    return "\n".join(out) + "\n"


def choose_alpha(rows: list[dict[str, Any]]) -> str:
    """The fixed-alpha method (budget x1, auto start) with the largest perplexity reduction over Best-of-N at the
    same FLOPs."""
    cands = [
        r
        for r in rows
        if r.get("scale") == 1
        and r["label"].startswith("fixed_alpha_")
        and "start" not in r["label"]
        and not analysis.is_oracle(r["label"])
        and r["bon_perplexity_same_flops"] is not None
    ]
    return max(cands, key=lambda r: r["bon_perplexity_same_flops"] - r["perplexity"])["label"]


def headline(summary: dict[str, Any], selection: list[dict[str, Any]], report: list[dict[str, Any]]) -> dict[str, Any]:
    """The lines printed last: Best-of-n's perplexity, the alpha chosen on the selection half (``choose_alpha``) with
    its perplexity and Best-of-N's at its FLOPs on the report half, then the efficiency headline
    (``analysis.headline``)."""
    chosen = choose_alpha(selection)
    row = next(r for r in report if r.get("label") == chosen and r["scale"] == 1)
    n = summary["n"]
    return {
        f"perplexity_best_of_{n}": next(r["perplexity"] for r in report if r["method"] == f"Best-of-{n}"),
        "chosen_alpha": chosen,
        f"perplexity_{chosen}": row["perplexity"],
        f"perplexity_best_of_n_same_flops_{chosen}": row["bon_perplexity_same_flops"],
        **analysis.headline(summary),
    }


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    _check_reward(cfg)
    a = efficiency.parse_args(cfg)
    out_dir = Path(out_dir) if out_dir is not None else None
    prompts, measurer = efficiency.collect(cfg, plugins, a, out_dir, gen=gen)
    a, pool = measurer.a, measurer.pool
    tm = analysis.TimeModel.fit(pool, [p["prompt_index"] for p in prompts])
    labels = [m.label for m in measurer.methods]
    summary = analysis.summarize(prompts, a, tm, cfg.sampling.max_new_tokens, labels, seed=cfg.seed)
    selection, report = table(summary, "selection"), table(summary, "report")
    head = headline(summary, selection, report)
    P = len(summary["halves"]["report"])
    res = {
        "args": a,
        "reward": "logprob (perplexity)",
        "pool": str(pool.path),
        **summary,
        "table": report,
        "table_selection": selection,
        "headline": head,
        "per_prompt": prompts,
    }
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("perplexity.json", res)
        (out_dir / "perplexity.md").write_text(markdown(report, P), encoding="utf-8")
        render.plot(
            summary,
            out_dir / "perplexity.png",
            y="reward",
            ylabel="mean -perplexity of the chosen responses (higher is better)",
            title=f"{P} report prompts, reward logprob (perplexity), pool of {summary['M']}",
        )
    print(markdown(report, P), end="")
    print("\n".join(render.headline_lines(head)))
    return RunOutput([], Compute(), out_dir, extra=res)
