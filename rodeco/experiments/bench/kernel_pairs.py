"""Each of rodeco's native CPU kernels against the path it replaces, paired in one run on this CPU.

The embedded SmolLM2 (or ``--model``) in fp32 (or ``--dtype bfloat16``) on the Llama engine's compiled step, ``--rows``
rows of ``--prompts`` prompts. Each variant below is one compiled step; a round times ``--steps`` decode steps (the step
and the sampling of its tokens, top-k 50) of every variant, in an order that rotates from round to round, so that a pair
of runs shares the machine's load. A kernel's figure is the replacement's time over the kernel's, its geometric mean
over the rounds and a 95% bootstrap CI over them (``engine_bench.paired_runs``); a kernel earns its place at >= 1.10
with the CI's lower end above 1.

- ``attention``: rodeco's paged attention kernel against the torch path it replaces (``native.paged_reference``,
  the step compiled without the kernel);
- ``mkl``: MKL's packed GEMM against oneDNN's prepacked linears, on an Intel CPU only (the only CPU it serves).

The graphs are compiled before the first round (minutes on CPU) and not timed::

    python scripts/kernel_pairs.py --rounds 7 --json kernel_pairs.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "Explain how a bicycle stays upright.",
    "Write a short poem about the sea at night.",
    "What are three tips for learning a new language?",
    "Describe the water cycle to a ten-year-old.",
]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a hub name or directory (default: the embedded SmolLM2)")
    p.add_argument("--rows", type=int, default=64, help="rows in all, spread evenly over the prompts")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--context", type=int, default=96, help="own tokens decoded (untimed) before a round's steps")
    p.add_argument("--steps", type=int, default=32, help="steps timed per variant and round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--only", nargs="*", default=None, help="kernels to pair (default: all that apply here)")
    p.add_argument("--json", default=None, help="write the figures here")
    return p.parse_args(argv)


def _generator(model: str | None, dtype: str) -> Any:
    import rodeco
    from rodeco.core.loading import load_generator

    over = [f"generator.dtype={dtype}", "generator.engine=fast", "generator.compile=false"]
    if model:
        over.append(f"generator.model={model}")
    return load_generator(rodeco.load_config(over).generator)


class Variant:
    """One compiled step with its engine's weights."""

    def __init__(self, gen: Any, weights: Any, step: Any) -> None:
        self.gen, self.weights, self.step = gen, weights, step

    def run(self, ids: list[list[int]], rows: int, context: int, steps: int) -> float:
        """Seconds for ``steps`` steps (step and sampling) of ``rows`` rows, after ``context`` untimed ones."""
        from rodeco.common.sampling import SamplingParams, sample
        from rodeco.engines.fast import LlamaEngine

        gen = self.gen
        eng = LlamaEngine(gen.model, weights=self.weights, compiled=self.step)
        L = max(len(p) for p in ids)
        x = torch.full((len(ids), L), gen.pad_id, dtype=torch.long)
        mask = torch.zeros_like(x)
        for i, p in enumerate(ids):
            x[i, L - len(p) :], mask[i, L - len(p) :] = torch.tensor(p), 1
        logits = eng.admit(x, mask)
        per = rows // len(ids)
        sel = torch.arange(len(ids)).repeat_interleave(per)
        eng.select(sel)
        logits = logits[sel]
        params = SamplingParams(1.0, 50, 1.0)
        u = torch.rand(logits.shape[0], generator=torch.Generator().manual_seed(0))
        t0 = 0.0
        with torch.inference_mode():
            for i in range(context + steps):
                if i == context:
                    t0 = time.perf_counter()
                tok = sample(logits, u, params)
                logits = eng.step(tok)
        return time.perf_counter() - t0


def _variants(gen: Any, a: argparse.Namespace) -> tuple[dict[str, Variant], dict[str, tuple[str, str]], dict[str, str]]:
    """The compiled steps to time ({name: variant}), the kernels to pair ({kernel: (its variant, the replacement's)})
    and the kernels not paired on this CPU ({kernel: why})."""
    from rodeco.common.hardware import cpu_vendor
    from rodeco.engines import native
    from rodeco.engines.compiled import CompiledStep
    from rodeco.engines.fast import LlamaEngine

    model = gen.model
    onednn = LlamaEngine.prepare(model)
    shipped = CompiledStep.of(model, onednn)
    assert shipped.kernel
    variants = {"shipped": Variant(gen, onednn, shipped)}
    pairs: dict[str, tuple[str, str]] = {}
    skipped: dict[str, str] = {}
    want = set(a.only) if a.only else {"attention", "mkl"}
    if a.dtype != "float32":
        want -= {"mkl"}
    if "attention" in want:
        variants["torch_attention"] = Variant(gen, onednn, CompiledStep.of(model, onednn, kernel=False))
        pairs["attention"] = ("shipped", "torch_attention")
    if "mkl" in want:
        if cpu_vendor() != "GenuineIntel" or not native.available("mkl_linear"):
            skipped["mkl"] = f"serves Intel CPUs only; this one is {cpu_vendor()}"
        elif (mkl := LlamaEngine.prepare(model, mkl=True)).linear != "mkl":
            skipped["mkl"] = "MKL's rows depended on the batch on this CPU: oneDNN's are kept"
        else:
            variants["mkl"] = Variant(gen, mkl, CompiledStep.of(model, mkl))
            pairs["mkl"] = ("mkl", "shipped")
    return variants, pairs, skipped


def main(argv: list[str] | None = None) -> int:
    from rodeco.common.hardware import cpu_facts
    from rodeco.engines import native
    from rodeco.experiments.engine_bench import paired_runs

    a = _args(argv)
    torch.manual_seed(0)
    gen = _generator(a.model, a.dtype)
    if not native.available("paged_attention"):
        print("rodeco's kernels cannot be built here: nothing to pair")
        return 1
    variants, pairs, skipped = _variants(gen, a)
    ids = [gen.encode(p) for p in PROMPTS[: a.prompts]]
    names = list(variants)
    t0 = time.perf_counter()
    for n in names:  # compile every graph first (untimed): the first token's and the steady step's
        variants[n].run(ids, a.rows, 2, 2)
        print(f"compiled {n} ({time.perf_counter() - t0:.0f} s so far)", flush=True)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            seconds[n].append(variants[n].run(ids, a.rows, a.context, a.steps))
        print(f"round {r + 1}: " + ", ".join(f"{n} {seconds[n][-1] / a.steps * 1e3:.1f} ms" for n in names), flush=True)
    out: dict[str, Any] = {
        "cpu": cpu_facts(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": a.dtype,
        "rows": a.rows,
        "prompts": a.prompts,
        "context": a.context,
        "steps": a.steps,
        "rounds": a.rounds,
        "ms_per_step": {n: [s / a.steps * 1e3 for s in v] for n, v in seconds.items()},
        "pairs": {},
        "skipped": skipped,
    }
    c = out["cpu"]
    flags = ", ".join(f for f, on in sorted(c["flags"].items()) if on) or "none"
    print(f"cpu: {c['model']} ({flags}); {out['threads']} threads; {a.dtype}; {a.rows} rows of {a.prompts} prompts")
    for k, (ours, theirs) in pairs.items():
        # the replacement's time over the kernel's: > 1 where the kernel is faster
        p = paired_runs(seconds[theirs], seconds[ours])
        keep = p["geomean"] >= 1.10 and p["ci"][0] > 1.0
        out["pairs"][k] = {"kernel": ours, "replacement": theirs, **p, "earns_its_place": keep}
        print(
            f"{k}: {p['geomean']:.3f}x [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}] over {theirs} "
            f"({'keep' if keep else 'below 1.10x with a CI above 1'})"
        )
    for k, why in skipped.items():
        print(f"{k}: not paired here: {why}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
