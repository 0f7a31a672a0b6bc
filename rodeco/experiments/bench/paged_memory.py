"""The KV memory of one Speculative Rejection batch at a budget, on the engine ``--engine`` selects: the peak the
budget counts (``compute.peak_kv_tokens``: the blocks some row names), the pool the engine took (its blocks, free or
not: the budget, fixed when the session opens), the decision points, and the tokens decoded before the first one
(each prompt's rows at its first decision point times its clock there). With ``--baseline`` (a ``paged_memory.json``
this command wrote, on another checkout or engine) it prints this run's figures over the baseline's.

    python scripts/paged_memory.py --prompts 8 --n 16 --kv-tokens 6144 --out DIR

The first ``--prompts`` prompts of ``--data`` in one batch, ``--n`` rows each under fixed α 0.5, the ``logprob``
guide (no model of its own), the embedded SmolLM2 in fp32. Writes ``OUT/paged_memory.json``. Memory only: nothing is
timed. It reads only rodeco's public API, so the file runs against another checkout too (``PYTHONPATH=CHECKOUT
python rodeco/experiments/bench/paged_memory.py ...``: that checkout's engine, the same measurement).
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
    ap.add_argument("--engine", default="fast", help="generator.engine")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=6144, help="budget.kv_tokens")
    ap.add_argument("--baseline", type=Path, default=None, help="a paged_memory.json to compare with")
    a = ap.parse_args(argv)
    for key in ("prompts", "n", "max_tokens", "kv_tokens"):
        if getattr(a, key) < 1:
            ap.error(f"--{key.replace('_', '-')} {getattr(a, key)}: must be at least 1")
    return a


def engine_generator(base: Any, engine: str) -> Any:
    """A generator of ``base``'s model and tokenizer on ``engine`` that keeps the engines it opens (``opened``)."""
    from rodeco.core.generator import TorchGenerator

    class Recording(TorchGenerator):
        opened: list[Any]

        def new_engine(self, *args: Any, **kw: Any) -> Any:
            e = super().new_engine(*args, **kw)
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


def run(base: Any, a: argparse.Namespace, texts: list[str]) -> dict[str, Any]:
    """One batch: the run's peak as the budget counts it, the engine's pool, its decision points and the tokens
    decoded before the first."""
    import rodeco

    gen = engine_generator(base, a.engine)
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
    first = [r.rounds[0] for r in out.results if r.rounds]
    return {
        "module": rodeco.__file__,
        "engine": type(gen.opened[0]).__name__ if gen.opened else a.engine,
        "peak_kv_tokens": out.compute.peak_kv_tokens,
        "pool_tokens": max((getattr(e, "pool_tokens", 0) for e in gen.opened), default=0) or None,
        "decision_points": sum(len(r.rounds) for r in out.results),
        "decode_tokens": out.compute.gen_decode_tokens,
        "first_decision_clock": [x.tokens_generated for x in first],
        "first_decision_rows": [x.rows_before for x in first],
        "tokens_before_first_decision": sum(x.tokens_generated * x.rows_before for x in first),
    }


def main(argv: list[str] | None = None, generator: Any = None) -> dict[str, Any]:
    """``generator``: a loaded torch generator whose model the engine runs (tests); else the config's."""
    import rodeco
    from rodeco.core.loading import load_generator
    from rodeco.tasks import prompts_of

    a = parse(argv)
    cfg = rodeco.load_config([f"data={a.data}", f"data.limit={a.prompts}"])
    texts = [p.text for p in prompts_of(cfg.data)]
    f = run(generator if generator is not None else load_generator(cfg.generator), a, texts)
    pool = f" (its pool {f['pool_tokens']})" if f["pool_tokens"] is not None else ""
    print(
        f"{f['engine']}: peak {f['peak_kv_tokens']} KV tokens of {a.kv_tokens}{pool}, {f['decision_points']} "
        f"decision points, {f['tokens_before_first_decision']} tokens decoded before the first, "
        f"{f['decode_tokens']} decode tokens"
    )
    res: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}, "figures": f}
    if a.baseline is not None:
        b = json.loads(a.baseline.read_text())["figures"]
        res["baseline"] = b  # the snapshot holds both sides of each ratio
        res["over_baseline"] = {
            "tokens_before_first_decision": f["tokens_before_first_decision"] / b["tokens_before_first_decision"],
            "peak_kv_tokens": f["peak_kv_tokens"] / b["peak_kv_tokens"],
            "decode_tokens": f["decode_tokens"] / b["decode_tokens"],
        }
        for k, v in res["over_baseline"].items():
            print(f"{k}_over_baseline: {v:.3f}")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "paged_memory.json").write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
