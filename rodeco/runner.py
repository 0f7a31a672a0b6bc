"""``run_decode(cfg)``: one decode run. Builds the reward and the policy from the config, loads the prompts and
the generator, decodes batch after batch, and writes each prompt's result as soon as it is final."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rodeco.calibration import identities
from rodeco.config import make_budget, split_node
from rodeco.contracts import Scorer
from rodeco.data import Prompt, prompts_of
from rodeco.generator import Generator
from rodeco.loop import LoopSettings, decode_batch
from rodeco.plugins import BuildContext, Plugins
from rodeco.results import ResultsWriter, export_alpaca_eval
from rodeco.sampling import SamplingParams
from rodeco.state import Compute, PromptResult, RunOutput
from rodeco.validation import ConfigError, Interrupted

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
    boundary, its results intact); a second SIGINT interrupts at once. Main thread only (elsewhere: no handlers)."""
    got: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def handler(signum: int, frame: object) -> None:
        if got and signum == signal.SIGINT:
            raise KeyboardInterrupt
        got.append(signal.Signals(signum).name)
        log.warning("%s: stopping at the next decision point (the results so far are kept)", got[-1])

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_decode(cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None = None,
               gen: Generator | None = None) -> RunOutput:
    from tqdm.auto import tqdm

    from rodeco.loading import load_generator

    r_name, p_name = split_node(cfg.reward, "reward")[0], split_node(cfg.policy, "policy")[0]
    plugins.rewards.get(r_name), plugins.policies.get(p_name)  # unknown names fail before any model is loaded
    live_partial_name(cfg, plugins)
    prompts = prompts_of(cfg.data)
    gen = gen or load_generator(cfg.generator)
    ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
    scorer, partial = build_scorers(cfg, plugins, ctx)
    ctx.identities = run_identities(gen.name, scorer, partial)
    policy = plugins.build_policy(cfg.policy, ctx)
    check_lengths(gen, prompts, cfg.sampling.max_new_tokens, "data.path" if cfg.data.path else "data.prompts")
    settings = loop_settings(cfg, gen, p_name, r_name)
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
    written: list[PromptResult] = []

    def stop_if_asked(stop: list[str]) -> None:
        if stop:
            raise Interrupted(stop[0], len(written), len(todo), str(writer.path) if writer is not None else None)

    with stop_on_signals() as stop:
        def on_round(view, kept) -> None:  # a decision point: stop here if a signal came
            plugins.round_end(view, kept)
            stop_if_asked(stop)

        def on_done(result: PromptResult) -> None:
            done(result)
            written.append(result)

        for i in range(0, len(todo), bs):
            stop_if_asked(stop)
            batch = [(p.index, p.text) for p in todo[i: i + bs]]
            res, comp = decode_batch(gen, scorer, policy, batch, settings, on_round=on_round, on_done=on_done,
                                     partial=partial)
            results += res
            total.add(comp)
            bar.update(len(batch))
    bar.close()
    if writer is not None:
        writer.write_json("summary.json", {"compute": total.to_dict(), "n_prompts": len(results),
                                           "policy": p_name, "reward": r_name,
                                           "partial_reward": split_node(cfg.partial_reward, "partial_reward")[0]})
        if cfg.output.alpaca_eval:
            export_alpaca_eval(writer.path, writer.path.parent / "model_outputs.json", cfg.output.alpaca_eval)
    plugins.run_end(results=results, compute=total)
    return RunOutput(results, total, Path(out_dir) if out_dir is not None else None)
