"""The steps of ``scripts/gpu_check.py``. Each takes the ``Context`` and returns a dict of figures with ``ok`` (did
its checks pass). The generator's reward is ``logprob`` throughout: it needs no weights beyond the generator's."""

from __future__ import annotations

import gc
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rodeco

log = logging.getLogger("gpu_check")

PROMPTS = ["Give three tips for staying healthy.", "Write a haiku about autumn.",
           "Explain in two sentences why the sky is blue.", "Name three primary colors."]
TIE_ULPS = 4  # two logits this many bf16 ulps apart are a tie that round-off may break either way
EOS = -1  # stands for any EOS token in a compared sequence
RESERVE_GIB = 2.0  # budget.reserve_gib of the memory check


@dataclass(frozen=True)
class Sizes:
    """How much each step decodes: ``FULL`` on a GPU (a few minutes in all), ``QUICK`` to run the logic on a CPU."""

    prompts: int  # prompts of steps 1-3
    new: int  # max_new_tokens of steps 1-3
    n: int  # rows per prompt of step 1's SR vs Best-of-N and of step 2
    oom_n: int  # rows per prompt of step 3
    bench: tuple[str, ...]  # engine_bench overrides
    eff_prompts: int  # AlpacaFarm prompts of step 5
    eff_n: int  # Best-of-N's N (Speculative Rejection's starting rows) in step 5
    eff_new: int
    repeats: int  # timed runs of each side in step 5
    min_round: int  # budget.min_tokens_per_round of steps 2 and 5 (fewer tokens need shorter rounds to fit)


FULL = Sizes(prompts=4, new=64, n=16, oom_n=64, bench=(), eff_prompts=8, eff_n=32, eff_new=128, repeats=2,
             min_round=8)
QUICK = Sizes(prompts=2, new=12, n=4, oom_n=4, eff_prompts=2, eff_n=4, eff_new=16, repeats=1, min_round=4,
              bench=("experiment_args.batch=4", "experiment_args.new_tokens=4", "experiment_args.repeats=1",
                     "experiment_args.matmul_size=256"))


@dataclass
class Context:
    device: str  # cuda or cpu
    dtype: str
    model: str  # what rodeco's loader takes: smollm2, a directory, a .gguf file
    random_init: bool  # the model directory's config with random weights (when the weights cannot be carried)
    sizes: Sizes
    out: Path
    data_path: str | None = None  # the AlpacaFarm prompts file (data=alpacafarm100's data.path)
    loaded: tuple[Any, Any] | None = field(default=None, repr=False)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def generator(self, engine: str = "auto"):
        from rodeco.generator import Generator

        if self.loaded is None:
            self.loaded = load_model(self.model, self.dtype, self.device, self.random_init)
        return Generator(*self.loaded, engine=engine, name=self.model)


def load_model(model: str, dtype: str, device: str, random_init: bool) -> tuple[Any, Any]:
    from rodeco.loading import load_model_and_tokenizer, resolve_device, resolve_dtype

    if not random_init:
        return load_model_and_tokenizer(model, dtype=dtype, device=device)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=resolve_dtype(dtype, dev))
    return lm.to(dev).eval(), AutoTokenizer.from_pretrained(model)


def decode(gen, prompts: list[str], n: int, policy: str, overrides: list[str], seed: int = 0):
    return rodeco.decode(prompts, generator=gen, n=n, policy=policy, seed=seed,
                         overrides=["reward=logprob", "output.all_candidates=true", *overrides])


def sync(ctx: Context) -> None:
    if ctx.cuda:
        torch.cuda.synchronize(ctx.torch_device)


# --- step 1: the engines against generate() -------------------------------------------------------------------

def greedy_reference(gen, prompt: str, new: int) -> tuple[list[int], torch.Tensor]:
    """``generate()``'s greedy tokens (EOS as ``EOS``) and the logits each was chosen from [steps, V]."""
    ids = torch.tensor([gen.encode(prompt)], device=gen.device)
    out = gen.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             min_new_tokens=0, eos_token_id=gen.eos_ids, pad_token_id=gen.pad_id, output_logits=True,
                             return_dict_in_generate=True)
    toks = out.sequences[0, ids.shape[1]:].tolist()
    logits = torch.stack(out.logits)[:, 0].float().cpu()
    end = next((i for i, t in enumerate(toks) if t in gen.eos_ids), None)
    return (toks if end is None else toks[:end] + [EOS]), logits


def ended(c) -> list[int]:
    return c.token_ids + [EOS] * (c.stop_reason == "eos")


def first_divergence(a: list[int], b: list[int]) -> int | None:
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return d if d is not None or len(a) == len(b) else min(len(a), len(b))


def tie_ulps(logits: torch.Tensor, want: int, got: int, eos_ids: list[int]) -> float:
    """How far apart (in bf16 ulps at the top logit) ``generate()`` put the token it chose and ours."""
    def value(t: int) -> float:
        return float(logits[eos_ids].max() if t == EOS else logits[t])

    ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** torch.tensor(float(logits.max().abs())).log2().floor().item()
    return (value(want) - value(got)) / ulp


def greedy_rows(gen, prompts: list[str], refs: dict, new: int, batch: int) -> list[dict[str, Any]]:
    out = decode(gen, prompts, 1, "none", ["sampling.temperature=0", "budget=unlimited",
                                           f"sampling.max_new_tokens={new}", f"data.batch_prompts={batch}"])
    rows = []
    for i, (p, r) in enumerate(zip(prompts, out.results)):
        ref, logits = refs[p]
        got = ended(r.best)
        d = first_divergence(got, ref)
        ulps = None
        if d is not None and d < len(logits):
            ulps = tie_ulps(logits[d], ref[d], got[d] if d < len(got) else EOS, gen.eos_ids)
        rows.append({"prompt": i, "tokens": len(ref), "first_divergence": d, "tie_ulps": ulps})
    return rows


def survivors_vs_best_of_n(gen, prompts: list[str], n: int, new: int) -> dict[str, Any]:
    """Speculative Rejection (alpha 0.5, n rows under the memory of n rows at half length) against Best-of-n."""
    from rodeco.budget import full_length_tokens

    L0 = max(len(gen.encode(p)) for p in prompts)
    kv = len(prompts) * full_length_tokens(n, L0, new // 2, gen.shares_prefix)
    common = [f"sampling.max_new_tokens={new}", "budget.min_tokens_per_round=4", f"data.batch_prompts={len(prompts)}"]
    bon = decode(gen, prompts, n, "none", [*common, "budget=unlimited"], seed=2)
    sr = decode(gen, prompts, n, "fixed", [*common, f"budget.kv_tokens={kv}", "policy.alpha=0.5"], seed=2)
    bad, rejected = [], 0
    for i, (x, y) in enumerate(zip(bon.results, sr.results)):
        full = {c.candidate_id: c.token_ids for c in x.candidates}
        for c in y.candidates:
            ref = full[c.candidate_id] if c.finished else full[c.candidate_id][: len(c.token_ids)]
            rejected += not c.finished
            if c.token_ids != ref:
                bad.append({"prompt": i, "candidate": c.candidate_id, "finished": c.finished,
                            "first_divergence": first_divergence(c.token_ids, ref)})
    rounds = sum(len(r.rounds) for r in sr.results)
    return {"budget_kv_tokens": kv, "peak_kv_tokens": sr.compute.peak_kv_tokens, "rounds": rounds,
            "candidates": sum(len(r.candidates) for r in sr.results), "rejected": rejected, "mismatches": bad,
            "ok": not bad and rejected > 0 and sr.compute.peak_kv_tokens <= kv}


def check_engines(ctx: Context) -> dict[str, Any]:
    s = ctx.sizes
    prompts = PROMPTS[: s.prompts]
    refs = {p: greedy_reference(ctx.generator("hf"), p, s.new) for p in prompts}
    res: dict[str, Any] = {"ok": True}
    for engine in ("fast", "hf"):
        gen = ctx.generator(engine)
        batched = greedy_rows(gen, prompts, refs, s.new, len(prompts))
        alone = greedy_rows(gen, prompts, refs, s.new, 1)
        sr = survivors_vs_best_of_n(gen, prompts, s.n, s.new)
        at_ties = all(r["tie_ulps"] is not None and 0 <= r["tie_ulps"] <= TIE_ULPS
                      for r in batched + alone if r["first_divergence"] is not None)
        res[engine] = {"greedy_one_prompt_per_batch": alone, "greedy_batched": batched,
                       "greedy_equal": sum(r["first_divergence"] is None for r in batched + alone),
                       "greedy_runs": len(batched + alone), "greedy_parts_only_at_ties": at_ties,
                       "sr_vs_best_of_n": sr}
        res["ok"] = res["ok"] and at_ties and sr["ok"]
    return res


# --- step 2: peak memory within the budget from free memory -----------------------------------------------------

def check_memory(ctx: Context) -> dict[str, Any]:
    """Speculative Rejection with ``n`` rows per prompt under a budget that holds ``n/2`` rows at full length. On
    CUDA the budget comes from free memory (``budget.kv_tokens=null``), its ``memory_fraction`` set so that it binds;
    the peak of ``torch.cuda.max_memory_allocated`` above the weights must fit the budget's bytes and the reserve."""
    from rodeco.budget import full_length_tokens
    from rodeco.config import make_budget

    s, gen = ctx.sizes, ctx.generator()
    prompts = PROMPTS[: s.prompts]
    L0 = max(len(gen.encode(p)) for p in prompts)
    target = len(prompts) * full_length_tokens(s.n // 2, L0, s.new, gen.shares_prefix)
    res: dict[str, Any] = {"kv_bytes_per_token": gen.kv_bytes_per_token}
    if ctx.cuda:
        dev = ctx.torch_device
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base, free = torch.cuda.memory_allocated(dev), torch.cuda.mem_get_info(dev)[0]
        reserve = int(RESERVE_GIB * 2**30)
        frac = target * gen.kv_bytes_per_token / (free - reserve)
        ov = ["budget.kv_tokens=null", f"budget.memory_fraction={frac:.12f}", f"budget.reserve_gib={RESERVE_GIB}"]
        budget = make_budget(rodeco.load_config(ov), gen).kv_tokens
        res.update(weights_bytes=base, free_bytes=free, memory_fraction=frac, default_budget_kv_tokens=make_budget(
            rodeco.load_config(["budget.kv_tokens=null"]), gen).kv_tokens)
    else:
        ov, budget = [f"budget.kv_tokens={target}"], target
    out = decode(gen, prompts, s.n, "fixed", [*ov, "policy.alpha=0.5", f"sampling.max_new_tokens={s.new}",
                                              f"data.batch_prompts={len(prompts)}",
                                              f"budget.min_tokens_per_round={s.min_round}"])
    c = out.compute
    res.update(budget_kv_tokens=budget, peak_kv_tokens=c.peak_kv_tokens, peak_kv_bytes=c.peak_kv_bytes,
               rounds=sum(len(r.rounds) for r in out.results))
    ok = 0 < c.peak_kv_tokens <= budget and res["rounds"] > 0
    if ctx.cuda:
        peak = torch.cuda.max_memory_allocated(dev) - base
        res.update(cuda_peak_bytes_above_weights=peak, cuda_peak_over_kv_peak=peak / max(1, c.peak_kv_bytes),
                   cuda_peak_within_budget_and_reserve=peak <= budget * gen.kv_bytes_per_token + reserve)
        ok = ok and res["cuda_peak_within_budget_and_reserve"]
    res["ok"] = ok
    return res


# --- step 3: out of memory, backed off from ----------------------------------------------------------------------

class FaultyEngine:
    """On a CPU: an engine that raises PyTorch's out-of-memory error when a forward pass has more than
    ``max_rows`` rows (on a GPU the error is real: a per-process memory cap)."""

    def __init__(self, inner, max_rows: int) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "max_rows", max_rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    def _check(self, rows: int) -> None:
        if rows > self.max_rows:
            raise torch.OutOfMemoryError(f"out of memory (injected: {rows} rows > {self.max_rows})")

    def prefill(self, ids, mask):
        self._check(ids.shape[0])
        return self.inner.prefill(ids, mask)

    def step(self, tokens):
        self._check(tokens.shape[0])
        return self.inner.step(tokens)


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_oom(ctx: Context) -> dict[str, Any]:
    """Best-of-N, 4 prompts in one batch, under a memory cap that one batch of 2 fits and 4 do not: the run must
    back off (a warning) and give the same results as an unfaulted run at the batch size it backed off to."""
    s = ctx.sizes
    prompts = (PROMPTS * 2)[:4]
    ov = ["budget=unlimited", f"sampling.max_new_tokens={s.new}", "sampling.ignore_eos=true"]

    def run(batch: int, gen=None):
        return decode(gen or ctx.generator(), prompts, s.oom_n, "none", [*ov, f"data.batch_prompts={batch}"])

    res: dict[str, Any] = {}
    if ctx.cuda:
        dev = ctx.torch_device
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        ref1 = run(1)
        one = torch.cuda.max_memory_allocated(dev) - base  # what one prompt's batch takes
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = (torch.cuda.memory_reserved(dev) + 2.5 * one) / total
        res.update(one_prompt_peak_bytes=one, memory_cap_fraction=cap)
        torch.cuda.set_per_process_memory_fraction(cap, dev)
        faulted_gen = ctx.generator()
    else:
        ref1 = run(1)
        faulted_gen = ctx.generator()
        new_engine = faulted_gen.new_engine
        faulted_gen.new_engine = lambda: FaultyEngine(new_engine(), 2 * s.oom_n)  # 2 prompts' rows fit, 4 do not
    catcher = Warnings()
    logging.getLogger("rodeco.backoff").addHandler(catcher)
    try:
        faulted = run(4, faulted_gen)
    finally:
        logging.getLogger("rodeco.backoff").removeHandler(catcher)
        if ctx.cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, ctx.torch_device)
    sizes = [int(m) for w in catcher.messages for m in re.findall(r"data\.batch_prompts -> (\d+)", w)]
    final = sizes[-1] if sizes else 4
    ref = ref1 if final == 1 else run(final)

    def differing(a, b) -> int:
        """Candidates whose tokens differ, plus prompts whose best score differs."""
        return sum(sum(c.token_ids != d.token_ids for c, d in zip(x.candidates, y.candidates))
                   + (x.best.score != y.best.score) for x, y in zip(a.results, b.results))

    res.update(warnings=catcher.messages, backed_off_to=final, candidates=4 * s.oom_n,
               differing_from_unfaulted=differing(faulted, ref),
               # for the record: whether the numbers depend on the batch (left padding, kernel shapes)
               differing_from_unfaulted_batch_4=differing(faulted, run(4)))
    res["ok"] = bool(sizes) and res["differing_from_unfaulted"] == 0
    return res


# --- step 4: engine_bench -------------------------------------------------------------------------------------------

def check_engine_bench(ctx: Context) -> dict[str, Any]:
    from rodeco.experiments import engine_bench
    from rodeco.plugins import default_plugins

    cfg = rodeco.load_config(["experiment=engine_bench", f"generator.device={ctx.device}",
                              f"generator.dtype={ctx.dtype}", *ctx.sizes.bench])
    out = engine_bench.run(cfg, default_plugins(), ctx.out / "engine_bench", gen=ctx.generator())
    keep = ("speedup_vs_hf_generate", "rodeco_tokens_per_s", "hf_generate_tokens_per_s", "matmul_peak_gflops",
            "matmul_peak_fraction", "batch", "new_tokens", "engine", "dtype", "device")
    res = {k: out.extra[k] for k in keep}
    res["ok"] = res["speedup_vs_hf_generate"] > 0
    return res


# --- step 5: Speculative Rejection against Best-of-N, live, timed ------------------------------------------------

def efficiency_prompts(ctx: Context) -> tuple[list[str], str]:
    """``data=alpacafarm100``'s first prompts, or the built-in ones when its file is not on this machine."""
    from rodeco.data import prompts_of

    ov = ["data=alpacafarm100", f"data.limit={ctx.sizes.eff_prompts}"]
    ov += [f"data.path={ctx.data_path}"] if ctx.data_path else []
    try:
        return [p.text for p in prompts_of(rodeco.load_config(ov).data)], "alpacafarm100"
    except rodeco.ConfigError as e:
        log.warning("AlpacaFarm prompts not found (%s): using the built-in ones (pass --data-path)", e)
        return (PROMPTS * 4)[: ctx.sizes.eff_prompts], "built-in (alpacafarm100 file not found)"


def check_efficiency(ctx: Context) -> dict[str, Any]:
    """Speculative Rejection (fixed alpha 0.5) starting from N rows per prompt under the memory of Best-of-N/4,
    against Best-of-N: the same N candidates (same ids, same samples) scored at the end, so the ratio is what
    rejecting saves at a matching N. Wall seconds of each whole run (config composition included; the device
    synchronized), the loop's own phase seconds, and total FLOPs."""
    from rodeco.budget import full_length_tokens

    s, gen = ctx.sizes, ctx.generator()
    prompts, source = efficiency_prompts(ctx)
    L0 = max(len(gen.encode(p)) for p in prompts)
    batch = min(4, len(prompts))
    kv = batch * full_length_tokens(max(1, s.eff_n // 4), L0, s.eff_new, gen.shares_prefix)
    common = [f"sampling.max_new_tokens={s.eff_new}", f"data.batch_prompts={batch}",
              f"budget.min_tokens_per_round={s.min_round}"]
    runs = {"best_of_n": ("none", [*common, "budget=unlimited"]),
            "speculative_rejection": ("fixed", [*common, f"budget.kv_tokens={kv}", "policy.alpha=0.5"])}
    decode(gen, prompts[:1], 2, "none", ["sampling.max_new_tokens=4", "budget=unlimited"])  # warm-up
    res: dict[str, Any] = {"prompts": len(prompts), "prompt_source": source, "n": s.eff_n, "max_new_tokens": s.eff_new,
                           "sr_budget_kv_tokens": kv}
    for _ in range(s.repeats):  # alternate, so drifts hit both alike
        for name, (policy, ov) in runs.items():
            sync(ctx)
            t0 = time.perf_counter()
            out = decode(gen, prompts, s.eff_n, policy, ov)
            sync(ctx)
            r = res.setdefault(name, {"wall_s": []})
            r["wall_s"].append(time.perf_counter() - t0)
            r.setdefault("loop_s", []).append(sum(out.compute.time_s.values()))  # the loop's phases, no set-up
            r.update(flops=out.compute.total_flops, decode_tokens=out.compute.gen_decode_tokens,
                     peak_kv_tokens=out.compute.peak_kv_tokens, phase_s=out.compute.time_s,
                     mean_best_reward=sum(x.best.score for x in out.results) / len(out.results))
    bon, sr = res["best_of_n"], res["speculative_rejection"]
    res["wall_ratio_bon_over_sr"] = min(bon["wall_s"]) / min(sr["wall_s"])
    res["loop_ratio_bon_over_sr"] = min(bon["loop_s"]) / min(sr["loop_s"])
    res["flops_ratio_bon_over_sr"] = bon["flops"] / sr["flops"]
    res["ok"] = sr["peak_kv_tokens"] <= kv and sr["decode_tokens"] < bon["decode_tokens"]
    return res


STEPS = {"engines": check_engines, "memory": check_memory, "oom": check_oom, "engine_bench": check_engine_bench,
         "efficiency": check_efficiency}
