"""Small helpers shared by the test modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rodeco
from rodeco.experiments import analysis

TRAIN_PROMPTS = (
    "write a haiku about autumn leaves",
    "give three tips",
    "explain why the sky is blue",
    "name two rivers",
    "describe a cat",
    "say hello twice",
)  # the tiny pools the trained heads are fitted on
NS = (1, 2, 4, 8, 16)  # the Best-of-N sizes of ``records``' prompts
TM = analysis.TimeModel(a=0.01, b=0.001, c=1e-6, r2=1.0, steps=1)


def run_tiny(gen, prompts, *, n=4, policy="fixed", overrides=(), **kw):
    """Decode with an in-memory generator; the embedded models are never loaded."""
    ov = ["output.all_candidates=true", "reward=logprob", *overrides]
    return rodeco.decode(prompts, generator=gen, n=n, policy=policy, overrides=ov, **kw)


def record_train_pool(overrides: list[str], pool: Path, n: int, gen: Any) -> Any:
    """The config of ``overrides`` with ``TRAIN_PROMPTS`` as its data set; those prompts recorded into ``pool`` by
    ``gen``, ``n`` candidates each."""
    from omegaconf import open_dict

    from rodeco.core.data import Prompt
    from rodeco.experiments.record import record
    from rodeco.plugins import default_plugins

    prompts = [Prompt(i, t) for i, t in enumerate(TRAIN_PROMPTS)]
    cfg = rodeco.load_config(overrides)
    with open_dict(cfg):
        cfg.data.path, cfg.data.prompts, cfg.data.indices = None, [p.text for p in prompts], None
    record(cfg, default_plugins(), pool, prompts, n, gen=gen)
    return cfg


def hf_greedy(model, gen, prompt: str, max_new_tokens: int) -> list[int]:
    """``model.generate()``'s greedy continuation of one prompt, without the EOS token and what follows."""
    ids = torch.tensor([gen.encode(prompt)])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=gen.eos_ids,
        pad_token_id=gen.pad_id,
    )
    new = out[0, ids.shape[1] :].tolist()
    for i, t in enumerate(new):
        if t in gen.eos_ids:
            return new[:i]
    return new


def hf_greedy_logits(gen, prompt: str, max_new_tokens: int) -> tuple[list[int], bool, torch.Tensor]:
    """``model.generate()``'s greedy continuation of one prompt on the generator's device: (the tokens without the
    EOS token, whether it ended with EOS, the logits each token was chosen from [steps, V] in float32)."""
    ids = torch.tensor([gen.encode(prompt)], device=gen.device)
    out = gen.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=gen.eos_ids,
        pad_token_id=gen.pad_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[0, ids.shape[1] :].tolist()
    logits = torch.stack(out.logits)[:, 0].float().cpu()
    for i, t in enumerate(new):
        if t in gen.eos_ids:
            return new[:i], True, logits[: i + 1]
    return new, False, logits


def compare_survivors(bon, sr) -> tuple[int, int]:
    """(rejected candidates, candidates that break the promise) of a Speculative Rejection run against the Best-of-N
    run with the same seed: every finished candidate must be the Best-of-N sample with its id, every rejected one a
    prefix of it."""
    rejected = broken = 0
    for x, y in zip(bon.results, sr.results):
        full = {c.candidate_id: list(c.token_ids) for c in x.candidates}
        for c in y.candidates:
            ids = list(c.token_ids)
            rejected += not c.finished
            broken += (ids != full[c.candidate_id]) if c.finished else (full[c.candidate_id][: len(ids)] != ids)
    return rejected, broken


def run_record(best: float, flops: float, steps: int = 40) -> dict[str, float]:
    """One replayed run's measurements, as ``efficiency.Measurer.run`` records them."""
    return {
        "best": best,
        "flops": flops,
        "steps": steps,
        "decode_tokens": 4.0 * steps,
        "rows_x_context": 400.0 * steps,
        "reward_s": 0.01,
    }


def records(
    methods: dict[str, Any], n_prompts: int = 40, seed: int = 0, scales: tuple[int, ...] = (1,)
) -> list[dict[str, Any]]:
    """Prompt records as ``efficiency.collect`` writes them: 16 final rewards each, Best-of-N costs N GFLOPs plus a
    prefill; ``methods`` maps a label to ``f(p, final) -> (best, flops)`` (None: the start does not fit the
    budget), or to ``{scale: f}`` where the budgets differ."""

    def run(f, p: int, final: np.ndarray, scale: int) -> dict[str, Any]:
        got = (f[scale] if isinstance(f, dict) else f)(p, final)
        return {"infeasible": "the start does not fit the budget"} if got is None else run_record(*map(float, got))

    rng = np.random.default_rng(seed)
    out = []
    for p in range(n_prompts):
        final = rng.normal(size=16)
        out.append(
            {
                "prompt_index": p,
                "L0": 10,
                "prefill_s": 0.05,
                "final": final.tolist(),
                "bon": {str(N): run_record(0.0, 1e8 + N * 1e9) for N in NS},
                "methods": {k: {str(s): run(f, p, final, s) for s in scales} for k, f in methods.items()},
            }
        )
    return out


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (the scripts are not a package)."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_bench(*args: str, out: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``scripts/vllm_bench.py ARGS [--out OUT]`` in a subprocess from the repository's root."""
    from conftest import REPO

    cmd = [sys.executable, "scripts/vllm_bench.py", *args, *(["--out", str(out)] if out is not None else [])]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def vllm_bench_results(*args: str, out: Path) -> dict[str, Any]:
    """``vllm_bench(*args, out=out)``, which must succeed and print the speedup: the ``vllm_bench.json`` it wrote."""
    p = vllm_bench(*args, out=out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wall-time speedup of SR over it" in p.stdout
    return json.loads((out / "vllm_bench.json").read_text())


def open_batch(
    gen: Any,
    prompt_ids: list[list[int]],
    n: int,
    sampling: Any,
    max_new_tokens: int,
    seed: int = 0,
    stream_keys: tuple[int, ...] | None = None,
    kv_tokens: int | None = None,
    **spec: Any,
) -> Any:
    """A session of ``gen`` opened with ``spec`` (``SessionSpec``'s keywords) and ``kv_tokens``, the prompts admitted
    together, ``n`` rows each, stream keys ``stream_keys`` (default 0, 1, ...)."""
    from rodeco.common.state import OpenPrompt, SessionSpec

    keys = stream_keys if stream_keys is not None else tuple(range(len(prompt_ids)))
    sess = gen.open_session(SessionSpec(kv_tokens=kv_tokens, **spec))
    sess.admit(prompt_ids, [OpenPrompt(n, max_new_tokens, sampling, seed, k) for k in keys])
    return sess
