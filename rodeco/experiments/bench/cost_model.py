"""A cost model (modelled, not measured end to end): GPU-hours and wall time of Best-of-N and Speculative Rejection
on P prompts with an 8B generator and an 8B reward model, sharded over G GPUs. Every input is an argument; the
defaults say which were measured here and which are assumed. The formulas are in docs/scale.md.

    python scripts/cost_model.py                                   # the table in docs/scale.md
    python scripts/cost_model.py --speedup 16 --gpus 1 8 64        # the paper's speedup instead of ours
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

GIB = 2**30


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = ap.add_argument
    a("--prompts", type=int, default=805, help="AlpacaEval's 805 prompts")
    a("--n", type=int, default=120, help="Best-of-N's N")
    a(
        "--prompt-tokens",
        type=float,
        default=None,
        help="mean prompt tokens with the chat template (default: measured on the data root's AlpacaEval prompts "
        "with SmolLM2's tokenizer)",
    )
    a("--response-tokens", type=float, default=450.0, help="ASSUMED mean response tokens of an 8B instruct model")
    a("--max-new-tokens", type=int, default=2048, help="a batch decodes until its longest row ends")
    a("--params", type=float, default=8.0e9, help="generator parameters (Llama-3-8B)")
    a("--rm-params", type=float, default=8.0e9, help="reward model parameters")
    a("--kv-bytes", type=float, default=131072, help="KV bytes per token: 2 x 32 layers x 8 kv heads x 128 x 2 B")
    a("--hbm-gib", type=float, default=141.0, help="ASSUMED GPU: H200 memory")
    a("--bandwidth", type=float, default=4.8e12, help="ASSUMED H200 memory bandwidth, bytes/s")
    a("--flops", type=float, default=989e12, help="ASSUMED H200 dense bf16 FLOP/s")
    a("--bw-efficiency", type=float, default=0.6, help="ASSUMED share of bandwidth a decode step reaches")
    a(
        "--decode-tokens-per-s",
        type=float,
        default=None,
        help="a MEASURED decode rate of one GPU at this batch (rodeco experiment=engine_bench on it) instead of the "
        "roofline model",
    )
    a("--mfu", type=float, default=0.4, help="ASSUMED share of peak FLOP/s of prefill and reward scoring")
    a(
        "--speedup",
        type=float,
        default=2.17,
        help="Speculative Rejection's FLOPs speedup over Best-of-N at equal reward; MEASURED here: 2.17 [1.37, 3.47] "
        "(SmolLM2-135M, minilm_rm, 128 tokens, docs/results.md); the paper reports 16-32x for 8B models",
    )
    a("--startup-s", type=float, default=120.0, help="ASSUMED per shard: start, load both 8B models, warm up")
    a("--gpus", type=int, nargs="+", default=[1, 8, 64])
    a("--json", type=Path, default=None, help="also write the figures here")
    return ap.parse_args()


def mean_prompt_tokens() -> float:
    """Measured: AlpacaEval's 805 prompts through SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer

    from rodeco.core.data import load_prompts
    from rodeco.core.loading import locate
    from rodeco.engines.base import chat_ids

    src, _ = locate("smollm2", None)
    tok = AutoTokenizer.from_pretrained(src, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    prompts = load_prompts("prompts/alpaca_eval_805.jsonl")  # under the data root (RODECO_DATA, ../shared/data)
    n = [len(chat_ids(tok, [{"role": "user", "content": p.text}])) for p in prompts]
    return sum(n) / len(n)


def best_of_n_seconds(a: argparse.Namespace, lp: float) -> dict[str, float]:
    """One GPU's seconds for all prompts with Best-of-N (the formulas of docs/scale.md)."""
    weights = 2 * a.params  # bf16 bytes
    kv_room = a.hbm_gib * GIB - weights - 2 * a.rm_params - 4 * GIB  # both models and 4 GiB of activations
    rows = max(1, int(kv_room // (a.kv_bytes * (lp + a.max_new_tokens))))  # rows that fit at full length
    prompts_per_batch = max(1, rows // a.n)
    b = prompts_per_batch * a.n
    ctx = lp + a.response_tokens / 2  # mean context a decode step reads
    step = (weights + b * ctx * a.kv_bytes) / (a.bw_efficiency * a.bandwidth)
    batches = math.ceil(a.prompts / prompts_per_batch)
    # a batch steps until its longest row ends; rows that end leave, but the weights are read every step
    decode = batches * a.max_new_tokens * weights / (
        a.bw_efficiency * a.bandwidth
    ) + a.prompts * a.n * a.response_tokens * ctx * a.kv_bytes / (a.bw_efficiency * a.bandwidth)
    if a.decode_tokens_per_s:
        decode = a.prompts * a.n * a.response_tokens / a.decode_tokens_per_s
    prefill = 2 * a.params * a.prompts * lp / (a.mfu * a.flops)
    reward = 2 * a.rm_params * a.prompts * a.n * (lp + a.response_tokens) / (a.mfu * a.flops)
    return {
        "rows_per_batch": b,
        "prompts_per_batch": prompts_per_batch,
        "step_ms_full_batch": 1e3 * step,
        "decode_s": decode,
        "prefill_s": prefill,
        "reward_s": reward,
        "total_s": decode + prefill + reward,
    }


def sharded(work_s: float, a: argparse.Namespace, g: int) -> dict[str, float]:
    """G shards, one per GPU: each holds ceil(P/G) or floor(P/G) prompts (strided batches spread long ones)."""
    per_prompt = work_s / a.prompts
    wall = a.startup_s + math.ceil(a.prompts / g) * per_prompt
    return {
        "wall_h": wall / 3600,
        "gpu_h_slurm": (g * a.startup_s + work_s) / 3600,  # an array task gives its GPU back when it ends
        "gpu_h_ray": g * wall / 3600,
    }  # a cluster held until the last shard ends


def main() -> None:
    a = parse()
    lp = a.prompt_tokens if a.prompt_tokens is not None else mean_prompt_tokens()
    bon = best_of_n_seconds(a, lp)
    methods = {"Best-of-N": bon["total_s"], "Speculative Rejection (modelled)": bon["total_s"] / a.speedup}
    print(
        f"inputs: {a.prompts} prompts, N={a.n}, mean prompt {lp:.1f} tokens, mean response "
        f"{a.response_tokens:g} (max {a.max_new_tokens}), speedup {a.speedup:g}"
    )
    print(
        f"Best-of-N on one GPU: {bon['prompts_per_batch']} prompts x {a.n} rows per batch, "
        f"{bon['step_ms_full_batch']:.1f} ms per full step; decode {bon['decode_s'] / 3600:.2f} h, "
        f"prefill {bon['prefill_s'] / 3600:.3f} h, reward {bon['reward_s'] / 3600:.2f} h"
    )
    print("| method | GPUs | wall (h) | GPU-hours, SLURM array | GPU-hours, Ray cluster held |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name, work in methods.items():
        for g in a.gpus:
            s = sharded(work, a, g)
            rows.append({"method": name, "gpus": g, **s})
            print(f"| {name} | {g} | {s['wall_h']:.2f} | {s['gpu_h_slurm']:.2f} | {s['gpu_h_ray']:.2f} |")
    if a.json is not None:
        a.json.write_text(
            json.dumps(
                {
                    "mean_prompt_tokens": lp,
                    "best_of_n_one_gpu": bon,
                    "rows": rows,
                    "args": {k: str(v) for k, v in vars(a).items()},
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
