"""Human-readable summary of a run for the CLI."""

from __future__ import annotations

import textwrap
from typing import Any

from omegaconf import DictConfig

from rodeco.common.state import RunOutput


def bon_equivalent_tokens(out: RunOutput) -> float:
    """Decode tokens Best-of-n with the same n would spend: every candidate to the end. Candidates that were
    rejected are counted at the mean length of the finished candidates of the same prompt (an estimate)."""
    total = 0.0
    for r in out.results:
        if r.candidates is None:
            raise ValueError(f"prompt {r.prompt_index} kept only its winner: run with output.all_candidates=true")
        fin = [c for c in r.candidates if c.finished]
        mean_len = sum(len(c.token_ids) + (c.stop_reason == "eos") for c in fin) / max(1, len(fin))
        total += mean_len * r.n_start
    return total


def summarize(out: RunOutput, cfg: DictConfig) -> str:
    lines = []
    for r in out.results:
        lines.append(f"\n=== prompt {r.prompt_index}: {textwrap.shorten(r.prompt, 100)}")
        lines.append(f"best of {r.n_start} (reward {r.best.score:.4f}, {len(r.rounds)} decision point(s)):")
        lines.append(textwrap.indent(r.best.text.strip() or "(empty)", "  "))
        if r.judge:
            lines.append(
                "judged: "
                + ", ".join(
                    f"{j.name} {j.score:.4f}" if j.score is not None else f"{j.name} failed ({j.error})"
                    for j in r.judge
                )
            )
    c = out.compute
    lines.append("\n--- compute")
    lines.append(
        f"generator tokens: prefill {c.gen_prefill_tokens}, decode {c.gen_decode_tokens}; "
        f"reward tokens {c.reward_tokens} ({c.partial_reward_tokens} of them at decision points, "
        f"{c.partial_reward_calls} of {c.reward_calls} reward calls); total {c.total_flops / 1e9:.1f} GFLOPs"
    )
    lines.append(
        f"peak KV cache: {c.peak_kv_tokens} tokens ({c.peak_kv_bytes / 2**20:.1f} MiB), "
        f"budget {cfg.budget.kv_tokens}"
        + (f"; vLLM preemptions: {c.preemptions}" if cfg.generator.engine == "vllm" else "")
    )
    lines.append("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(c.time_s.items())))
    if all(r.candidates is not None for r in out.results) and out.results:
        bon = bon_equivalent_tokens(out)
        saved = 1 - c.gen_decode_tokens / bon if bon else 0.0
        lines.append(
            f"Best-of-{out.results[0].n_start} would decode ~{bon:.0f} tokens; this run decoded "
            f"{c.gen_decode_tokens}: {100 * saved:.0f}% of the decode compute saved"
        )
    if out.extra.get("judge"):
        lines.append(judge_line(out.extra["judge"]))
    if out.out_dir is not None:
        lines.append(f"results: {out.out_dir / 'results.jsonl'}")
    return "\n".join(lines)


def judge_line(section: dict[str, Any]) -> str:
    """One line for ``summary.json``'s ``judge`` section: each judge's mean over the winners and what judging cost,
    which is not charged to the method."""
    parts = []
    for name, j in section.items():
        c = j.get("cost", {})
        failed = f", {j['failed']} failed" if j.get("failed") else ""
        extra = "".join(f", {k} {v:.4g}" for k, v in j.get("report", {}).items())
        parts.append(
            f"{name} {j['mean']:.4f} over {j['n']} winner(s){failed}{extra} (cost "
            f"{c.get('flops', 0) / 1e9:.1f} GFLOPs, {c.get('tokens', 0)} tokens, {c.get('seconds', 0):.1f}s)"
        )
    return "judges (their cost is not the method's): " + "; ".join(parts)
