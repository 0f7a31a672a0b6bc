"""Speculative Rejection against Best-of-N inside one engine, at equal memory, in measured wall time: vLLM (the
default) or rodeco's own engines (``--engine fast`` or ``hf``).

The engine gets a KV pool the size of Best-of-``--memory-of``'s memory (for the longest prompt). On each prompt, in
one process and alternating the order:

1. Speculative Rejection (``policy=fixed``, α = ``--alpha``, ``n=auto``) decodes live within the pool;
2. Best-of-N, for each N of ``--bon``: on vLLM it submits its N requests to the same engine and pool and lets
   vLLM's scheduler run them as memory frees (preempting where it must), the baseline a vLLM user has today; on
   rodeco's engines, whose budget a batch never exceeds, it runs in waves of ``--memory-of`` rows (N / memory-of
   decodes of independent samples, seeds 0, 1, ...; its reward is the best of all of them, its time their sum).

A method's time is its decode's wall time: prefill, decode, every reward call, pruning (``compute.time_s``; loading
models is not in it). The speedup is Best-of-N's total time over Speculative Rejection's, with a bootstrap 95% CI
over prompts; each method's mean final reward says which N matches Speculative Rejection's. Run it in the vLLM
environment::

    .venv-vllm/bin/python scripts/vllm_bench.py --prompts 16 --bon 32,64 --out runs/vllm_bench
    python scripts/vllm_bench.py --engine fast --dtype bfloat16 --prompts 16 --bon 8,16 --out runs/live_bf16
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rodeco.experiments.bootstrap import ratio_of_sums


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="the first K prompts of --data")
    ap.add_argument("--data", default="alpacafarm100", help="a data option (conf/data)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--memory-of", type=int, default=4, help="the pool: Best-of-this's memory at full length")
    ap.add_argument("--bon", default="32,64", help="Best-of-N's N, comma-separated")
    ap.add_argument("--reward", default="minilm_rm")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--eager", action="store_true", help="generator.enforce_eager (starts fast; decodes slower)")
    ap.add_argument(
        "--engine",
        default="vllm",
        choices=["vllm", "fast", "hf"],
        help="vllm, or rodeco's own engine (Best-of-N in waves of --memory-of rows)",
    )
    ap.add_argument("--compile", default="auto", help="generator.compile (fast engine)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", type=Path, default=None, help="write vllm_bench.json here (prompt by prompt)")
    ap.add_argument("--resume", action="store_true", help="keep the prompts --out already holds (same arguments)")
    return ap.parse_args(argv)


def methods(a: argparse.Namespace, pool: int) -> dict[str, list[list[str]]]:
    """Each method's decodes of one prompt (one list of overrides each: Best-of-N on rodeco's engines is waves)."""
    if a.engine == "vllm":
        out = {"sr": [["policy=fixed", f"policy.alpha={a.alpha}", "n=auto", "budget=engine"]]}
        for n in [int(x) for x in a.bon.split(",") if x]:
            out[f"bon_{n}"] = [["policy=none", f"n={n}", "budget.kv_tokens=1000000000"]]  # vLLM's scheduler decides
        return out
    mem = ["budget=cpu", f"budget.kv_tokens={pool}"]
    out = {"sr": [["policy=fixed", f"policy.alpha={a.alpha}", "n=auto", *mem]]}
    for n in [int(x) for x in a.bon.split(",") if x]:
        if n % a.memory_of:
            sys.exit(f"--bon {n}: Best-of-N runs in waves of --memory-of={a.memory_of} rows; use a multiple of it")
        out[f"bon_{n}"] = [["policy=none", f"n={a.memory_of}", f"seed={w}", *mem] for w in range(n // a.memory_of)]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    import rodeco
    from rodeco.tasks import prompts_of

    base = [
        f"generator.model={a.model}",
        f"generator.engine={a.engine}",
        f"generator.dtype={a.dtype}",
        *(
            [f"generator.enforce_eager={str(a.eager).lower()}"]
            if a.engine == "vllm"
            else [f"generator.compile={a.compile}"]
        ),
        f"sampling.max_new_tokens={a.new_tokens}",
        f"reward={a.reward}",
    ]
    prompts = prompts_of(rodeco.load_config([f"data={a.data}", f"data.limit={a.prompts}"]).data)
    gen, pool, longest = _sized(a, base, prompts)
    print(
        f"{a.engine} KV pool: {pool} tokens (Best-of-{a.memory_of}'s memory for the longest prompt, "
        f"{longest} tokens, at {a.new_tokens} new tokens; block {gen.kv.block})",
        flush=True,
    )
    ms = methods(a, pool)
    rows = _run(a, rodeco, gen, base, prompts, ms, pool)
    summary = _summary(a, rows, ms, pool, gen.kv.block)
    _report(summary)
    if a.out is not None:
        _write(a.out, {"args": vars(a) | {"out": str(a.out)}, "pool_tokens": pool, "rows": rows, "summary": summary})
    return summary


def _sized(a: argparse.Namespace, base: list[str], prompts: list[Any]) -> tuple[Any, int, int]:
    """The generator with its KV pool, the pool's tokens (Best-of-``--memory-of``'s memory at full length), and
    the longest prompt's tokens."""
    import rodeco
    from rodeco.common.budget import KVSpec, full_length_tokens
    from rodeco.common.hardware import cuda_available
    from rodeco.core.loading import load_generator, weights
    from rodeco.engines.vllm import default_block

    if a.engine != "vllm":  # rodeco's engines: the generator's own encoding (its chat template, if any) sizes it
        gen = load_generator(rodeco.load_config(base).generator)
        longest = max(len(gen.encode(p.text)) for p in prompts)
        return gen, full_length_tokens(a.memory_of, longest, a.new_tokens, gen.kv), longest
    from transformers import AutoTokenizer  # vLLM's pool is set when it loads: the prompts' lengths first

    tok = AutoTokenizer.from_pretrained(weights(a.model, None)[0])
    longest = max(_chat_tokens(tok, p.text) for p in prompts)
    kv = KVSpec(shares_prefix=True, block=default_block(cuda_available()))
    gen = load_generator(
        rodeco.load_config(
            [*base, f"generator.kv_cache_tokens={full_length_tokens(a.memory_of, longest, a.new_tokens, kv)}"]
        ).generator
    )
    pool = gen.info.kv_pool_tokens
    assert pool is not None  # vLLM's engine sets its pool's size when it loads
    return gen, pool, longest


def _chat_tokens(tok: Any, text: str) -> int:
    """The tokens of ``text`` as a user's message in the tokenizer's chat template, with the assistant's turn."""
    from rodeco.engines.base import chat_ids

    return len(chat_ids(tok, [{"role": "user", "content": text}]))


def _run(
    a: argparse.Namespace,
    rodeco: Any,
    gen: Any,
    base: list[str],
    prompts: list[Any],
    ms: dict[str, list[list[str]]],
    pool: int,
) -> list[dict[str, Any]]:
    """Every method on each prompt not done yet (alternating their order), printed and written prompt by prompt;
    the rows of every prompt."""
    rows = _done(a, pool)
    for k, p in enumerate(prompts):
        if any(r["prompt_index"] == p.index for r in rows):
            continue
        order = list(ms) if k % 2 == 0 else list(ms)[::-1]
        row: dict[str, Any] = {"prompt_index": p.index}
        for m in order:
            row[m] = _measure(rodeco, gen, p.text, base, ms[m])
        rows.append(row)
        print(
            f"prompt {p.index}: "
            + ", ".join(
                f"{m} {row[m]['seconds']:.1f}s r={row[m]['reward']:.3f} pre={row[m]['preemptions']}" for m in ms
            ),
            flush=True,
        )
        if a.out is not None:
            _write(a.out, {"args": vars(a) | {"out": str(a.out)}, "pool_tokens": pool, "rows": rows})
    return rows


def _summary(
    a: argparse.Namespace, rows: list[dict[str, Any]], ms: dict[str, list[list[str]]], pool: int, block: int
) -> dict[str, Any]:
    """Each method's mean reward, seconds, preemptions and decode tokens over the prompts, and Best-of-N's
    wall-time speedup of Speculative Rejection over it (bootstrap 95% CI over prompts)."""
    sr = np.array([r["sr"]["seconds"] for r in rows])
    summary: dict[str, Any] = {
        "prompts": len(rows),
        "pool_tokens": pool,
        "kv_block": block,
        "memory_of": a.memory_of,
        "engine": a.engine,
        "methods": {},
    }
    for m in ms:
        secs = np.array([r[m]["seconds"] for r in rows])
        s: dict[str, Any] = {
            "mean_reward": float(np.mean([r[m]["reward"] for r in rows])),
            "seconds": float(secs.sum()),
            "preemptions": int(sum(r[m]["preemptions"] for r in rows)),
            "decode_tokens": int(sum(r[m]["decode_tokens"] for r in rows)),
        }
        if m != "sr":
            s["speedup_vs_sr"] = ratio_of_sums(secs, sr, a.bootstrap)
        summary["methods"][m] = s
    return summary


def _report(summary: dict[str, Any]) -> None:
    for m, s in summary["methods"].items():
        extra = (
            f", wall-time speedup of SR over it {s['speedup_vs_sr'][0]:.2f}x [{s['speedup_vs_sr'][1]:.2f}, "
            f"{s['speedup_vs_sr'][2]:.2f}]"
            if "speedup_vs_sr" in s
            else ""
        )
        print(
            f"{m}: mean reward {s['mean_reward']:.4f}, {s['seconds']:.1f} s, {s['decode_tokens']} decode tokens, "
            f"{s['preemptions']} preemptions{extra}"
        )


def _measure(rodeco: Any, gen: Any, prompt: str, base: list[str], decodes: list[list[str]]) -> dict[str, Any]:
    """One method on one prompt: its decodes (one, or Best-of-N's waves) summed; the reward is the best of them."""
    t0 = time.perf_counter()
    outs = [rodeco.decode([prompt], generator=gen, overrides=[*base, *d]) for d in decodes]
    cs, best = [o.compute for o in outs], [o.results[0] for o in outs]
    times: dict[str, float] = {}
    for c in cs:
        for k, v in c.time_s.items():
            times[k] = times.get(k, 0.0) + v
    return {
        "seconds": sum(times.values()),
        "wall_with_setup": time.perf_counter() - t0,
        "reward": max(r.best.score for r in best),
        "n_start": sum(r.n_start for r in best),
        "decode_tokens": sum(c.gen_decode_tokens for c in cs),
        "preemptions": sum(c.preemptions for c in cs),
        "peak_kv_tokens": max(c.peak_kv_tokens for c in cs),
        "time_s": times,
        "decodes": len(decodes),
    }


def _done(a: argparse.Namespace, pool: int) -> list[dict[str, Any]]:
    """The rows an earlier run with the same arguments and pool wrote to ``--out`` (with ``--resume``)."""
    f = a.out / "vllm_bench.json" if a.out is not None else None
    if not a.resume or f is None or not f.is_file():
        return []
    old = json.loads(f.read_text())
    now = json.loads(json.dumps(vars(a) | {"out": str(a.out)}, default=str))
    if {k: v for k, v in old["args"].items() if k != "resume"} != {k: v for k, v in now.items() if k != "resume"}:
        sys.exit(f"--resume: {f} was written with other arguments: {old['args']}")
    if old.get("pool_tokens") != pool:
        sys.exit(f"--resume: {f} was measured with a pool of {old.get('pool_tokens')} tokens, not {pool}")
    return old["rows"]


def _write(out: Path, obj: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".vllm_bench.json.tmp"
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    tmp.replace(out / "vllm_bench.json")


if __name__ == "__main__":
    main()
