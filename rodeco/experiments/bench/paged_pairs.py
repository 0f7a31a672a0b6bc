"""The paged cache's decode attention kernel (``rodeco::paged_attention``) against the plain torch path it replaces
(``native.paged_reference``: each row's blocks gathered, then two matmuls), paired in one run on this CPU.

One layer's decode attention of a Best-of-N batch as the paged cache holds it: ``--rows`` rows of ``--prompts``
prompts of ``--prompt-tokens`` tokens, each row ``--own`` tokens of its own, in blocks of ``--block`` tokens. A
prompt's full blocks are shared by its rows; its last, partial block is each row's own copy, where the row's first
tokens follow (as a paged cache copies a shared block on its first write). The blocks are handed out shuffled, as a
pool's free list leaves them after rows come and go. Shapes are SmolLM2-135M's (``--heads`` 9, ``--kv-heads`` 3,
``--head-dim`` 64). A round times ``--calls`` calls of each variant, the order alternating from round to round; the
figure is the torch path's time over the kernel's, its geometric mean over the rounds and a 95% bootstrap CI over
them (``engine_bench.paired_runs``). A kernel earns its place at >= 1.10 with the CI's lower end above 1. For
context (not the pair that decides): rodeco's unpaged kernel (``rodeco::decode_attention``, the compiled step's) and
the fast engine's eager attention on the same tokens, stored unpaged::

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
    p.add_argument("--block", type=int, default=16, help="tokens a block")
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
    full, tail = divmod(a.prompt_tokens, bs)
    per_row = -(-(tail + a.own) // bs)  # the row's own blocks: the prompt's partial block, then its tokens
    N = a.prompts * full + a.rows * per_row
    order = torch.randperm(N, generator=gen)
    shared = order[: a.prompts * full].view(a.prompts, full)
    own = order[a.prompts * full :].view(a.rows, per_row)
    k = a.rows // a.prompts
    tables = torch.cat([shared.repeat_interleave(k, 0), own], dim=1)
    kpool, vpool = torch.randn(N, H, D, bs, generator=gen).to(dt), torch.randn(N, H, bs, D, generator=gen).to(dt)
    first = own[:, 0]
    for r in range(a.rows):  # a row's copy of its prompt's partial block holds that prompt's tokens
        kpool[first[r], :, :, :tail] = kpool[first[r - r % k], :, :, :tail]
        vpool[first[r], :, :tail] = vpool[first[r - r % k], :, :tail]
    return {
        "q": torch.randn(a.rows, H, g, D, generator=gen).to(dt),
        "kpool": kpool,
        "vpool": vpool,
        "tables": tables,
        "lens": torch.full((a.rows,), a.prompt_tokens + a.own, dtype=torch.long),
        "scale": D**-0.5,
    }


def unpaged(a: argparse.Namespace, p: dict[str, Any]) -> dict[str, Any]:
    """The same batch as rodeco's unpaged cache holds it (each prompt once, each row's own tokens), keys by column."""
    B, H, g, D = p["q"].shape
    P, k = a.prompt_tokens, a.rows // a.prompts
    M, bs = p["tables"].shape[1], a.block
    kf = p["kpool"][p["tables"]].permute(0, 2, 1, 4, 3).reshape(B, H, M * bs, D)
    vf = p["vpool"][p["tables"]].permute(0, 2, 1, 3, 4).reshape(B, H, M * bs, D)
    by_col = lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)  # noqa: E731
    return {
        "q": p["q"],
        "kp": by_col(kf[::k, :, :P]),
        "vp": vf[::k, :, :P].contiguous(),
        "grp": torch.arange(B) // k,
        "bias": torch.zeros(a.prompts, P),
        "k": by_col(kf[:, :, P : P + a.own]),
        "v": vf[:, :, P : P + a.own].contiguous(),
        "scale": p["scale"],
    }


def eager(f: dict[str, Any]) -> torch.Tensor:
    """The fast engine's eager attention over the unpaged batch (its even case: each prompt's keys read once for
    its rows in one batched matmul, the rows' own keys by their own)."""
    q, kp, vp, k, v = f["q"], f["kp"], f["vp"], f["k"], f["v"]
    B, H, g, D = q.shape
    G = kp.shape[0]
    n = B // G

    def by_prefix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = x.view(G, n, H, g, -1).transpose(1, 2).reshape(G, H, n * g, -1) @ y
        return r.view(G, H, n, g, -1).transpose(1, 2).reshape(B, H, g, -1)

    s = torch.cat([by_prefix(q, kp.transpose(-1, -2)), q @ k.transpose(-1, -2)], dim=-1).float().mul_(f["scale"])
    p = torch.softmax(s, dim=-1).to(q.dtype)
    P = kp.shape[2]
    return by_prefix(p[..., :P], vp) + p[..., P:] @ v


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
    flat = unpaged(a, p)
    out = native.paged_attention(**p)
    tol = 1e-5 if a.dtype == "float32" else 2e-2
    for other in (native.paged_reference(**p), native.decode_attention(**flat), eager(flat)):
        assert torch.allclose(out.float(), other.float(), atol=tol), "the variants do not compute the same attention"
    variants = {
        "kernel": lambda: native.paged_attention(**p),
        "torch": lambda: native.paged_reference(**p),
        "unpaged_kernel": lambda: native.decode_attention(**flat),
        "unpaged_eager": lambda: eager(flat),
    }
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
        "paged_kernel_over_unpaged_kernel": paired_runs(times["unpaged_kernel"], times["kernel"]),
        "paged_kernel_over_unpaged_eager": paired_runs(times["unpaged_eager"], times["kernel"]),
    }
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1))
    for n, ts in times.items():
        print(f"{n}: {1e3 * sorted(ts)[len(ts) // 2]:.3f} ms a call (median of {len(ts)} rounds)")
    u = figures["paged_kernel_over_unpaged_kernel"]
    e = figures["paged_kernel_over_unpaged_eager"]
    print(f"paged_kernel_over_unpaged_kernel (context): {u['geomean']:.3f} [{u['ci'][0]:.3f}, {u['ci'][1]:.3f}]")
    print(f"paged_kernel_over_unpaged_eager (context): {e['geomean']:.3f} [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}]")
    print(f"paged_kernel_over_torch: {pair['geomean']:.3f} [{pair['ci'][0]:.3f}, {pair['ci'][1]:.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
