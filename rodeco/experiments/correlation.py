"""``rodeco experiment=correlation``: how well partial rewards predict final rewards (Speculative Rejection,
Appendix B).

Without rejection (``policy=none``, unlimited budget), ``n`` candidates per prompt are decoded to the end. For each
reward in ``experiment_args.rewards``, every candidate's prefix of ``L`` generator tokens (``L`` in
``experiment_args.lengths``) is scored as a partial response and its full response as a final one; per prompt and
length, Pearson r and Kendall tau (scipy.stats) between partial and final scores are computed over the candidates
*longer than L tokens* (shorter ones finished before the decision point). Prompts with fewer than 3 such
candidates, or with constant scores, are skipped; the mean over the remaining prompts is reported per length, with
how many prompts it used. Writes ``correlation.json`` and ``correlation.png`` into the run directory.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from rodeco.compose import option_params
from rodeco.plugins import BuildContext, Plugins
from rodeco.results import ResultsWriter
from rodeco.runner import run_decode
from rodeco.state import Candidate, PromptResult, RunOutput, ScoreRequest
from rodeco.validation import ConfigError

log = logging.getLogger(__name__)

MIN_CANDIDATES = 3  # a correlation over fewer candidates is not reported


def _args(cfg: DictConfig) -> dict[str, Any]:
    a = OmegaConf.to_container(cfg.experiment_args, resolve=True)  # keys and types checked by CorrelationArgs
    for key in ("k", "n", "batch_candidates"):
        if not isinstance(a[key], int) or isinstance(a[key], bool) or a[key] < 1:
            raise ConfigError(f"experiment_args.{key}", a[key], "must be a positive integer", "e.g. 8")
    if not a["lengths"] or any(not isinstance(x, int) or x < 1 for x in a["lengths"]):
        raise ConfigError("experiment_args.lengths", a["lengths"], "must be a non-empty list of positive integers",
                          "e.g. [8, 16, 32, 64]")
    if not a["rewards"]:
        raise ConfigError("experiment_args.rewards", a["rewards"], "must name at least one reward",
                          "e.g. [minilm_rm, logprob]")
    if a["prompts"] is None and not a["prompts_file"]:
        raise ConfigError("experiment_args.prompts_file", a["prompts_file"], "no prompts given",
                          "set experiment_args.prompts_file or experiment_args.prompts")
    return a


def pool_config(cfg: DictConfig, a: dict[str, Any]) -> DictConfig:
    """The decode config of the candidate pool: Best-of-N without rejection, every candidate kept.

    The pool is decoded with the ``logprob`` reward (generator log-probs, no extra model): each reward under study
    is applied afterwards, so the pool's own reward only fills ``Candidate.score``."""
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.task = "decode"
        c.n = a["n"]
        c.policy = {"name": "none"}
        c.reward = {"name": "logprob", "form": "mean", "model": None}
        c.budget.kv_tokens = None
        c.output.all_candidates = True
        c.output.progress = False
        if a["prompts"] is not None:
            c.data.path, c.data.prompts = None, list(a["prompts"])
        else:
            c.data.path, c.data.prompts, c.data.field = a["prompts_file"], None, a["field"]
        c.data.offset, c.data.limit = 0, a["k"]
    return c


@torch.inference_mode()
def teacher_forced_logprobs(gen, prompt: str, responses: Sequence[Sequence[int]],
                            batch: int = 8) -> list[list[float]]:
    """Per-token log-probs of each response under the generator (raw logits, as the decode loop records them):
    one forward pass of prompt + response per candidate, ``batch`` candidates at a time (right-padded)."""
    p_ids = gen.encode(prompt)
    P = len(p_ids)
    out: list[list[float]] = []
    for i in range(0, len(responses), batch):
        chunk = [list(r) for r in responses[i: i + batch]]
        T = P + max((len(r) for r in chunk), default=0)
        ids = torch.full((len(chunk), T), gen.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(chunk):
            ids[j, : P + len(r)] = torch.tensor(p_ids + r, dtype=torch.long)
            mask[j, : P + len(r)] = 1
        logits = gen.model(input_ids=ids.to(gen.device), attention_mask=mask.to(gen.device)).logits
        for j, r in enumerate(chunk):
            if not r:
                out.append([])
                continue
            lg = logits[j, P - 1: P - 1 + len(r)].float()  # the logits that predict each response token
            tgt = torch.tensor(r, dtype=torch.long, device=lg.device)[:, None]
            out.append(torch.log_softmax(lg, -1).gather(-1, tgt)[:, 0].tolist())
    return out


def check_reward(name: str, plugins: Plugins) -> None:
    try:
        plugins.rewards.get(name)
    except ConfigError as e:
        raise ConfigError("experiment_args.rewards", name, e.problem,
                          "use a registered reward, e.g. logprob") from None


def build_reward(name: str, plugins: Plugins, gen):
    """Reward ``name`` with its config option's parameters."""
    check_reward(name, plugins)
    ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
    return plugins.build_reward({**option_params("reward", name, plugins), "name": name}, ctx)


def score_prompt(reward, gen, res: PromptResult, lengths: Sequence[int],
                 lps: list[list[float]] | None) -> dict[str, Any]:
    """Partial scores at each length (candidates longer than L) and final scores of one prompt's candidates."""
    cands: list[Candidate] = res.candidates or []

    def req(c: Candidate, i: int, L: int | None) -> ScoreRequest:
        ids = c.token_ids if L is None else c.token_ids[:L]
        lp = None if lps is None else tuple(lps[i] if L is None else lps[i][:L])
        text = c.text if L is None else gen.decode_text(ids)
        return ScoreRequest(res.prompt, text, tuple(ids), partial=L is not None,
                            prompt_index=res.prompt_index, candidate_id=c.candidate_id, logprobs=lp)

    final = [float(x) for x in reward.score([req(c, i, None) for i, c in enumerate(cands)])]
    per_len = {}
    for L in lengths:
        idx = [i for i, c in enumerate(cands) if len(c.token_ids) > L]
        partial = [float(x) for x in reward.score([req(cands[i], i, L) for i in idx])] if idx else []
        per_len[str(L)] = {"candidates": [cands[i].candidate_id for i in idx], "partial": partial,
                           "final": [final[i] for i in idx]}
    return {"prompt_index": res.prompt_index, "final": final, "lengths": per_len}


def correlations(partial: Sequence[float], final: Sequence[float]) -> tuple[float, float] | None:
    """(Pearson r, Kendall tau), or None with fewer than ``MIN_CANDIDATES`` candidates or constant scores."""
    from scipy import stats

    if len(partial) < MIN_CANDIDATES or np.ptp(partial) == 0 or np.ptp(final) == 0:
        return None
    r = float(stats.pearsonr(partial, final).statistic)
    tau = float(stats.kendalltau(partial, final).statistic)
    return (r, tau) if math.isfinite(r) and math.isfinite(tau) else None


def summarize(prompts: list[dict[str, Any]], lengths: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per length: each prompt's (r, tau) in place, and the mean over the prompts that have one."""
    out = {}
    for L in lengths:
        rs, taus = [], []
        for p in prompts:
            cell = p["lengths"][str(L)]
            c = correlations(cell["partial"], cell["final"])
            cell["pearson"], cell["kendall"] = (c if c else (None, None))
            if c:
                rs.append(c[0])
                taus.append(c[1])
        out[str(L)] = {"pearson": float(np.mean(rs)) if rs else None,
                       "kendall": float(np.mean(taus)) if taus else None, "prompts_used": len(rs),
                       "prompts": len(prompts)}
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
    from rodeco.loading import load_generator

    a = _args(cfg)
    lengths = sorted(set(a["lengths"]))
    for name in a["rewards"]:  # unknown names fail before any model is loaded
        check_reward(name, plugins)
    gen = gen or load_generator(cfg.generator)
    log.info("decoding the pool: %d candidates per prompt, no rejection", a["n"])
    pool = run_decode(pool_config(cfg, a), plugins, out_dir=None, gen=gen)
    per_reward: dict[str, list[dict[str, Any]]] = {}
    summary: dict[str, dict[str, Any]] = {}
    for name in a["rewards"]:
        reward = build_reward(name, plugins, gen)
        needs_lp = bool(getattr(reward, "needs_logprobs", False))
        rows = []
        for res in pool.results:
            cands = res.candidates or []
            lps = (teacher_forced_logprobs(gen, res.prompt, [c.token_ids for c in cands], a["batch_candidates"])
                   if needs_lp else None)
            rows.append(score_prompt(reward, gen, res, lengths, lps))
        per_reward[name] = rows
        summary[name] = summarize(rows, lengths)
        log.info("scored %d prompts with %s", len(rows), name)
    res = {"lengths": lengths, "n": a["n"], "prompts": len(pool.results),
           "max_new_tokens": cfg.sampling.max_new_tokens,
           "note": "at length L only candidates with more than L response tokens count; prompts with fewer than "
                   f"{MIN_CANDIDATES} such candidates or constant scores are skipped (prompts_used)",
           "summary": summary, "per_prompt": per_reward}
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("correlation.json", res)
        plot(summary, lengths, Path(out_dir) / "correlation.png")
    for name, per_len in summary.items():
        for L in lengths:
            s = per_len[str(L)]
            print(f"correlation_{name}_prompts_used_len{L}: {s['prompts_used']}/{s['prompts']}")
            for stat in ("pearson", "kendall"):
                v = s[stat]
                print(f"correlation_{name}_{stat}_len{L}: {'nan' if v is None else f'{v:.3f}'}")
    return RunOutput(pool.results, pool.compute, Path(out_dir) if out_dir else None, extra=res)
