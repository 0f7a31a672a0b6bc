"""``rodeco experiment=perplexity``: maximize the generator's own likelihood (Sun et al. 2024, Section 5.3).

The reward is ``logprob`` in its ``perplexity`` form (``-exp(mean negative log-likelihood)``), so the chosen
response is the one with the lowest perplexity under the generator. The samples and runs are those of
``experiment=efficiency`` (one pool for Best-of-N, real Speculative Rejection runs under Best-of-n's budget).
The table compares each method's mean perplexity of the chosen responses with Best-of-N's at the same FLOPs
(Best-of-N's curve, linear in log FLOPs between its points; ``-`` beyond the curve). Best-of-N's perplexity at
``N`` is the expected minimum over random size-``N`` subsets of the pool (``metrics.expected_best_of``).

Writes ``perplexity.json``, ``perplexity.md`` (the table) and ``perplexity.png`` into the run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rodeco.config import split_node
from rodeco.experiments import analysis, efficiency
from rodeco.experiments.metrics import expected_best_of
from rodeco.plugins import Plugins
from rodeco.results import ResultsWriter
from rodeco.state import Compute, RunOutput
from rodeco.validation import ConfigError


def _check_reward(cfg: DictConfig) -> None:
    name, params = split_node(cfg.reward, "reward")
    if name != "logprob" or params.get("form") != "perplexity" or params.get("model"):
        raise ConfigError("reward", f"{name} (form {params.get('form')}, model {params.get('model')})",
                          "the perplexity experiment scores with the generator's own log-probabilities",
                          "use reward=logprob reward.form=perplexity reward.model=null (the experiment's default)")


def at_compute(flops: float, curve_flops: list[float], curve_y: list[float]) -> float | None:
    """Best-of-N's value at ``flops``, linear in log FLOPs between curve points; None outside the curve."""
    x = np.log(np.asarray(curve_flops, dtype=np.float64))
    if not x[0] <= np.log(flops) <= x[-1]:
        return None
    return float(np.interp(np.log(flops), x, np.asarray(curve_y, dtype=np.float64)))


def table(prompts: list[dict[str, Any]], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per Best-of-N point and per method: FLOPs, mean perplexity of the chosen responses, and for the
    methods Best-of-N's perplexity at the same FLOPs."""
    curve = summary["curve"]
    bon_ppl = [float(np.mean([-expected_best_of(p["pool"]["scores"], N) for p in prompts])) for N in curve["N"]]
    curve["perplexity"] = bon_ppl
    rows = [{"method": f"Best-of-{N}", "flops": f, "perplexity": y, "bon_perplexity_same_flops": y}
            for N, f, y in zip(curve["N"], curve["flops"], bon_ppl)]
    for key, m in summary["methods"].items():
        label, scale = key.split("@")
        m["perplexity"] = float(np.mean([-p["methods"][label][scale]["best"] for p in prompts]))
        rows.append({"method": f"SR {label} (budget x{scale})", "flops": m["flops"], "perplexity": m["perplexity"],
                     "bon_perplexity_same_flops": at_compute(m["flops"], curve["flops"], bon_ppl)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| method | TFLOPs | mean perplexity of chosen | Best-of-N at the same FLOPs |", "|---|---:|---:|---:|"]
    for r in rows:
        same = r["bon_perplexity_same_flops"]
        out.append(f"| {r['method']} | {r['flops'] / 1e12:.3f} | {r['perplexity']:.3f} | "
                   f"{'-' if same is None else f'{same:.3f}'} |")
    return "\n".join(out) + "\n"


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    from rodeco.loading import load_generator

    _check_reward(cfg)
    a = efficiency.parse_args(cfg)
    subset = efficiency.load_subset(a)
    gen = gen or load_generator(cfg.generator)
    prompts = efficiency.collect(cfg, plugins, gen, a, subset, out_dir)
    summary = analysis.summarize(prompts, a)
    rows = table(prompts, summary)
    head = analysis.headline(summary)
    ref = "fixed_alpha_0.5@1" if "fixed_alpha_0.5@1" in summary["methods"] else next(iter(summary["methods"]))
    n = summary["n"]
    last = {f"perplexity_best_of_{n}": summary["curve"]["perplexity"][summary["curve"]["N"].index(n)],
            f"perplexity_{ref.split('@')[0]}": summary["methods"][ref]["perplexity"],
            f"perplexity_best_of_n_same_flops_{ref.split('@')[0]}":
                next(r for r in rows if r["method"].startswith(f"SR {ref.split('@')[0]} (budget x1)"))[
                    "bon_perplexity_same_flops"], **head}
    res = {"args": a, "reward": "logprob", "max_new_tokens": cfg.sampling.max_new_tokens,
           "generator": str(cfg.generator.model),
           "device": str(gen.device), **summary, "table": rows, "headline": last, "per_prompt": prompts}
    if out_dir is not None:
        w = ResultsWriter(out_dir, resume=False)
        w.write_json("perplexity.json", res)
        (Path(out_dir) / "perplexity.md").write_text(markdown(rows), encoding="utf-8")
        analysis.plot(summary, Path(out_dir) / "perplexity.png", y="perplexity",
                        ylabel="mean perplexity of the chosen responses (lower is better)",
                        title=f"{len(prompts)} prompts, reward logprob (perplexity), "
                              f"{res['max_new_tokens']} new tokens")
    print(markdown(rows), end="")
    for key, v in last.items():
        print(f"{key}: {'nan' if v is None else analysis.fmt(v)}")
    return RunOutput([], Compute(), Path(out_dir) if out_dir else None, extra=res)
