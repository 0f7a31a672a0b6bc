"""The paged cache's decode attention kernel (``rodeco::paged_attention``) against the plain torch path it replaces
(``native.paged_reference``: each row's blocks gathered, then two matmuls), paired in one run on this CPU.

One layer's decode attention of a Best-of-N batch as the Llama engine holds it: ``--rows`` rows of ``--prompts``
prompts of ``--prompt-tokens`` tokens, each row ``--own`` tokens of its own, in blocks of ``--block`` tokens (by
default the engine's, ``native.WIDTH``). A prompt ends on a block boundary (its first block padded at the front,
the padding skipped), its blocks shared by its rows; each row's own tokens fill blocks of its own. The blocks are
handed out shuffled, as a pool's free list leaves them after rows come and go. Shapes are SmolLM2-135M's
(``--heads`` 9, ``--kv-heads`` 3, ``--head-dim`` 64). A round times ``--calls`` calls of each variant, the order
alternating from round to round; the figure is the torch path's time over the kernel's, its geometric mean over the
rounds and a 95% bootstrap CI over them (``engine_bench.paired_runs``). A kernel earns its place at >= 1.10 with the
CI's lower end above 1::

    python scripts/paged_pairs.py --rounds 7 --json paged_pairs.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rodeco.common.hardware import cpu_facts
from rodeco.engines import native
from rodeco.experiments.engine_bench import paired_runs


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=51, help="each prompt's tokens (AlpacaFarm's median)")
    p.add_argument("--own", type=int, default=64, help="each row's own tokens")
    p.add_argument("--block", type=int, default=native.WIDTH, help="tokens a block (default: the engine's)")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--calls", type=int, default=60, help="calls timed per variant and round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None, help="write the figures here")
    return p.parse_args(argv)


def cache(a: argparse.Namespace) -> dict[str, Any]:
    """The paged inputs (``native.paged_attention``'s keywords) of the batch the arguments describe."""
    dt = getattr(torch, a.dtype)
    gen = torch.Generator().manual_seed(0)
    H, g, D, bs = a.kv_heads, a.heads // a.kv_heads, a.head_dim, a.block
    shared = -(-a.prompt_tokens // bs)  # a prompt's blocks, whole: its first padded at the front
    per_row = -(-a.own // bs)  # the row's own blocks
    N = a.prompts * shared + a.rows * per_row
    order = torch.randperm(N, generator=gen)
    prompt = order[: a.prompts * shared].view(a.prompts, shared)
    own = order[a.prompts * shared :].view(a.rows, per_row)
    tables = torch.cat([prompt.repeat_interleave(a.rows // a.prompts, 0), own], dim=1)
    pad = shared * bs - a.prompt_tokens
    return {
        "q": torch.randn(a.rows, H, g, D, generator=gen).to(dt),
        "kpool": torch.randn(N, H, D, bs, generator=gen).to(dt),
        "vpool": torch.randn(N, H, bs, D, generator=gen).to(dt),
        "tables": tables,
        "lens": torch.full((a.rows,), pad + a.prompt_tokens + a.own, dtype=torch.long),
        "starts": torch.full((a.rows,), pad, dtype=torch.long),
        "scale": D**-0.5,
    }


def timed(fn: Callable[[], Any], calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if not native.available("paged_attention"):
        print("paged_pairs: rodeco's native kernels cannot be built here")
        return 1
    p = cache(a)
    out = native.paged_attention(**p)
    tol = 1e-5 if a.dtype == "float32" else 2e-2
    assert torch.allclose(out.float(), native.paged_reference(**p).float(), atol=tol), "the two do not agree"
    variants = {"kernel": lambda: native.paged_attention(**p), "torch": lambda: native.paged_reference(**p)}
    times: dict[str, list[float]] = {n: [] for n in variants}
    with torch.inference_mode():
        for r in range(a.rounds):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for n in names:
                times[n].append(timed(variants[n], a.calls))
    pair = paired_runs(times["torch"], times["kernel"])
    c = cpu_facts()
    figures = {
        "cpu": c["model"],
        "flags": sorted(f for f, on in c["flags"].items() if on),
        "threads": torch.get_num_threads(),
        "args": vars(a),
        "ms_per_call": {n: [1e3 * t for t in ts] for n, ts in times.items()},
        "paged_kernel_over_torch": pair,
    }
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1))
    for n, ts in times.items():
        print(f"{n}: {1e3 * sorted(ts)[len(ts) // 2]:.3f} ms a call (median of {len(ts)} rounds)")
    print(f"paged_kernel_over_torch: {pair['geomean']:.3f} [{pair['ci'][0]:.3f}, {pair['ci'][1]:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
