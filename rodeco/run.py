"""``run(cfg)``: everything the CLI and ``rodeco.decode`` do, apart from Hydra itself."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rodeco.budget import Budget, budget_from_device
from rodeco.data import Prompt, load_prompts
from rodeco.errors import ConfigError
from rodeco.loop import LoopSettings, decode_batch
from rodeco.plugins import Plugins, default_plugins
from rodeco.protocols import BuildContext
from rodeco.results import ResultsWriter, export_alpaca_eval
from rodeco.sampling import SamplingParams
from rodeco.scoring import Scorer
from rodeco.state import Compute, PromptResult

log = logging.getLogger(__name__)


@dataclass
class RunOutput:
    results: list[PromptResult]
    compute: Compute
    out_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def validate(cfg: DictConfig) -> None:
    """Checks the schema cannot express; each error names the key and the fix."""
    n = cfg.n
    if not (n == "auto" or (isinstance(n, int) and not isinstance(n, bool) and n >= 1)):
        raise ConfigError("n", n, "must be a positive integer or 'auto'", "set n=16, say, or n=auto")
    s = cfg.sampling
    if not (s.temperature >= 0 and math.isfinite(s.temperature)):
        raise ConfigError("sampling.temperature", s.temperature, "must be >= 0", "use 1.0 (the paper), or 0 for greedy")
    if s.top_k < 0:
        raise ConfigError("sampling.top_k", s.top_k, "must be >= 0", "use 50 (the paper), or 0 to disable")
    if not 0 < s.top_p <= 1:
        raise ConfigError("sampling.top_p", s.top_p, "must be in (0, 1]", "use 1.0 to disable nucleus sampling")
    if s.max_new_tokens < 1:
        raise ConfigError("sampling.max_new_tokens", s.max_new_tokens, "must be >= 1", "use e.g. 128")
    if cfg.data.batch_prompts < 1:
        raise ConfigError("data.batch_prompts", cfg.data.batch_prompts, "must be >= 1", "use e.g. 4")


def split_node(node: Any, key: str) -> tuple[str, dict[str, Any]]:
    """A reward/policy node -> (registry name, parameters)."""
    params = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    name = params.pop("name", None)
    if not name or not isinstance(name, str):
        raise ConfigError(f"{key}.name", name, "missing", f"pick one, e.g. {key}=logprob" if key == "reward"
                          else f"pick one, e.g. {key}=fixed")
    return name, params


def make_budget(cfg: DictConfig, gen) -> Budget:
    b = cfg.budget
    kv = b.kv_tokens
    if kv is None and gen.device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(gen.device)
        kv = budget_from_device(free, gen.kv_bytes_per_token, b.memory_fraction, int(b.reserve_gib * 2**30))
        log.info("budget from free CUDA memory: %d KV tokens (%.1f GiB free)", kv, free / 2**30)
    return Budget(kv_tokens=kv, min_tokens_per_round=b.min_tokens_per_round)


def check_lengths(gen, prompts: list[Prompt], max_new: int, key: str) -> None:
    if not gen.max_context:
        return
    for p in prompts:
        n = len(gen.encode(p.text))
        if n + max_new > gen.max_context:
            raise ConfigError(key, f"prompt {p.index} ({n} tokens)",
                              f"prompt + sampling.max_new_tokens={max_new} exceeds the model's context "
                              f"({gen.max_context} tokens)", "shorten or drop the prompt, or lower max_new_tokens")


def run(cfg: DictConfig, plugins: Plugins | None = None, out_dir: str | Path | None = None) -> RunOutput:
    validate(cfg)
    if cfg.task != "decode":
        from rodeco.experiments import run_experiment

        return run_experiment(cfg, plugins or default_plugins(), out_dir)
    return run_decode(cfg, plugins or default_plugins(), out_dir)


def run_decode(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None = None, gen=None) -> RunOutput:
    from tqdm.auto import tqdm

    from rodeco.models import load_generator

    r_name, r_params = split_node(cfg.reward, "reward")
    p_name, p_params = split_node(cfg.policy, "policy")
    r_entry, p_entry = plugins.rewards.get(r_name), plugins.policies.get(p_name)  # fail before loading models
    prompts = load_prompts(cfg.data.path, cfg.data.prompts, cfg.data.field, cfg.data.offset, cfg.data.limit)
    gen = gen or load_generator(cfg.generator)
    ctx = BuildContext(generator=gen, device=str(gen.device), extra={"plugins": plugins})  # for composite
    scorer = Scorer(r_entry.factory(r_params, ctx), r_name)
    policy = p_entry.factory(p_params, ctx)
    check_lengths(gen, prompts, cfg.sampling.max_new_tokens, "data.path" if cfg.data.path else "data.prompts")
    s = cfg.sampling
    settings = LoopSettings(
        n=cfg.n, sampling=SamplingParams(s.temperature, s.top_k, s.top_p), max_new_tokens=s.max_new_tokens,
        budget=make_budget(cfg, gen), seed=cfg.seed, ignore_eos=s.ignore_eos, all_candidates=cfg.output.all_candidates,
        policy_name=p_name, reward_name=r_name)
    out_dir = out_dir if out_dir is not None else cfg.output.dir
    writer = ResultsWriter(out_dir, resume=cfg.output.resume) if out_dir is not None else None
    todo = [p for p in prompts if writer is None or p.index not in writer.done()]
    if writer is not None and len(todo) < len(prompts):
        log.info("resuming: %d of %d prompts already in %s", len(prompts) - len(todo), len(prompts), writer.path)
    plugins.run_start(config=OmegaConf.to_container(cfg, resolve=True), n_prompts=len(todo))

    def done(result: PromptResult) -> None:
        if writer is not None:
            writer.write(result.to_dict())
        plugins.prompt_done(result)

    results, total = [], Compute()
    bs = cfg.data.batch_prompts
    bar = tqdm(total=len(todo), desc="prompts", unit="prompt", disable=not cfg.output.progress, delay=2.0)
    for i in range(0, len(todo), bs):
        batch = [(p.index, p.text) for p in todo[i: i + bs]]
        res, comp = decode_batch(gen, scorer, policy, batch, settings, on_round=plugins.round_end, on_done=done)
        results += res
        _accumulate(total, comp)
        bar.update(len(batch))
    bar.close()
    if writer is not None:
        writer.write_json("summary.json", {"compute": total.to_dict(), "n_prompts": len(results),
                                           "policy": p_name, "reward": r_name})
        if cfg.output.alpaca_eval:
            export_alpaca_eval(writer.path, writer.path.parent / "model_outputs.json", cfg.output.alpaca_eval)
    plugins.run_end(results=results, compute=total)
    return RunOutput(results, total, Path(out_dir) if out_dir is not None else None)


def _accumulate(total: Compute, c: Compute) -> None:
    for f in ("gen_prefill_tokens", "gen_decode_tokens", "gen_flops", "reward_tokens", "reward_flops",
              "reward_calls", "decode_steps"):
        setattr(total, f, getattr(total, f) + getattr(c, f))
    total.peak_kv_bytes = max(total.peak_kv_bytes, c.peak_kv_bytes)
    total.peak_kv_tokens = max(total.peak_kv_tokens, c.peak_kv_tokens)
    for k, v in c.time_s.items():
        total.add_time(k, v)
