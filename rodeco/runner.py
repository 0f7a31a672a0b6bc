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

from omegaconf import DictConfig

from rodeco.common.backoff import Backoff, free_cached_memory, is_oom
from rodeco.common.hardware import cuda_count
from rodeco.common.protocols import Generator, LanguageModel
from rodeco.common.sampling import SamplingParams
from rodeco.common.state import Compute, Counts, PromptRef, PromptResult, RoundView, RunOutput
from rodeco.common.validation import ConfigError, Interrupted, PluginError, node_dict
from rodeco.common.working import WorkingMemory, working_memory
from rodeco.core.config import make_budget, winner_rule
from rodeco.core.data import Prompt, batches_of
from rodeco.core.judging import Judges, check_specs
from rodeco.core.judging import summarize as summarize_judges
from rodeco.core.loop import LoopSettings, decode_batch
from rodeco.core.results import ResultsWriter, export_alpaca_eval
from rodeco.plugins import BuildContext, Plugins
from rodeco.roles import RoleBuilder, Roles, choose_roles
from rodeco.tasks import prompts_of

log = logging.getLogger(__name__)


def check_lengths(gen: LanguageModel, prompts: list[Prompt], max_new: int, key: str) -> list[int]:
    """Each prompt's length in tokens, every prompt checked to fit the model's context with ``max_new`` more."""
    lens = [len(gen.encode(p.text)) for p in prompts]
    for p, n in zip(prompts, lens):
        if gen.max_context and n + max_new > gen.max_context:
            raise ConfigError(
                key,
                f"prompt {p.index} ({n} tokens)",
                f"prompt + sampling.max_new_tokens={max_new} exceeds the model's context ({gen.max_context} tokens)",
                "shorten or drop the prompt, or lower max_new_tokens",
            )
    return lens


def loop_settings(
    cfg: DictConfig, gen: Generator, policy_name: str = "", reward_name: str = "", row_overhead: int = 0
) -> LoopSettings:
    """The loop's settings from the config; ``row_overhead``: each row's working memory in tokens, charged when the
    budget comes from device memory (``DecodeRun``)."""
    s = cfg.sampling
    return LoopSettings(
        n=cfg.n,
        sampling=SamplingParams(s.temperature, s.top_k, s.top_p),
        max_new_tokens=s.max_new_tokens,
        budget=make_budget(cfg, gen, row_overhead=row_overhead),
        seed=cfg.seed,
        ignore_eos=s.ignore_eos,
        all_candidates=cfg.output.all_candidates,
        policy_name=policy_name,
        reward_name=reward_name,
        winner=winner_rule(cfg),
        stop=tuple(s.stop),
    )


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
    g, d = cfg.generator, cfg.data
    if g.device != "auto" or g.get("device_map") or d.get("num_shards", 1) < 2 or (count := cuda_count()) < 2:
        return g
    g = g.copy()
    g.device = f"cuda:{d.shard % count}"
    log.info("shard %d of %d runs on %s", d.shard, d.num_shards, g.device)
    return g


def row_working_memory(cfg: DictConfig, gen: Generator, roles: Roles, longest: int) -> WorkingMemory:
    """Each row's working memory in this run (``rodeco.common.working``): at the ``longest`` prompt plus max_new_tokens,
    with the log-probs and hidden states its roles read."""
    decider = roles.partial or roles.reward
    s = cfg.sampling
    return working_memory(
        gen.shape,
        context=longest + s.max_new_tokens,
        max_new_tokens=s.max_new_tokens,
        sampling=SamplingParams(s.temperature, s.top_k, s.top_p),
        needs_logprobs=roles.reward.needs_logprobs or decider.needs_logprobs,
        needs_hidden=roles.reward.needs_hidden_states or decider.needs_hidden_states,
        gathered_prompt=longest + s.max_new_tokens if gen.info.gathers_prompt else 0,
    )


def run_decode(
    cfg: DictConfig, plugins: Plugins, out_dir: str | Path | None = None, gen: Generator | None = None
) -> RunOutput:
    """One decode run: the roles chosen (unknown names fail before any model is loaded), the prompts and the
    generator loaded, the roles built, then batch after batch decoded with each result written as it is final."""
    from rodeco.core.loading import load_generator

    choices = choose_roles(cfg, plugins)
    prompts = prompts_of(cfg.data)
    gen = gen or load_generator(shard_device(cfg))
    ctx = BuildContext(generator=gen, device=str(gen.device), plugins=plugins)
    roles = RoleBuilder(plugins, gen.name, ctx).roles(choices)
    return DecodeRun(cfg, plugins, gen, roles, prompts, out_dir if out_dir is not None else cfg.output.dir).run()


class DecodeRun:
    """The steps of one decode run: plan the batches (skipping what an earlier run into the directory finished),
    decode each (backing off after an out-of-memory error, stopping cleanly on a signal), keep the summary."""

    def __init__(
        self,
        cfg: DictConfig,
        plugins: Plugins,
        gen: Generator,
        roles: Roles,
        prompts: list[Prompt],
        out_dir: str | Path | None,
    ) -> None:
        self.cfg, self.plugins, self.gen, self.roles, self.prompts = cfg, plugins, gen, roles, prompts
        self.out_dir = out_dir
        roles.check_records(prompts)  # a judge's gold answers: before any prompt is decoded
        key = "data.path" if cfg.data.path else "data.prompts"
        lens = check_lengths(gen, prompts, cfg.sampling.max_new_tokens, key)  # each prompt encoded once
        self.working = row_working_memory(cfg, gen, roles, max(lens, default=1))
        # charged only where the budget comes from device memory; reported in every mode (summary.json)
        self.overhead = self.working.tokens(gen.kv_bytes_per_token) if cfg.budget.mode == "device" else 0
        self.settings = loop_settings(cfg, gen, roles.choices.policy.name, roles.choices.reward.name, self.overhead)
        self.peak_rows = 0
        self.writer = ResultsWriter(out_dir, resume=cfg.output.resume) if out_dir is not None else None
        self.judged_before = previous_judges(self.writer, roles.judges) if self.writer is not None else {}
        self.batches = self.plan()
        self.todo = [p for b in self.batches for p in b]
        self.before = previous_compute(self.writer) if self.writer is not None else Compute()
        self.total = Compute()
        self.results: list[PromptResult] = []
        self.backoff = Backoff(
            cfg.data.batch_prompts,
            {"device": "budget.memory_fraction", "unlimited": None, "engine": "budget (the engine's KV pool)"}.get(
                cfg.budget.mode, "budget.kv_tokens"
            ),
        )
        self.stop: list[str] = []

    def plan(self) -> list[list[Prompt]]:
        """The batches still to decode. They are fixed by the whole prompt list, so a resumed run decodes the
        batches it would have decoded."""
        done = self.writer.done() if self.writer is not None else set()
        batches = [
            b
            for b in (
                [p for p in b if p.index not in done] for b in batches_of(self.prompts, self.cfg.data.batch_prompts)
            )
            if b
        ]
        todo = sum(map(len, batches))
        if done:
            assert self.writer is not None  # prompts are done only in a writer's results
            log.info(
                "resuming: %d of %d prompts already in %s",
                len(self.prompts) - todo,
                len(self.prompts),
                self.writer.path,
            )
        log.info("decoding %d of %d prompts in %d batch(es)", todo, len(self.prompts), len(batches))
        return batches

    def run(self) -> RunOutput:
        from tqdm.auto import tqdm

        self.plugins.run_start(config=node_dict(self.cfg), n_prompts=len(self.todo))
        self.bar = tqdm(
            total=len(self.todo), desc="prompts", unit="prompt", disable=not self.cfg.output.progress, delay=2.0
        )
        with stop_on_signals() as self.stop:
            self.judge_written()
            for k, batch in enumerate(self.batches):
                self.decode(k, batch)
        self.bar.close()
        self.write_summary()
        if self.writer is not None and self.cfg.output.alpaca_eval:
            export_alpaca_eval(
                self.writer.path, self.writer.path.parent / "model_outputs.json", self.cfg.output.alpaca_eval
            )
        order = {p.index: i for i, p in enumerate(self.todo)}
        self.results.sort(key=lambda r: order[r.prompt_index])
        self.plugins.run_end(results=self.results, compute=self.total)
        extra = {"judge": self.judge_summary()} if self.roles.judges or self.judged_before else {}
        return RunOutput(self.results, self.total, Path(self.out_dir) if self.out_dir is not None else None, extra)

    def decode(self, k: int, batch: list[Prompt]) -> None:
        """Batch ``k``, in parts of the back-off's batch size; after an out-of-memory error, its unfinished
        prompts again, smaller."""
        pending = batch
        while pending:
            self.stop_if_asked()
            part = pending[: self.backoff.batch_prompts]
            try:
                res, comp = decode_batch(
                    self.gen,
                    self.roles.reward,
                    self.roles.policy,
                    [PromptRef(p.index, p.text, meta=p.meta) for p in part],
                    self.settings,
                    on_round=self.on_round,
                    on_done=self.on_done,
                    partial=self.roles.partial,
                    hooks=self.plugins,
                )
            except Exception as e:
                if isinstance(e, PluginError):
                    raise self.located(e, k, part) from e
                if not is_oom(e):
                    raise
                self.back_off(e, part)
                finished = {r.prompt_index for r in self.results}
                pending = [p for p in pending if p.index not in finished]
                continue
            pending = pending[len(part) :]
            self.peak_rows = max(self.peak_rows, sum(r.n_start for r in res))  # rows only shrink after the start
            self.total.add(comp)
            self.write_summary()

    def back_off(self, e: BaseException, part: list[Prompt]) -> None:
        free_cached_memory()
        self.backoff.shrink(e, len(part))
        self.settings = replace(
            self.settings, budget=make_budget(self.cfg, self.gen, self.backoff.budget_scale, self.overhead)
        )

    def located(self, e: PluginError, k: int, part: list[Prompt]) -> PluginError:
        """A plugin's failure, with where the run was and where what it finished is kept."""
        kept = (
            f"kept in {self.writer.path}"
            if self.writer is not None
            else "not kept: no output dir (out_dir=... keeps results as they finish)"
        )
        return PluginError(
            f"{e} [batch {k + 1} of {len(self.batches)}, prompts {[p.index for p in part]}; "
            f"the {len(self.results)} prompt(s) finished before are {kept}]"
        )

    def stop_if_asked(self) -> None:
        if self.stop:
            raise Interrupted(
                self.stop[0],
                len(self.results),
                len(self.todo),
                str(self.writer.path) if self.writer is not None else None,
            )

    def on_round(self, view: RoundView, counts: list[Counts]) -> None:
        """A decision point (its hook fired by the loop): stop here if a signal came."""
        self.stop_if_asked()

    def on_done(self, result: PromptResult) -> None:
        """A prompt's result: judged, written, kept (the loop fires its hook after this)."""
        self.roles.judges.judge_result(result)  # after the winner is chosen; a failing judge leaves its score null
        if self.writer is not None:
            self.writer.write(result.to_dict())
        self.results.append(result)
        self.bar.update(1)

    def judge_written(self) -> None:
        """Score what the results already in the directory lack for this run's judges (a resumed run's, or those a
        judge failed on)."""
        if self.writer is None or not self.roles.judges:
            return
        changed = [self.roles.judges.judge_record(rec) for rec in self.writer.records.values()]
        if any(changed):
            log.info("judged %d earlier result(s) that lacked a score", sum(changed))
            self.writer.save()
            self.write_summary()

    def judge_summary(self) -> dict:
        records = self.writer.records.values() if self.writer is not None else [r.to_dict() for r in self.results]
        return summarize_judges(records, self.roles.judges, self.judged_before)

    def write_summary(self) -> None:
        """``summary.json``: everything the results in the directory cost, this run and the ones it resumed."""
        if self.writer is None:
            return
        spent = Compute()
        spent.add(self.before)
        spent.add(self.total)
        c = self.roles.choices
        self.writer.write_json(
            "summary.json",
            {
                "compute": spent.to_dict(),
                "n_prompts": len(self.writer.records),
                "prompts_total": len(self.prompts),
                "complete": len(self.writer.records) >= len(self.prompts),
                "policy": c.policy.name,
                "reward": c.reward.name,
                "partial_reward": c.partial.name,
                "working_memory": {
                    **self.working.to_dict(),
                    "charged_tokens_per_row": self.overhead,
                    "budget_mode": self.cfg.budget.mode,
                    "peak_rows": self.peak_rows,
                    "peak_bytes_modelled": self.peak_rows * self.working.total,
                },
                **({"memory": memory} if (memory := self.gen.memory_report()) is not None else {}),
                **({"judge": self.judge_summary()} if self.roles.judges or self.judged_before else {}),
            },
        )


def previous_judges(writer: ResultsWriter, judges: Judges) -> dict:
    """The ``judge`` section of the directory's ``summary.json`` (judges' configs and costs so far), with this run's
    judges checked against it: one of the same name with another config is refused."""
    path = writer.path.parent / "summary.json"
    if not writer.records or not path.is_file():
        return {}
    previous = json.loads(path.read_text(encoding="utf-8")).get("judge", {})
    check_specs(previous, judges, str(writer.path.parent))
    return previous


def previous_compute(writer: ResultsWriter) -> Compute:
    """What the earlier runs into this directory spent (their ``summary.json``), so that a resumed run's summary
    charges all the work behind its results."""
    path = writer.path.parent / "summary.json"
    if not writer.records or not path.is_file():
        return Compute()
    return Compute.from_dict(json.loads(path.read_text(encoding="utf-8")).get("compute", {}))
