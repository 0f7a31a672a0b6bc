"""The one command that proves rodeco's CUDA paths the first time a GPU is at hand (about 8 minutes on one GPU).

    python scripts/gpu_check.py                       # bf16 on cuda, the embedded SmolLM2; report in gpu_check/
    python scripts/gpu_check.py --out DIR --model smollm2 --steps greedy,survivors
    python scripts/gpu_check.py --device cpu --quick  # the same logic on CPU with tiny sizes (to test the script)

Steps (each timed and recorded; one that fails does not stop the others; a global time limit skips what is left):

1. ``greedy``: both torch engines (``fast``, ``hf``) greedy-decode in the dtype against ``model.generate()``; per
   prompt, exact or the first token where they part.
2. ``survivors``: Speculative Rejection (``fixed`` alpha 0.5 under a budget that forces rejections) against
   Best-of-N with the same seed: every survivor is the Best-of-N sample with its id, every rejected one a prefix
   (``vllm`` too where installed: ``.venv-vllm/bin/python``; SR vs Best-of-N in time inside vLLM: vllm_bench.py).
3. ``engine_bench``: ``rodeco experiment=engine_bench`` in the dtype on the device (rodeco vs ``generate()``), the
   fast engine eager and compiled (``generator.compile=true``, its compile time apart; the goal on CUDA: the
   compiled engine at >= 2x ``generate()`` in bf16 at batch 64).
4. ``syncs``: the fast engine's steady decode steps (eager and compiled) under ``torch.cuda.set_sync_debug_mode(
   "error")`` with the draws on the device and the finished count a step late (CUDA's default): no step may wait
   for the device; the same tokens as with the exact count and numpy's draws, and tokens/s of both.
5. ``efficiency``: Speculative Rejection against Best-of-N at equal memory in the memory-bound regime on AlpacaFarm
   prompts (``scripts/vllm_bench.py --engine fast``: SR within Best-of-4's memory, Best-of-N in N / 4 waves), both
   live with measured wall times, SR's speedup over each N with a bootstrap CI over prompts (the goal on CUDA:
   >= 2x at matched reward).
6. ``budget``: a run whose budget comes from free CUDA memory (``budget=cuda``, ``n=auto``, each row charged its
   working memory); the peak KV bytes stay within that budget, and the peak allocated memory above the weights is
   reported against the memory the budget was given (goal: at most 1.1 times).
7. ``oom``: a real out-of-memory error (the process is capped with ``set_per_process_memory_fraction`` and the
   budget asks for more); the run backs off, finishes, and equals a run started at the settings it backed off to.

Writes ``gpu_check.json`` and ``gpu_check.md`` in ``--out``. Without CUDA (and ``--device cuda``) it says so in
both and exits 0. Exit 1 when a step failed its check.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rodeco.common.hardware import cuda_available, cuda_devices, is_cuda, synchronize
from rodeco.experiments.bench.gpu_report import environment, markdown, write_report  # the report's JSON and Markdown

# the engine figures first (engine_bench, syncs, efficiency): the time limit skips what is left, budget and oom
# were measured on a GPU before
STEPS = ("greedy", "survivors", "engine_bench", "syncs", "efficiency", "budget", "oom")
PROMPTS = [
    "Give three tips for staying healthy.",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn.",
    "What are the names of some famous actors that started on Broadway?",
]
log = logging.getLogger("gpu_check")


@dataclass
class Sizes:
    """How big each step runs: full on a GPU, tiny with --quick."""

    new_tokens: int = 64
    rows: int = 16  # Best-of-N / SR start rows in the survivors step
    bench_batch: int = 64
    bench_tokens: int = 64
    bench_repeats: int = 3
    eff_prompts: int = 8
    eff_bon: tuple[int, ...] = (8, 16, 32)  # Best-of-N in N / 4 waves
    budget_fraction: float = 0.05  # of free memory, in the budget step (n=auto fills it)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            new_tokens=12,
            rows=6,
            bench_batch=8,
            bench_tokens=8,
            bench_repeats=1,
            eff_prompts=2,
            eff_bon=(4, 8),
            budget_fraction=0.05,
        )


@dataclass
class Check:
    args: argparse.Namespace
    sizes: Sizes
    deadline: float
    report: dict[str, Any] = field(default_factory=dict)
    _gens: dict[str, Any] = field(default_factory=dict)

    def overrides(self, engine: str = "auto") -> list[str]:
        return [
            f"generator.model={self.args.model}",
            f"generator.engine={engine}",
            f"generator.dtype={self.args.dtype}",
            f"generator.device={self.args.device}",
            "reward=logprob",
            "output.progress=false",
        ]

    def generator(self, engine: str, *extra: str):
        """The generator for one engine (and ``extra`` generator overrides), loaded once (the fast engine and hf share
        nothing but the weights' file)."""
        key = ",".join((engine, *extra))
        if key not in self._gens:
            import rodeco
            from rodeco.core.loading import load_generator

            self._gens[key] = load_generator(rodeco.load_config([*self.overrides(engine), *extra]).generator)
        return self._gens[key]

    def decode(self, prompts: list[str], engine: str, overrides: list[str], **kw):
        import rodeco

        sync(self.args.device)
        t0 = time.perf_counter()
        out = rodeco.decode(
            prompts, generator=self.generator(engine), overrides=[*self.overrides(engine), *overrides], **kw
        )
        sync(self.args.device)
        return out, time.perf_counter() - t0


def sync(device: str) -> None:
    synchronize(cuda_devices(device))


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (or one ends early); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def step_greedy(c: Check) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for engine in ("fast", "hf"):
        gen = c.generator(engine)
        res, _ = c.decode(
            PROMPTS,
            engine,
            [
                "policy=none",
                "budget=unlimited",
                "sampling.temperature=0",
                f"sampling.max_new_tokens={c.sizes.new_tokens}",
            ],
            n=1,
        )
        parts = []
        for p, r in zip(PROMPTS, res.results):
            ids = torch.tensor([gen.encode(p)], device=gen.device)
            ref = gen.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=c.sizes.new_tokens,
                eos_token_id=gen.eos_ids,
                pad_token_id=gen.pad_id,
            )[0, ids.shape[1] :].tolist()
            ref = ref[: next((i for i, t in enumerate(ref) if t in gen.eos_ids), len(ref))]
            parts.append(first_divergence(list(r.best.token_ids), ref))
        out[engine] = {"prompts": len(PROMPTS), "exact": sum(d is None for d in parts), "first_divergence": parts}
    out["ok"] = all(out[e]["exact"] == len(PROMPTS) for e in ("fast", "hf"))
    out["note"] = (
        "a bf16 divergence is round-off between two different kernels' orders, not a logic error, when "
        "the survivors step (same kernels on both sides) is exact"
    )
    return out


def step_survivors(c: Check) -> dict[str, Any]:
    from rodeco.common.budget import Budget

    out: dict[str, Any] = {}
    n, new = c.sizes.rows, c.sizes.new_tokens
    engines = ("fast", "hf", *(("vllm",) if importlib.util.find_spec("vllm") else ()))  # vllm: in .venv-vllm
    for engine in engines:
        gen = c.generator(engine)
        lens = [len(gen.encode(p)) for p in PROMPTS[:2]]
        B, base = Budget(10**12).for_batch(lens, gen.kv)
        assert B.kv_tokens is not None  # a finite budget's share is finite
        shared = (10**12 - B.kv_tokens) // 2
        first = base + max(8, new // 3) if gen.kv.block == 1 else base + 1  # vLLM: one block a row, then decide
        kv = 2 * (shared + n * B.held(first))  # every row fits the first round, not the end: SR rejects
        common = [f"sampling.max_new_tokens={new}", "output.all_candidates=true", "sampling.ignore_eos=false"]
        bon, _ = c.decode(PROMPTS[:2], engine, ["policy=none", "budget=unlimited", *common], n=n)
        sr, _ = c.decode(
            PROMPTS[:2],
            engine,
            ["policy=fixed", "policy.alpha=0.5", f"budget.kv_tokens={kv}", "budget.min_tokens_per_round=4", *common],
            n=n,
        )
        out[engine] = {
            **compare_survivors(bon.results, sr.results),
            "peak_kv_tokens": sr.compute.peak_kv_tokens,
            "budget_kv_tokens": kv,
            "within_budget": sr.compute.peak_kv_tokens <= kv,
            "can_decide": B.held(base + new) > B.held(first),
        }
    out["ok"] = all(
        out[e]["mismatches"] == 0 and out[e]["within_budget"] and (out[e]["rejected"] > 0 or not out[e]["can_decide"])
        for e in engines
    )
    return out


def compare_survivors(bon: list, sr: list) -> dict[str, int]:
    """SR's finished candidates against the Best-of-N sample with the same id (equal), its rejected ones against
    that sample's prefix."""
    same = prefix = rejected = wrong = 0
    for x, y in zip(bon, sr):
        full = {k.candidate_id: list(k.token_ids) for k in x.candidates}
        for k in y.candidates:
            ids, want = list(k.token_ids), full[k.candidate_id]
            if not k.finished:
                rejected += 1
                want = want[: len(ids)]
                prefix += want == ids
            same += k.finished and ids == want
            wrong += ids != want
    return {"survivors_equal": same, "rejected": rejected, "rejected_prefix": prefix, "mismatches": wrong}


def cuda_fast(c: Check):
    """torch and the fast engine's generator, with the CUDA cache emptied: a memory step starts from the weights."""
    import torch

    gen = c.generator("fast")
    torch.cuda.empty_cache()
    return torch, gen


def step_budget(c: Check) -> dict[str, Any]:
    if not is_cuda(c.args.device):
        return {"skipped": "needs CUDA (the budget comes from free CUDA memory)"}
    torch, gen = cuda_fast(c)
    free, total = torch.cuda.mem_get_info(gen.device)
    base = torch.cuda.memory_allocated(gen.device)
    torch.cuda.reset_peak_memory_stats(gen.device)
    frac = c.sizes.budget_fraction
    res, secs = c.decode(
        PROMPTS[:1],
        "fast",
        [
            "policy=fixed",
            "budget=cuda",
            f"budget.memory_fraction={frac}",
            f"sampling.max_new_tokens={c.sizes.new_tokens}",
        ],
        n="auto",
    )
    from rodeco.common.budget import budget_from_device

    kv = budget_from_device(free, gen.kv_bytes_per_token, frac, int(2.0 * 2**30))
    peak = torch.cuda.max_memory_allocated(gen.device) - base
    r = res.results[0]
    given = kv * gen.kv_bytes_per_token  # what the budget may hold: KV and each row's working memory
    out = {
        "free_gib": free / 2**30,
        "total_gib": total / 2**30,
        "memory_fraction": frac,
        "budget_kv_tokens": kv,
        "budget_gib": given / 2**30,
        "rows_started": r.n_start,
        "peak_kv_tokens": res.compute.peak_kv_tokens,
        "peak_kv_gib": res.compute.peak_kv_bytes / 2**30,
        "peak_allocated_above_weights_gib": peak / 2**30,
        "peak_over_budget": peak / given,
        "seconds": secs,
        "kv_within_budget": res.compute.peak_kv_tokens <= kv,
        "allocated_within_free": peak <= free,
        "goal_peak_at_most_1.1x_budget": peak <= 1.1 * given,
    }
    out["ok"] = out["kv_within_budget"] and out["allocated_within_free"]
    return out


def step_oom(c: Check) -> dict[str, Any]:
    if not is_cuda(c.args.device):
        return {"skipped": "needs CUDA (a real out-of-memory error)"}
    torch, gen = cuda_fast(c)
    _, total = torch.cuda.mem_get_info(gen.device)
    weights = torch.cuda.memory_allocated(gen.device)
    cap = weights + int(3 * 2**30)  # the process may hold the weights and 3 GiB more
    kv = int(6 * 2**30 // gen.kv_bytes_per_token)  # a budget that asks for 6 GiB of KV cache
    ov = [
        "policy=fixed",
        f"budget.kv_tokens={kv}",
        "data.batch_prompts=2",
        f"sampling.max_new_tokens={c.sizes.new_tokens}",
        "sampling.ignore_eos=true",
        "budget.min_tokens_per_round=64",
    ]  # n=auto: rows' KV, not logits, fill it
    torch.cuda.set_per_process_memory_fraction(cap / total, gen.device)
    logs: list[str] = []
    handler = _Collect(logs)
    logging.getLogger("rodeco.common.backoff").addHandler(handler)
    try:
        faulted, secs = c.decode(PROMPTS, "fast", ov, n="auto")
    finally:
        logging.getLogger("rodeco.common.backoff").removeHandler(handler)
        torch.cuda.set_per_process_memory_fraction(1.0, gen.device)
        torch.cuda.empty_cache()
    halvings = sum("budget.kv_tokens" in m for m in logs)
    final_kv = max(1, int(kv * 0.5**halvings))
    batch = 1 if any("data.batch_prompts -> 1" in m for m in logs) else 2
    direct, _ = c.decode(
        PROMPTS, "fast", [*ov[:1], f"budget.kv_tokens={final_kv}", f"data.batch_prompts={batch}", *ov[3:]], n="auto"
    )
    same = [list(a.best.token_ids) == list(b.best.token_ids) for a, b in zip(faulted.results, direct.results)]
    out = {
        "cap_gib": cap / 2**30,
        "asked_kv_gib": kv * gen.kv_bytes_per_token / 2**30,
        "backoff_warnings": logs,
        "seconds": secs,
        "final_batch_prompts": batch,
        "final_kv_tokens": final_kv,
        "prompts_finished": len(faulted.results),
        "same_winners_as_a_run_at_the_final_settings": sum(same),
    }
    out["ok"] = bool(logs) and len(faulted.results) == len(PROMPTS) and all(same)
    return out


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


def step_syncs(c: Check) -> dict[str, Any]:
    """The fast engine's steady steps, eager and compiled (CUDA; eager only on CPU), twice from one prefill state:
    with the exact finished count and numpy's draws copied in each step (as on CPU), and with the draws on the device
    and the count a step late (``Session.device_uniforms``, ``lag_finished``: CUDA's default). The tokens must be
    equal; the second runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises at any step that makes
    the host wait for the device (a scalar read, a blocking copy); tokens/s of both."""
    import torch

    from rodeco.common.sampling import SamplingParams
    from rodeco.common.state import OpenPrompt, SessionSpec

    cuda, s = is_cuda(c.args.device), c.sizes
    warm, steps = 8, s.bench_tokens
    end = warm + steps
    out: dict[str, Any] = {"rows": s.bench_batch, "steady_steps": steps}
    for label, extra in (("fast", "generator.compile=false"), ("fast-compiled", "generator.compile=true"))[: 1 + cuda]:
        gen = c.generator("fast", extra)
        ids = [gen.encode(p) for p in PROMPTS[:2]]
        res: dict[str, Any] = {}
        toks = []
        for lagged in (False, True):
            sess = gen.open_session(SessionSpec(ignore_eos=True))  # no row leaves before ``end``
            sess.device_uniforms = sess.lag_finished = lagged
            sampling = SamplingParams(1.0, 50, 1.0)
            sess.admit(ids, [OpenPrompt(s.bench_batch // 2, end + 1, sampling, 0, k) for k in (0, 1)])
            sess.decode(end + 1, pause=warm)  # shapes compiled, the draw keys uploaded
            sync(c.args.device)
            err, t0 = None, time.perf_counter()
            if cuda and lagged:
                torch.cuda.set_sync_debug_mode("error")
            try:
                sess.decode(end + 1, pause=end)
                sync(c.args.device)
            except RuntimeError as e:  # a step that waits for the device, named by the error
                err = f"{e}"[:800]
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
            secs = time.perf_counter() - t0
            toks.append(sess.out[:, :end].cpu())
            res["lagged" if lagged else "exact"] = {"tokens_per_s": sess.rows * steps / secs, "sync_error": err}
        res["same_tokens"] = bool(torch.equal(*toks))
        res["lagged_over_exact"] = res["lagged"]["tokens_per_s"] / res["exact"]["tokens_per_s"]
        out[label] = res
    out["sync_debug"] = (
        "torch.cuda.set_sync_debug_mode('error') on the lagged runs"
        if cuda
        else "needs CUDA: on CPU the same decode runs without it"
    )
    out["ok"] = all(
        out[k]["same_tokens"] and out[k]["lagged"]["sync_error"] is None for k in ("fast", "fast-compiled") if k in out
    )
    return out


def step_engine_bench(c: Check) -> dict[str, Any]:
    import rodeco

    s = c.sizes
    cfg = rodeco.load_config(
        [
            "experiment=engine_bench",
            *c.overrides(),
            f"experiment_args.batch={s.bench_batch}",
            f"experiment_args.new_tokens={s.bench_tokens}",
            f"experiment_args.repeats={s.bench_repeats}",
            "experiment_args.engines=[fast,fast-compiled]",
        ]
    )  # eager and generator.compile=true
    res = rodeco.run(cfg).extra
    keep = (
        "rodeco_tokens_per_s",
        "hf_generate_tokens_per_s",
        "speedup_vs_hf_generate",
        "matmul_peak_gflops",
        "matmul_peak_fraction",
        "batch",
        "new_tokens",
        "engine",
        "dtype",
        "device",
        "runs_rodeco",
        "runs_hf",
        "engines",
        "cpu",
    )
    return {**{k: res[k] for k in keep if k in res}, "ok": res["speedup_vs_hf_generate"] > 0}


def step_efficiency(c: Check) -> dict[str, Any]:
    """Speculative Rejection against Best-of-N at equal memory in the memory-bound regime, on the fast engine:
    ``scripts/vllm_bench.py --engine fast`` (SR with ``n=auto`` within Best-of-4's memory at full length; Best-of-N
    in N / 4 waves of 4 rows), measured wall times, SR's speedup over each N with a bootstrap 95% CI over prompts."""
    from rodeco.experiments.bench import vllm_bench

    s = c.sizes
    argv = [
        "--engine",
        "fast",
        "--model",
        c.args.model,
        "--dtype",
        c.args.dtype,
        "--data",
        c.args.data,
        "--reward",
        "logprob",  # as every step: no weights beyond the generator's
        "--prompts",
        str(s.eff_prompts),
        "--new-tokens",
        str(s.new_tokens),
        "--memory-of",
        "4",
        "--bon",
        ",".join(map(str, s.eff_bon)),
        "--out",
        str(Path(c.args.out) / "efficiency"),
    ]
    summary = vllm_bench.main(argv)
    sr = summary["methods"]["sr"]["mean_reward"]
    reached = [m for m, r in summary["methods"].items() if m != "sr" and r["mean_reward"] >= sr]
    out = {
        "command": "python scripts/vllm_bench.py " + " ".join(argv),
        "data": c.args.data,
        **summary,
        "bon_at_or_above_sr_reward": reached,
        "note": "the goal on a GPU: SR >= 2x Best-of-N in wall time at matched reward (the smallest N whose "
        "mean reward reaches SR's, or whose difference's CI spans 0)",
    }
    out["ok"] = True  # a measurement, not a pass/fail check
    return out


STEP_FNS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "greedy": step_greedy,
    "survivors": step_survivors,
    "syncs": step_syncs,
    "budget": step_budget,
    "oom": step_oom,
    "engine_bench": step_engine_bench,
    "efficiency": step_efficiency,
}


def run_steps(c: Check, steps: list[str]) -> None:
    for name in steps:
        if time.monotonic() > c.deadline:
            c.report["steps"][name] = {"skipped": "the time limit was reached", "ok": None}
            continue
        t0 = time.monotonic()
        log.info("step %s", name)
        try:
            res = STEP_FNS[name](c)
        except Exception as e:  # recorded; the other steps still run
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        res.setdefault("ok", None)
        res["step_seconds"] = time.monotonic() - t0
        c.report["steps"][name] = res
        log.info("step %s: ok=%s (%.1f s)", name, res["ok"], res["step_seconds"])
        write_report(c.report, Path(c.args.out))  # after every step: a killed run keeps what it measured


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_check", help="report directory (gpu_check.json, gpu_check.md)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (to test the script)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--model", default="smollm2", help="generator.model: embedded name, directory, .gguf, hub name")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    ap.add_argument("--data", default="alpacafarm100", help="the data option whose prompts the efficiency step uses")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (seconds a step)")
    ap.add_argument("--time-limit", type=float, default=480.0, help="seconds; steps not started by then are skipped")
    a = ap.parse_args(argv)
    bad = [s for s in a.steps.split(",") if s not in STEPS]
    if bad:
        ap.error(f"--steps: unknown {bad}; choose from {','.join(STEPS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    report: dict[str, Any] = {"environment": environment(a.device), "args": vars(a), "steps": {}}
    if is_cuda(a.device) and not cuda_available():
        report["skipped"] = "no CUDA device: nothing to check here (run it on a machine with a GPU)"
        write_report(report, Path(a.out))
        print(f"gpu_check: skipped: no CUDA ({Path(a.out) / 'gpu_check.md'})")
        return 0
    c = Check(a, Sizes.quick() if a.quick else Sizes(), time.monotonic() + a.time_limit, report)
    run_steps(c, a.steps.split(","))
    failed = [k for k, r in report["steps"].items() if r.get("ok") is False]
    report["failed"] = failed
    write_report(report, Path(a.out))
    print(markdown(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
