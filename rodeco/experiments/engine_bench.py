"""``rodeco experiment=engine_bench``: rodeco's decoding loop vs ``model.generate()`` on the same model.

Both decode the same prompts at the same batch size with the same sampling (T, top-k, top-p) for exactly the
same number of new tokens (EOS ignored), in one process, alternating runs; the median run of each is reported.
The machine's matmul peak ``P`` in the generator's dtype is measured in the same run, and ``F = A * flops_per_token /
P`` says how
close rodeco's decode gets to it. On CUDA every clock read waits for the device (``torch.cuda.synchronize``).
``experiment_args.engines`` times rodeco's loop on several engines of the same weights in the same run (``vllm``:
in the vLLM environment; ``fast-compiled``: the fast engine with ``generator.compile=true``, its compilation timed
apart, in the warm-up), each against the same ``generate()``; with ``fast`` and ``vllm`` both timed, their ratio is
printed. The CPU's model and the flags bf16 matmuls depend on are recorded with the figures.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, open_dict

from rodeco.common.budget import Budget
from rodeco.common.hardware import cpu_facts, cuda_devices, synchronize
from rodeco.common.protocols import Generator
from rodeco.common.sampling import SamplingParams
from rodeco.common.state import Compute, RunOutput
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer
from rodeco.core.generator import TorchGenerator
from rodeco.core.loading import load_generator
from rodeco.core.loop import LoopSettings, decode_batch
from rodeco.core.results import ResultsWriter
from rodeco.engines import ENGINES
from rodeco.engines.vllm import VLLMGenerator
from rodeco.experiments.bootstrap import geomean_ci
from rodeco.plugins import BuildContext, Plugins

log = logging.getLogger(__name__)


def matmul_peak_gflops(n: int = 4096, reps: int = 5, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """The best ``n x n`` matmul rate in ``dtype``, over ``torch.mm`` and (on CPU) the oneDNN prepacked path that the
    fast engine uses, so that ``F`` is not flattered by a slower reference kernel."""
    from rodeco.engines.llama import Linear

    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    kernels = [lambda: a @ b]
    packed = Linear(b.t().contiguous(), batch_hint=n)
    if packed.packed is not None:
        kernels.append(lambda: packed(a))
    best = float("inf")
    for kernel in kernels:
        for _ in range(reps + 1):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            kernel()
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def _clock(gen) -> float:
    """The wall clock, once the generator's device has finished what was queued on it."""
    synchronize(cuda_devices(gen.device))
    return time.perf_counter()


def _rodeco_run(gen, prompts: list[str], scorer: Scorer, policy, s: LoopSettings) -> float:
    t0 = _clock(gen)
    decode_batch(gen, scorer, policy, list(enumerate(prompts)), s)
    return _clock(gen) - t0


@torch.inference_mode()
def _hf_run(gen, prompts: list[str], rows_per_prompt: int, sp: SamplingParams, new_tokens: int, seed: int) -> float:
    ids = [gen.encode(p) for p in prompts for _ in range(rows_per_prompt)]
    L = max(map(len, ids))
    inp = torch.full((len(ids), L), gen.pad_id, dtype=torch.long)
    mask = torch.zeros_like(inp)
    for i, x in enumerate(ids):
        inp[i, L - len(x) :], mask[i, L - len(x) :] = torch.tensor(x), 1
    torch.manual_seed(seed)
    t0 = _clock(gen)
    out = gen.model.generate(
        inp.to(gen.device),
        attention_mask=mask.to(gen.device),
        do_sample=not sp.greedy,
        temperature=sp.temperature or None,
        top_k=sp.top_k or None,
        top_p=sp.top_p,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=gen.pad_id,
    )
    dt = _clock(gen) - t0
    assert out.shape[1] == L + new_tokens
    return dt


def paired_runs(ours: list[float], theirs: list[float], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Run i of one engine over run i of another (the runs alternate, so a pair shares the machine's load at the
    time): the ratios, their geometric mean, and its 95% bootstrap CI over the runs."""
    ratios = np.asarray(ours) / np.asarray(theirs)
    g, lo, hi = geomean_ci(ratios, resamples, seed)
    return {"ratios": ratios.tolist(), "geomean": g, "ci": [lo, hi]}


def _compiled(gen: Generator) -> tuple[int, float] | None:
    """(graphs compiled, seconds compiling) of a generator's compiled step; None if it is not compiled."""
    step = gen.compiled if isinstance(gen, TorchGenerator) else None
    return (step.compiles, step.compile_seconds) if step is not None else None


def _compile_figures(warm: tuple[int, float] | None, end: tuple[int, float] | None) -> dict[str, Any]:
    if warm is None or end is None:
        return {}
    return {
        "compiles_warm_up": warm[0],
        "compile_seconds": warm[1],
        "compiles_timed": end[0] - warm[0],
        "compile_seconds_timed": end[1] - warm[1],
    }


def engine_generators(
    cfg: DictConfig, engines: list[str], gen: Generator | None
) -> tuple[TorchGenerator, dict[str, Generator]]:
    """(the torch generator ``generate()`` runs on, {engine: the generator rodeco's loop runs on}): the torch engines
    share one model; ``vllm`` loads the same weights into vLLM."""
    torch_cfg = cfg.generator.copy()
    with open_dict(torch_cfg):
        torch_cfg.engine = "auto" if torch_cfg.engine == "vllm" else torch_cfg.engine
    known = (*ENGINES, "fast-compiled")
    for e in engines:
        if e not in known:
            raise ConfigError(
                "experiment_args.engines", e, "not an engine this benchmark times", f"use some of {', '.join(known)}"
            )
    base = gen if isinstance(gen, TorchGenerator) else load_generator(torch_cfg)
    assert isinstance(base, TorchGenerator)  # a torch engine's config loads a TorchGenerator
    out: dict[str, Generator] = {}
    for e in engines:
        if e == "vllm":
            vcfg = cfg.generator.copy()
            with open_dict(vcfg):
                vcfg.engine = "vllm"
            out[e] = gen if isinstance(gen, VLLMGenerator) else load_generator(vcfg)
        elif e == base.engine_kind and not (e == "fast" and base.compile):  # as configured; "fast" is always eager
            out[e] = base
        else:
            compiled = e == "fast-compiled"
            out[e] = TorchGenerator(
                base.model,
                base.tokenizer,
                chat_template=base.use_chat_template,
                system_prompt=base.system_prompt,
                engine="fast" if compiled else e,
                name=base.name,
                compile="true" if compiled else "false",
            )
    return base, out


@dataclass
class Bench:
    """What every timed run shares: the generators, the prompts, the loop's settings and its (untimed) scoring."""

    base: TorchGenerator  # the one ``generate()`` runs on
    gens: dict[str, Generator]  # {engine: the generator rodeco's loop runs on}, in ``engines``' order
    engines: list[str]
    prompts: list[str]
    rows: int  # rows per prompt
    new_tokens: int  # of every row of a timed run
    tokens: int  # new tokens of one timed run, all rows
    sp: SamplingParams
    s: LoopSettings
    scorer: Scorer
    policy: Any
    seed: int

    @property
    def gen(self) -> Generator:
        """The first engine's generator: the one the headline figures are of."""
        return self.gens[self.engines[0]]


def prepare(cfg: DictConfig, plugins: Plugins, gen: TorchGenerator | VLLMGenerator | None) -> Bench:
    """The generators of ``experiment_args.engines`` (default: ``gen``'s engine, else the configured one), the loop's
    settings and the scorer and policy every run uses."""
    a = cfg.experiment_args
    engines = list(a.engines) or [gen.engine_kind if gen is not None else cfg.generator.engine]
    base, gens = engine_generators(cfg, engines, gen)
    first = gens[engines[0]]
    prompts = list(a.prompts)
    rows = a.batch // len(prompts)
    sp = SamplingParams(cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p)
    s = LoopSettings(
        n=rows, sampling=sp, max_new_tokens=a.new_tokens, budget=Budget(None), seed=cfg.seed, ignore_eos=True
    )
    tokens = rows * len(prompts) * a.new_tokens
    # Scoring is not what this benchmark measures: the built-in `length` value function keeps it out of the way.
    ctx = BuildContext(generator=first, device=str(first.device), plugins=plugins)
    scorer = Scorer(plugins.build_reward({"name": "length"}, ctx), "length")
    policy = plugins.build_policy({"name": "none"}, ctx)  # Best-of-N: every row to the end
    return Bench(base, gens, engines, prompts, rows, a.new_tokens, tokens, sp, s, scorer, policy, cfg.seed)


CompileStates = dict[str, tuple[int, float] | None]  # {engine: its ``_compiled`` state}


def warm_up(b: Bench) -> CompileStates:
    """A short run of each engine and of ``generate()``, untimed; the compile figures of each engine after it."""
    log.info("warm-up")
    for g in b.gens.values():
        _rodeco_run(g, b.prompts, b.scorer, b.policy, LoopSettings(**{**b.s.__dict__, "max_new_tokens": 4}))
    warm = {e: _compiled(g) for e, g in b.gens.items()}
    _hf_run(b.base, b.prompts, b.rows, b.sp, 4, b.seed)
    return warm


def timed_runs(b: Bench, repeats: int) -> tuple[dict[str, list[float]], list[float]]:
    """({engine: tokens a second of each run}, ``generate()``'s tokens a second of each run): ``repeats`` rounds of
    one run of each engine, then one of ``generate()``."""
    runs: dict[str, list[float]] = {e: [] for e in b.engines}
    theirs = []
    for i in range(repeats):  # alternate, so drifts in machine load hit every side alike
        for e, g in b.gens.items():
            runs[e].append(b.tokens / _rodeco_run(g, b.prompts, b.scorer, b.policy, b.s))
        theirs.append(b.tokens / _hf_run(b.base, b.prompts, b.rows, b.sp, b.new_tokens, b.seed))
        log.info(
            "run %d: %s, hf generate %.1f tok/s", i, ", ".join(f"{e} {r[-1]:.1f}" for e, r in runs.items()), theirs[-1]
        )
    return runs, theirs


def figures(
    b: Bench, runs: dict[str, list[float]], theirs: list[float], warm: CompileStates, P: float
) -> dict[str, Any]:
    """The benchmark's figures (``engine_bench.json``): the first engine's median rate against ``generate()``'s
    and against the matmul peak ``P`` (GFLOP/s), each engine's, and each fast engine's over vLLM's."""
    gen, ours = b.gen, runs[b.engines[0]]
    A, B = statistics.median(ours), statistics.median(theirs)
    L0 = max(len(gen.encode(p)) for p in b.prompts)
    flops_tok = gen.flops_per_token(L0 + b.new_tokens // 2)  # attention at the mean context
    F = A * flops_tok / (P * 1e9)
    res = {
        "rodeco_tokens_per_s": A,
        "hf_generate_tokens_per_s": B,
        "speedup_vs_hf_generate": A / B,
        "matmul_peak_gflops": P,
        "matmul_peak_fraction": F,
        "flops_per_token": flops_tok,
        "batch": b.rows * len(b.prompts),
        "new_tokens": b.new_tokens,
        "engine": gen.info.name,
        "dtype": str(gen.dtype),
        "device": str(gen.device),
        "threads": torch.get_num_threads(),
        "cpu": cpu_facts(),
        "runs_rodeco": ours,
        "runs_hf": theirs,
        "engines": {
            e: {
                "engine": g.info.name,
                "tokens_per_s": statistics.median(runs[e]),
                "vs_hf_generate": statistics.median(runs[e]) / B,
                "runs": runs[e],
                **_compile_figures(warm[e], _compiled(g)),
                "linears": g.info.linear,  # mkl, onednn, torch (F.linear) or vllm
            }
            for e, g in b.gens.items()
        },
    }
    for e in ("fast", "fast-compiled"):
        if e in b.gens and "vllm" in b.gens:
            k = f"{e.replace('-', '_')}_over_vllm"
            res[k] = statistics.median(runs[e]) / statistics.median(runs["vllm"])
            res[f"{k}_paired"] = paired_runs(runs[e], runs["vllm"], seed=b.seed)
    return res


def print_figures(res: dict[str, Any], by_engine: bool) -> None:
    """The headline figures, then (``by_engine``) each engine's and the ratios over vLLM, then the CPU's facts."""
    for k in (
        "rodeco_tokens_per_s",
        "hf_generate_tokens_per_s",
        "speedup_vs_hf_generate",
        "matmul_peak_gflops",
        "matmul_peak_fraction",
    ):
        print(f"{k}: {res[k]:.3f}")
    if by_engine:
        for e, r in res["engines"].items():
            extra = (
                f"; compiled {r['compiles_warm_up']} graphs in {r['compile_seconds']:.1f} s in the warm-up, "
                f"{r['compiles_timed']} while timed"
                if "compile_seconds" in r
                else ""
            )
            extra += f"; linears {r['linears']}" if "linears" in r else ""
            print(f"engine {e}: {r['tokens_per_s']:.1f} tok/s, {r['vs_hf_generate']:.3f}x generate(){extra}")
        for k in [k for k in res if k.endswith("_over_vllm")]:
            p = res[f"{k}_paired"]
            print(
                f"{k}: {res[k]:.3f} (ratio of medians); paired by run: geometric mean {p['geomean']:.3f} "
                f"[{p['ci'][0]:.3f}, {p['ci'][1]:.3f}] (95% bootstrap CI over {len(p['ratios'])} runs), "
                f"range {min(p['ratios']):.3f} to {max(p['ratios']):.3f}"
            )
    c = res["cpu"]
    print(
        f"cpu: {c['model']}, {c['threads']} threads, "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in c["flags"].items())
    )


def run(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None, gen=None) -> RunOutput:
    """``gen``: an already loaded generator (``scripts/gpu_check.py``), else ``cfg.generator``'s."""
    a = cfg.experiment_args
    bench = prepare(cfg, plugins, gen)
    base = bench.base
    warm = warm_up(bench)
    runs, theirs = timed_runs(bench, a.repeats)
    P = matmul_peak_gflops(a.matmul_size, device=base.device.type, dtype=base.dtype)
    res = figures(bench, runs, theirs, warm, P)
    if out_dir is not None:
        ResultsWriter(out_dir, resume=False).write_json("engine_bench.json", res)
    print_figures(res, len(bench.engines) > 1)
    return RunOutput([], Compute(), Path(out_dir) if out_dir else None, extra=res)
