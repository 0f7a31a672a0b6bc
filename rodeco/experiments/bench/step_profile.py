"""Where a decode step of the fast engine goes, on this CPU: the layers' matmuls (QKV, O, gate+up, down), the LM
head, attention, sampling over the vocabulary, and the rest (norms, rotary, embedding, cache writes, Python).

The embedded SmolLM2 (or ``--model``) on the fast engine, ``--rows`` rows of ``--prompts`` prompts decoded to
``--context`` tokens, then ``--steps`` steps timed part by part (each part's wall time, read around its calls: on
CPU nothing is queued); the matmuls' rate against the machine's matmul peak in the same dtype (engine_bench's
``matmul_peak_gflops``). Prints the CPU model and its bf16/AMX flags, which decide what bf16 costs::

    python scripts/step_profile.py --dtype float32
    python scripts/step_profile.py --dtype bfloat16 --rows 64 --context 128
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch


class Timer:
    """Wall time of calls, by part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    def wrap(self, part: str, fn: Callable) -> Callable:
        def timed(*a: Any, **kw: Any) -> Any:
            if not self.on:
                return fn(*a, **kw)
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.seconds[part] += time.perf_counter() - t0
            return out

        return timed


def instrument(engine: Any, timer: Timer) -> None:
    for lay in engine.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(lay, name, timer.wrap("matmuls", getattr(lay, name)))
    engine.lm_head = timer.wrap("lm_head", engine.lm_head)
    engine.attention = timer.wrap("attention", engine.attention)


def layer_flops(model: torch.nn.Module) -> tuple[float, float]:
    """FLOPs per token of the layers' matmuls and of the LM head (2 per weight)."""
    layers = sum(p.numel() for p in model.get_submodule("model.layers").parameters() if p.dim() == 2)
    return 2.0 * layers, 2.0 * model.get_parameter("lm_head.weight").numel()


def profile(a: argparse.Namespace) -> dict[str, Any]:
    from rodeco.common.hardware import cpu_facts
    from rodeco.common.sampling import SamplingParams, sample, uniforms
    from rodeco.core.generator import TorchGenerator
    from rodeco.core.loading import load_model_and_tokenizer
    from rodeco.experiments.engine_bench import matmul_peak_gflops

    model, tok = load_model_and_tokenizer(a.model, dtype=a.dtype, device="cpu")
    gen = TorchGenerator(model, tok, engine="fast", name=a.model)
    engine = gen.new_engine()
    timer = Timer()
    instrument(engine, timer)
    per = a.rows // a.prompts
    ids = [gen.encode(f"Write a short story about the number {i}.") for i in range(a.prompts)]
    P = max(map(len, ids))
    inp = torch.full((a.prompts, P), gen.pad_id, dtype=torch.long)
    mask = torch.zeros_like(inp)
    for i, x in enumerate(ids):
        inp[i, P - len(x) :], mask[i, P - len(x) :] = torch.tensor(x), 1
    sp = SamplingParams(1.0, 50, 1.0)
    with torch.inference_mode():
        logits = engine.admit(inp, mask)
        engine.select(torch.arange(a.prompts).repeat_interleave(per))
        keys = np.arange(a.rows, dtype=np.uint64)
        tok_ids = sample(logits.repeat_interleave(per, 0), torch.full((a.rows,), 0.5), sp)
        for t in range(a.context + a.steps):
            if t == a.context:
                timer.on, t0 = True, time.perf_counter()
            logits = engine.step(tok_ids)
            s0 = time.perf_counter()
            u = torch.from_numpy(uniforms(0, keys, t))
            tok_ids = sample(logits, u, sp)
            if timer.on:
                timer.seconds["sampling"] += time.perf_counter() - s0
        total = time.perf_counter() - t0
    parts = dict(timer.seconds)
    parts["rest"] = total - sum(parts.values())
    lf, hf = layer_flops(model)
    peak = matmul_peak_gflops(dtype=model.dtype)
    step = total / a.steps
    out = {
        "cpu": cpu_facts(),
        "dtype": str(model.dtype).replace("torch.", ""),
        "rows": a.rows,
        "prompts": a.prompts,
        "context": a.context,
        "prompt_tokens": P,
        "steps": a.steps,
        "ms_per_step": 1e3 * step,
        "tokens_per_s": a.rows / step,
        "matmul_peak_gflops": peak,
        "parts": {k: {"ms_per_step": 1e3 * v / a.steps, "share": v / total} for k, v in parts.items()},
    }
    for part, flops in (("matmuls", lf), ("lm_head", hf)):
        rate = flops * a.rows * a.steps / max(parts[part], 1e-12) / 1e9
        out["parts"][part].update(gflops=rate, peak_fraction=rate / peak)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a generator.model the fast engine runs (default: embedded)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4, help="prompts the rows decode from (rows divisible by it)")
    ap.add_argument("--context", type=int, default=64, help="tokens decoded before the timed steps")
    ap.add_argument("--steps", type=int, default=32, help="steps timed")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    a = ap.parse_args(argv)
    if a.rows % a.prompts:
        ap.error("--rows must be a multiple of --prompts")
    out = profile(a)
    c = out["cpu"]
    print(
        f"{c['model']}; {c['threads']} threads; "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in c["flags"].items())
    )
    print(
        f"{out['dtype']}: {out['rows']} rows ({out['prompts']} prompts of {out['prompt_tokens']} tokens) at "
        f"{out['context']} generated tokens: {out['ms_per_step']:.1f} ms a step, {out['tokens_per_s']:.0f} tokens/s; "
        f"matmul peak {out['matmul_peak_gflops']:.0f} GFLOP/s"
    )
    for k, v in sorted(out["parts"].items(), key=lambda kv: -kv[1]["ms_per_step"]):
        rate = f"  {v['gflops']:.0f} GFLOP/s ({v['peak_fraction']:.2f} of peak)" if "gflops" in v else ""
        print(f"  {k:<10} {v['ms_per_step']:7.2f} ms  {100 * v['share']:5.1f}%{rate}")
    if a.out is not None:
        a.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
