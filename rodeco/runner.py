"""``run_decode(cfg)``: one decode run. Builds the reward and the policy from the config, loads the prompts and
the generator, decodes batch after batch, and writes each prompt's result as soon as it is final."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rodeco.backoff import Backoff, free_cached_memory, is_oom
from rodeco.calibration import identities
from rodeco.config import make_budget, split_node
from rodeco.contracts import Scorer
from rodeco.data import Prompt, batches_of, prompts_of
from rodeco.generator import Generator
from rodeco.loop import LoopSettings, decode_batch
from rodeco.plugins import BuildContext, Plugins
from rodeco.results import ResultsWriter, export_alpaca_eval
from rodeco.sampling import SamplingParams
from rodeco.state import Compute, PromptResult, RunOutput
from rodeco.validation import ConfigError, Interrupted, PluginError

log = logging.getLogger(__name__)

SAME, ORACLE = "same", "oracle"  # partial_reward options that are not rewards of their own


def check_lengths(gen: Generator, prompts: list[Prompt], max_new: int, key: str) -> None:
    if not gen.max_context:
        return
    for p in prompts:
        n = len(gen.encode(p.text))
        if n + max_new > gen.max_context:
            raise ConfigError(key, f"prompt {p.index} ({n} tokens)",
                              f"prompt + sampling.max_new_tokens={max_new} exceeds the model's context "
                              f"({gen.max_context} tokens)", "shorten or drop the prompt, or lower max_new_tokens")


def loop_settings(cfg: DictConfig, gen: Generator, policy_name: str = "", reward_name: str = "") -> LoopSettings:
    s = cfg.sampling
    return LoopSettings(
        n=cfg.n, sampling=SamplingParams(s.temperature, s.top_k, s.top_p), max_new_tokens=s.max_new_tokens,
        budget=make_budget(cfg, gen), seed=cfg.seed, ignore_eos=s.ignore_eos, all_candidates=cfg.output.all_candidates,
        policy_name=policy_name, reward_name=reward_name)


def live_partial_name(cfg: DictConfig, plugins: Plugins) -> str:
    """``partial_reward``'s name, checked for a live run (before any model is loaded)."""
    name = split_node(cfg.partial_reward, "partial_reward")[0]
    if name == ORACLE:
        raise ConfigError("partial_reward", ORACLE, "the oracle scores a partial response with its final reward, "
                          "which only a recorded pool knows", "use it when replaying a pool: rodeco "
                          "experiment=replay pool=DIR partial_reward=oracle (or experiment=efficiency)")
    if name != SAME:
        plugins.rewards.get(name, "partial_reward.name")
    return name


def build_scorers(cfg: DictConfig, plugins: Plugins, ctx: BuildContext) -> tuple[Scorer, Scorer | None]:
    """The ``reward`` scorer and the ``partial_reward`` one (``None`` for ``partial_reward=same``: the reward
    scores partial responses too)."""
    scorer = Scorer(plugins.build_reward(cfg.reward, ctx), split_node(cfg.reward, "reward")[0])
    name = live_partial_name(cfg, plugins)
    if name == SAME:
        return scorer, None
    return scorer, Scorer(plugins.build_reward(cfg.partial_reward, ctx, "partial_reward"), name, "partial_reward")


def run_identities(gen_name: str, scorer: Scorer, partial: Scorer | None) -> dict[str, str]:
    """What the run's scores come from, for plugins tied to them (a calibration file): ``BuildContext.identities``."""
    def one(x: Scorer) -> tuple[str, str | None]:
        return x.name, getattr(x.reward, "identity", None)

    return identities(gen_name, one(scorer), one(partial) if partial is not None else None)


@contextmanager
def stop_on_signals() -> Iterator[list[str]]:
    """While open, SIGTERM and SIGINT only record their name (the run stops at the next decision point or batch
    boundary, its results intact); a second SIGINT interrupts at once. Main thread only (elsewhere: no handlers).
    Under submitit only SIGINT: its own handlers requeue a preempted job, which then resumes from its results."""
    got: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    # under submitit, SIGTERM and SIGUSR2 are submitit's: it requeues a preempted job, which then resumes
    signals = (signal.SIGINT,) if os.environ.get("SUBMITIT_EXECUTOR") else (signal.SIGTERM, signal.SIGINT)

    def handler(signum: int, frame: object) -> None:
        if got and signum == signal.SIGINT:
            raise KeyboardInterrupt
        got.append(signal.Signals(signum).name)
        log.warning("%s: stopping at the next decision point (the results so far are kept)", got[-1])

    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def shard_device(cfg: DictConfig) -> DictConfig:
    """The generator node of a shard: with ``generator.device=auto`` and several GPUs visible, shard ``i`` runs on
    ``cuda:(i % device_count)`` (one shard per GPU under the joblib launcher)."""
    import torch

    g, d = cfg.generator, cfg.data
    if g.device != "auto" or g.get("device_map") or d.get("num_shards", 1) < 2 or not torch.cuda.is_available():
        return g
    count = torch.cuda.device_count()
    if count < 2:
        return g
    g = g.copy()
    g.device = f"cuda:{d.shard % count}"
    log.info("shard %d of %d runs on %s", d.shard, d.num_shards, g.device)
    return g


def run_decode(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None = None,
               gen: Generator | None = None) -> RunOutput:
    from tqdm.auto import tqdm

    from rodeco.loading import load_generator

    r_name, p_name = split_node(cfg.reward, "reward")[0], split_node(cfg.policy, "policy")[0]
    plugins.rewards.get(r_name), plugins.policies.get(p_name)  # unknown names fail before any model is loaded
    pr_name = live_partial_name(cfg, plugins)
    prompts = prompts_of(cfg.data)
    gen = gen or load_generator(shard_device(cfg))
    ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
    scorer, partial = build_scorers(cfg, plugins, ctx)
    ctx.identities = run_identities(gen.name, scorer, partial)
    policy = plugins.build_policy(cfg.policy, ctx)
    check_lengths(gen, prompts, cfg.sampling.max_new_tokens, "data.path" if cfg.data.path else "data.prompts")
    settings = loop_settings(cfg, gen, p_name, r_name)
    out_dir = out_dir if out_dir is not None else cfg.output.dir
    writer = ResultsWriter(out_dir, resume=cfg.output.resume) if out_dir is not None else None
    done_before = writer.done() if writer is not None else set()
    # the batches are fixed by the whole prompt list, so a resumed run decodes the batches it would have decoded
    batches = [b for b in ([p for p in b if p.index not in done_before]
                           for b in batches_of(prompts, cfg.data.batch_prompts)) if b]
    todo = [p for b in batches for p in b]
    if done_before:
        log.info("resuming: %d of %d prompts already in %s", len(prompts) - len(todo), len(prompts), writer.path)
    log.info("decoding %d of %d prompts in %d batch(es)", len(todo), len(prompts), len(batches))
    plugins.run_start(config=OmegaConf.to_container(cfg, resolve=True), n_prompts=len(todo))
    before, total = previous_compute(writer) if writer is not None else Compute(), Compute()
    results: list[PromptResult] = []
    backoff = Backoff(cfg.data.batch_prompts, "budget.memory_fraction" if cfg.budget.kv_tokens is None
                      else "budget.kv_tokens")
    bar = tqdm(total=len(todo), desc="prompts", unit="prompt", disable=not cfg.output.progress, delay=2.0)

    def summary() -> None:  # everything the results in out_dir cost, this run and the ones it resumed
        if writer is not None:
            spent = Compute()
            spent.add(before)
            spent.add(total)
            writer.write_json("summary.json", {
                "compute": spent.to_dict(), "n_prompts": len(writer.records), "prompts_total": len(prompts),
                "complete": len(writer.records) >= len(prompts), "policy": p_name, "reward": r_name,
                "partial_reward": pr_name})

    with stop_on_signals() as stop:
        def stop_if_asked() -> None:
            if stop:
                raise Interrupted(stop[0], len(results), len(todo), str(writer.path) if writer is not None else None)

        def on_round(view, kept) -> None:  # a decision point: stop here if a signal came
            plugins.round_end(view, kept)
            stop_if_asked()

        def on_done(result: PromptResult) -> None:
            if writer is not None:
                writer.write(result.to_dict())
            plugins.prompt_done(result)
            results.append(result)
            bar.update(1)

        for k, batch in enumerate(batches):
            pending = batch
            while pending:
                stop_if_asked()
                part = pending[:backoff.batch_prompts]
                try:
                    _, comp = decode_batch(gen, scorer, policy, [(p.index, p.text) for p in part], settings,
                                           on_round=on_round, on_done=on_done, partial=partial)
                except Exception as e:
                    if is_oom(e):
                        free_cached_memory()
                        backoff.shrink(e, len(part))
                        settings = replace(settings, budget=make_budget(cfg, gen, backoff.budget_scale))
                        finished = {r.prompt_index for r in results}
                        pending = [p for p in pending if p.index not in finished]
                        continue
                    if isinstance(e, PluginError):
                        kept = (f"kept in {writer.path}" if writer is not None else
                                "not kept: no output dir (out_dir=... keeps results as they finish)")
                        raise PluginError(f"{e} [batch {k + 1} of {len(batches)}, prompts {[p.index for p in part]}; "
                                          f"the {len(results)} prompt(s) finished before are {kept}]") from e
                    raise
                pending = pending[len(part):]
                total.add(comp)
                summary()
    bar.close()
    summary()
    if writer is not None and cfg.output.alpaca_eval:
        export_alpaca_eval(writer.path, writer.path.parent / "model_outputs.json", cfg.output.alpaca_eval)
    order = {p.index: i for i, p in enumerate(todo)}
    results.sort(key=lambda r: order[r.prompt_index])
    plugins.run_end(results=results, compute=total)
    return RunOutput(results, total, Path(out_dir) if out_dir is not None else None)


def previous_compute(writer: ResultsWriter) -> Compute:
    """What the earlier runs into this directory spent (their ``summary.json``), so that a resumed run's summary
    charges all the work behind its results."""
    path = writer.path.parent / "summary.json"
    if not writer.records or not path.is_file():
        return Compute()
    return Compute.from_dict(json.loads(path.read_text(encoding="utf-8")).get("compute", {}))
