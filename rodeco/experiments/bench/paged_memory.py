"""The KV memory of one Speculative Rejection run on the ``fast`` engine and on the ``paged`` engine, at the same
budget: the peak the budget counts (``compute.peak_kv_tokens``: the slots the fast engine allocates; the blocks
some row of the paged engine names) and, for the paged engine, the most its pool held (free blocks included: the
memory its cache took).

    python scripts/paged_memory.py --prompts 8 --n 16 --kv-tokens 6144

The first ``--prompts`` prompts of ``--data`` in one batch, ``--n`` rows each under fixed α 0.5, the ``logprob``
guide (no model of its own), the embedded SmolLM2 in fp32. Prints each engine's figures, then
``paged_over_fast_peak_kv: R`` (the budget's count) and ``paged_pool_over_fast_peak_kv: R`` (the pool's), and writes
them to ``OUT/paged_memory.json``. Memory only: nothing is timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="directory for paged_memory.json")
    ap.add_argument("--data", default="alpacafarm100", help="a data option (conf/data)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=6144, help="budget.kv_tokens, both engines")
    a = ap.parse_args(argv)
    for key in ("prompts", "n", "max_tokens", "kv_tokens"):
        if getattr(a, key) < 1:
            ap.error(f"--{key.replace('_', '-')} {getattr(a, key)}: must be at least 1")
    return a


def engine_generator(base: Any, engine: str) -> Any:
    """A generator of ``base``'s model and tokenizer on ``engine`` that keeps the engines it opens (``opened``)."""
    from rodeco.core.generator import TorchGenerator
    from rodeco.engines import Engine

    class Recording(TorchGenerator):
        opened: list[Engine]

        def new_engine(self) -> Engine:
            e = super().new_engine()
            self.opened.append(e)
            return e

    gen = Recording(
        base.model,
        base.tokenizer,
        chat_template=base.use_chat_template,
        system_prompt=base.system_prompt,
        engine=engine,
        name=base.name,
    )
    gen.opened = []
    return gen


def run(base: Any, engine: str, a: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """One batch on ``engine``: the run's peak as the budget counts it, its decision points, and (paged) the pool."""
    import rodeco

    gen = engine_generator(base, engine)
    out = rodeco.decode(
        texts,
        n=a.n,
        reward="logprob",
        policy="fixed",
        generator=gen,
        overrides=[
            f"budget.kv_tokens={a.kv_tokens}",
            f"sampling.max_new_tokens={a.max_tokens}",
            f"data.batch_prompts={len(texts)}",
            "policy.alpha=0.5",
            "output.progress=false",
        ],
    )
    pool = max((e.pool_tokens for e in gen.opened if hasattr(e, "pool_tokens")), default=None)
    return {
        "peak_kv_tokens": out.compute.peak_kv_tokens,
        "pool_tokens": pool,
        "decision_points": sum(len(r.rounds) for r in out.results),
        "decode_tokens": out.compute.gen_decode_tokens,
    }


def main(argv: list[str] | None = None, generator: Any = None) -> dict[str, Any]:
    """``generator``: a loaded torch generator whose model both engines run (tests); else the config's."""
    import rodeco
    from rodeco.core.loading import load_generator
    from rodeco.tasks import prompts_of

    a = parse(argv)
    cfg = rodeco.load_config([f"data={a.data}", f"data.limit={a.prompts}"])
    texts = [p.text for p in prompts_of(cfg.data)]
    base = generator if generator is not None else load_generator(cfg.generator)
    figures = {e: run(base, e, a, texts) for e in ("fast", "paged")}
    fast, paged = figures["fast"], figures["paged"]
    for e, f in figures.items():
        pool = f" (its pool {f['pool_tokens']})" if f["pool_tokens"] is not None else ""
        print(
            f"{e}: peak {f['peak_kv_tokens']} KV tokens of {a.kv_tokens}{pool}, {f['decision_points']} decision "
            f"points, {f['decode_tokens']} decode tokens"
        )
    ratios = {
        "paged_over_fast_peak_kv": paged["peak_kv_tokens"] / fast["peak_kv_tokens"],
        "paged_pool_over_fast_peak_kv": paged["pool_tokens"] / fast["peak_kv_tokens"],
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    res = {"args": {k: str(v) for k, v in vars(a).items()}, "engines": figures, **ratios}
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "paged_memory.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
