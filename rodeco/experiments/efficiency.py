"""``rodeco experiment=efficiency``: Best-of-N vs Speculative Rejection at equal memory (the paper's Figure 3).

Each prompt is decoded on its own, under the budget that Best-of-``n`` fills at full length
(``L0 + n * max_new_tokens`` KV tokens with the fast engine, which stores the prompt once; ``n * (L0 +
max_new_tokens)`` with the ``hf`` engine), times each of ``experiment_args.scales``.

- **Best-of-N** for ``N`` = 1, 2, 4, ... up to ``pool_factor * n``: one pool of ``M = pool_factor * n`` samples per
  prompt, decoded without rejection and scored with the run's reward; the expected best of a random size-``N``
  subset is Best-of-N's expected reward (``metrics.expected_best_of``). Its FLOPs are ``N / M`` of the pool's. Its
  time is ``N / n`` times a real Best-of-``n`` run's under the budget (``N / n`` batches of ``n``, one after the
  other).
- **Speculative Rejection**: ``policy=fixed`` at each of ``alphas`` and each policy in ``policies``, starting from
  ``n_start`` rows (``auto``: as many as the first round fits) under the same budget. Each is a real run; its
  candidates are pool samples (same seed), so both methods pick from one set of samples.

Per method: mean final reward, the improvement score over Best-of-``n`` (``metrics.improvement_score``, with the
expected best and worst of ``n`` pool samples as each prompt's anchors, so Best-of-``n`` scores exactly 100),
generator + reward FLOPs and wall time, and the speedups: the FLOPs (time) Best-of-N needs to reach the method's
improvement score, log-interpolated on its curve, divided by the method's. ``relative_compute`` is the paper's
metric under a memory-bound model of an accelerator, where a decode step costs the same at any batch that fits the
budget: ``(N_match / n') * (T_bon_n' / T_method)``, ``n' = scale * n`` the Best-of-n' that fills the method's
memory, with ``T = decode steps * (seconds per step of Best-of-n on that prompt) + reward-model seconds``
(Best-of-n' takes Best-of-n's steps and ``scale`` times its reward-model time). A method beyond the top of the
Best-of-N curve gets a lower bound (flagged).

Writes ``efficiency_prompts.jsonl`` (each prompt's measurements, as soon as they are done; a rerun into the same
directory resumes), then ``efficiency.json``, ``efficiency.md`` (the table) and ``efficiency.png`` (improvement
score vs FLOPs, log x) into the run directory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rodeco.budget import Budget, full_length_tokens, rows_at_full_length
from rodeco.compose import option_params
from rodeco.config import make_budget, split_node
from rodeco.contracts import Scorer
from rodeco.data import Prompt
from rodeco.experiments.analysis import fmt, headline, markdown, plot, summarize
from rodeco.loop import LoopSettings, decode_batch
from rodeco.plugins import BuildContext, Plugins
from rodeco.results import ResultsWriter
from rodeco.sampling import SamplingParams
from rodeco.state import Compute, PromptResult, RunOutput
from rodeco.validation import ConfigError

log = logging.getLogger(__name__)

def parse_args(cfg: DictConfig) -> dict[str, Any]:
    """``experiment_args`` (keys and types checked by ``EfficiencyArgs`` when the config was composed) with the
    checks a schema cannot express."""
    a = OmegaConf.to_container(cfg.experiment_args, resolve=True)

    def positive(key: str, value: Any, fix: str) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"experiment_args.{key}", value, "must be a positive integer", fix)

    positive("k", a["k"], "e.g. 8")
    if a["n"] != "budget":
        positive("n", a["n"], "e.g. 4, or 'budget' for as many as the budget holds at full length")
    positive("pool_factor", a["pool_factor"], "e.g. 32 (Best-of-N up to 32n)")
    if a["n_start"] != "auto":
        positive("n_start", a["n_start"], "e.g. 64, or auto")
    for x in a["alphas"]:
        if not (isinstance(x, (int, float)) and 0 <= x < 1):
            raise ConfigError("experiment_args.alphas", a["alphas"], f"alpha {x} is not in [0, 1)", "e.g. [0.5]")
    if not a["scales"] or any(not isinstance(s, int) or s < 1 for s in a["scales"]) or 1 not in a["scales"]:
        raise ConfigError("experiment_args.scales", a["scales"], "must be positive integers including 1",
                          "e.g. [1, 2]: budgets of Best-of-n and Best-of-2n")
    if not a["alphas"] and not a["policies"]:
        raise ConfigError("experiment_args.alphas", a["alphas"], "no Speculative Rejection method to run",
                          "give alphas or policies")
    return a


def load_subset(a: dict[str, Any]) -> list[Prompt]:
    """The first ``k`` prompts: inline ``prompts``, or records of ``prompts_file`` whose text is taken from
    ``text_file`` by ``af_eval_idx`` when both are given (the paper's subset with the full AlpacaEval text)."""
    if a["prompts"] is not None:
        return [Prompt(i, str(t)) for i, t in enumerate(a["prompts"][: a["k"]])]
    path = Path(a["prompts_file"])
    if not path.is_file():
        raise ConfigError("experiment_args.prompts_file", str(path), f"no such file (looked in {Path.cwd()})",
                          "run from the repository root, or give the path of a JSON list of {prompt: ...}")
    recs = json.loads(path.read_text(encoding="utf-8"))[: a["k"]]
    if not a["text_file"]:
        return [Prompt(int(r.get("af_eval_idx", i)), r["prompt"]) for i, r in enumerate(recs)]
    texts = {}
    with open(a["text_file"], encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                texts[int(r["idx"])] = r["prompt"]
    out = []
    for r in recs:
        idx = r.get("af_eval_idx")
        if idx is None or int(idx) not in texts:
            raise ConfigError("experiment_args.text_file", a["text_file"], f"no record with idx={idx}",
                              "set experiment_args.text_file=null to use the prompts_file text")
        out.append(Prompt(int(idx), texts[int(idx)]))
    return out


@dataclass
class Run:
    """One method on one prompt."""

    best: float  # final reward of the chosen response
    best_id: int  # its candidate id
    gen_flops: float
    reward_flops: float
    seconds: float  # prefill + decode + score + prune
    decode_s: float
    score_s: float
    steps: int
    peak_kv_tokens: int
    scores: list[float] = field(default_factory=list)  # final rewards of the finished candidates, by candidate id

    @property
    def flops(self) -> float:
        return self.gen_flops + self.reward_flops


def _run(res: PromptResult, c: Compute) -> Run:
    t = c.time_s
    done = sorted((x for x in res.candidates or [] if x.finished), key=lambda x: x.candidate_id)
    return Run(best=float(res.best.score), best_id=res.best.candidate_id, gen_flops=c.gen_flops,
               reward_flops=c.reward_flops,
               seconds=sum(t.values()), decode_s=t.get("decode", 0.0), score_s=t.get("score", 0.0),
               steps=c.decode_steps, peak_kv_tokens=c.peak_kv_tokens, scores=[float(x.score) for x in done])


class Runner:
    """Decodes one prompt at a time with one reward and prebuilt policies."""

    def __init__(self, cfg: DictConfig, plugins: Plugins, gen) -> None:
        self.cfg, self.gen = cfg, gen
        ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
        self.reward_name, self.ctx, self.plugins = split_node(cfg.reward, "reward")[0], ctx, plugins
        self.scorer = Scorer(plugins.build_reward(cfg.reward, ctx), self.reward_name)
        s = cfg.sampling
        self.sampling = SamplingParams(s.temperature, s.top_k, s.top_p)
        self.max_new = s.max_new_tokens

    def policy(self, name: str, **params: Any):
        try:
            self.plugins.policies.get(name)
        except ConfigError as e:  # the registry speaks of policy.name: the name came from experiment_args
            raise ConfigError("experiment_args.policies", name, e.problem, e.fix) from None
        node = {**option_params("policy", name, self.plugins), **params, "name": name}
        return self.plugins.build_policy(node, self.ctx)

    def budget(self, prompt: Prompt, n: int, scale: int) -> int:
        """KV tokens Best-of-(scale * n) fills at full length on this prompt."""
        return full_length_tokens(scale * n, len(self.gen.encode(prompt.text)), self.max_new, self.gen.shares_prefix)

    def __call__(self, prompt: Prompt, policy_name: str, policy, n: int | str, kv_tokens: int | None) -> Run:
        settings = LoopSettings(n=n, sampling=self.sampling, max_new_tokens=self.max_new,
                                budget=Budget(kv_tokens, self.cfg.budget.min_tokens_per_round), seed=self.cfg.seed,
                                all_candidates=True, policy_name=policy_name, reward_name=self.reward_name)
        (res,), comp = decode_batch(self.gen, self.scorer, policy, [(prompt.index, prompt.text)], settings)
        return _run(res, comp)


def choose_n(cfg: DictConfig, gen, a: dict[str, Any], subset: list[Prompt]) -> int:
    """Best-of-n's n: ``experiment_args.n``, or (``budget``) the most rows the run's budget (``budget.kv_tokens``,
    or free device memory on CUDA) holds at full length on every prompt of ``subset``."""
    if a["n"] != "budget":
        return int(a["n"])
    B = make_budget(cfg, gen).kv_tokens
    if B is None:
        raise ConfigError("experiment_args.n", "budget", "needs a finite budget",
                          "set budget.kv_tokens (CPU), run on CUDA, or give n as a number")
    new = cfg.sampling.max_new_tokens
    n = min(rows_at_full_length(B, len(gen.encode(p.text)), new, gen.shares_prefix) for p in subset)
    if n < 1:
        raise ConfigError("budget.kv_tokens", B, "holds no full-length row", "raise it or lower max_new_tokens")
    return n


def methods(a: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, policy name, parameters) of every Speculative Rejection method."""
    out = [(f"fixed_alpha_{x:g}", "fixed", {"alpha": float(x)}) for x in a["alphas"]]
    return out + [(p, p, {}) for p in a["policies"]]


def collect(cfg: DictConfig, plugins: Plugins, gen, a: dict[str, Any], subset: list[Prompt],
            out_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Per prompt of ``subset``: the pool, a real Best-of-n run and every method at every scale. Each prompt's
    record is written to ``efficiency_prompts.jsonl`` in ``out_dir`` as soon as it is measured; a rerun into the
    same directory (``output.resume``) measures only the prompts not there yet."""
    from tqdm.auto import tqdm

    n = choose_n(cfg, gen, a, subset)
    settings = _settings(cfg, a, n)
    writer = ResultsWriter(out_dir, resume=cfg.output.resume, name=PROMPTS_FILE) if out_dir is not None else None
    done = _resumable(writer, settings)
    run = Runner(cfg, plugins, gen)
    none = run.policy("none")
    built = [(label, run.policy(name, **params)) for label, name, params in methods(a)]
    out = []
    for p in tqdm(subset, desc="prompts", unit="prompt", disable=not cfg.output.progress):
        if p.index in done:
            out.append(done[p.index])
            continue
        rec: dict[str, Any] = {"prompt_index": p.index, "n": n, "budget": {}, "settings": settings}
        rec["pool"] = asdict(run(p, "none", none, a["pool_factor"] * n, None))
        B = run.budget(p, n, 1)
        rec["bon_n"] = asdict(run(p, "none", none, n, B))
        rec["methods"] = {}
        for scale in a["scales"]:
            B = run.budget(p, n, scale)
            rec["budget"][str(scale)] = B
            for label, policy in built:
                r = run(p, label, policy, a["n_start"] if a["n_start"] == "auto" else a["n_start"] * scale, B)
                rec["methods"].setdefault(label, {})[str(scale)] = asdict(r)
                log.info("prompt %d, %s, scale %d: best %.4f, %.3g FLOPs", p.index, label, scale, r.best, r.flops)
        if writer is not None:
            writer.write(rec)
        out.append(rec)
    return out


PROMPTS_FILE = "efficiency_prompts.jsonl"


def _settings(cfg: DictConfig, a: dict[str, Any], n: int) -> dict[str, Any]:
    """What a prompt's measurements depend on: a resumed record must have been measured with the same."""
    keep = ("pool_factor", "n_start", "alphas", "policies", "scales")
    return {"n": n, **{k: a[k] for k in keep}, "seed": cfg.seed,
            **{k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("generator", "reward", "sampling")},
            "min_tokens_per_round": cfg.budget.min_tokens_per_round}


def _resumable(writer: ResultsWriter | None, settings: dict[str, Any]) -> dict[int, dict[str, Any]]:
    if writer is None:
        return {}
    for rec in writer.records.values():
        if rec.get("settings") != settings:
            raise ConfigError("output.resume", True, f"{writer.path} holds prompt {rec['prompt_index']} measured "
                              "with other settings", "use a new hydra.run.dir, or output.resume=false to start over")
    if writer.records:
        log.info("resuming: %d prompts already measured in %s", len(writer.records), writer.path)
    return dict(writer.records)


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    from rodeco.loading import load_generator

    a = parse_args(cfg)
    subset = load_subset(a)  # a bad prompt file fails before any model is loaded
    gen = gen or load_generator(cfg.generator)
    prompts = collect(cfg, plugins, gen, a, subset, out_dir)
    meta = {"args": a, "reward": split_node(cfg.reward, "reward")[0], "max_new_tokens": cfg.sampling.max_new_tokens,
            "generator": str(cfg.generator.model), "device": str(gen.device)}
    res = report(meta, prompts, out_dir)
    return RunOutput([], Compute(), Path(out_dir) if out_dir else None, extra=res)


def report(meta: dict[str, Any], prompts: list[dict[str, Any]], out_dir: str | Path | None) -> dict[str, Any]:
    """Summary, table, plot and headline lines from the per-prompt measurements."""
    summary = summarize(prompts, meta["args"])
    head = headline(summary)
    res = {**meta, **summary, "headline": head, "per_prompt": prompts}
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("efficiency.json", res)
        (Path(out_dir) / "efficiency.md").write_text(markdown(summary), encoding="utf-8")
        plot(summary, Path(out_dir) / "efficiency.png",
             title=f"{len(prompts)} prompts, reward {res['reward']}, {res['max_new_tokens']} new tokens")
    print(markdown(summary), end="")
    for key, v in head.items():
        print(f"{key}: {fmt(v)}")
    return res


def main(argv: list[str] | None = None) -> None:
    """``python -m rodeco.experiments.efficiency RUN_DIR``: redo the analysis of a run's ``efficiency.json`` (or of
    an ``experiment=perplexity`` run's ``perplexity.json``: the same measurements) without decoding again, and
    (re)write ``efficiency.json``, ``efficiency.md`` and ``efficiency.png`` there."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("run_dir", type=Path)
    d = ap.parse_args(argv).run_dir
    src = next((d / f for f in ("efficiency.json", "perplexity.json") if (d / f).is_file()), None)
    if src is None:
        raise SystemExit(f"{d}: no efficiency.json or perplexity.json (give the run directory of either experiment)")
    res = json.loads(src.read_text(encoding="utf-8"))
    res.setdefault("reward", "logprob")  # experiment=perplexity
    meta = {k: res[k] for k in ("args", "reward", "max_new_tokens", "generator", "device")}
    report(meta, res["per_prompt"], d)


if __name__ == "__main__":
    main()
