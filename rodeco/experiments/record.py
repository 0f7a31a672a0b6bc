"""``rodeco experiment=pool``: record ``experiment_args.candidates`` candidates per prompt of the run's prompts into
the pool directory ``pool=DIR`` (default: ``pool/`` in the run directory), with the run's reward's final scores.
Each prompt is written as it finishes; a rerun records only the prompts missing and refuses a pool recorded with
other settings. Other experiments (``replay``, ``efficiency``, ``perplexity``, ``correlation``) read pools."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from rodeco.common.protocols import Generator, Reward
from rodeco.common.state import Compute, RunOutput
from rodeco.core.config import candidate_settings
from rodeco.core.data import Prompt, batches_of
from rodeco.plugins import BuildContext, Plugins
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.replays.pool_session import ReplayGenerator
from rodeco.replays.recording import measure_step_costs, pool_settings, record_prompts
from rodeco.roles import RoleBuilder, choose_roles
from rodeco.runner import check_lengths, loop_settings
from rodeco.tasks import prompts_of

log = logging.getLogger(__name__)


def pool_dir(cfg: DictConfig, out_dir: Path | None) -> Path:
    if cfg.pool is not None:
        return Path(cfg.pool)
    if out_dir is None:
        from rodeco.common.validation import ConfigError

        raise ConfigError("pool", None, "no pool directory", "give pool=DIR")
    return Path(out_dir) / "pool"


def pool_roles(cfg: DictConfig, plugins: Plugins, pool: Pool, gen=None) -> RoleBuilder:
    """Builds the run's roles with their rewards served from (and filling) the pool's cache."""
    live = gen is not None and not isinstance(gen, ReplayGenerator)
    ctx = BuildContext(generator=gen if live else None, device="cpu", plugins=plugins)
    return RoleBuilder(plugins, str(pool.settings["generator"].get("model", "")), ctx, pool=pool)


def served(reward: Reward) -> PoolReward:
    """``reward`` as the ``PoolReward`` that a builder with a pool (``pool_roles``) builds every reward as."""
    if not isinstance(reward, PoolReward):
        raise TypeError(f"a {type(reward).__name__} is not served from a pool")
    return reward


def pool_reward(cfg: DictConfig, plugins: Plugins, pool: Pool, gen=None) -> PoolReward:
    """The run's reward, served from (and filling) the pool's cache."""
    return served(pool_roles(cfg, plugins, pool, gen).reward(choose_roles(cfg, plugins, live=False).reward))


def record(
    cfg: DictConfig,
    plugins: Plugins,
    path: Path,
    prompts: list[Prompt],
    candidates: int,
    gen: Generator | None = None,
    top_logprobs: int = 0,
    batch_prompts: int = 1,
    hidden_states: bool = True,
) -> Pool:
    """Record into the pool at ``path`` every prompt of ``prompts`` it lacks, with the run's reward's final scores
    (``top_logprobs``: each position's k most likely tokens' log-probs too)."""
    from tqdm.auto import tqdm

    from rodeco.core.loading import load_generator

    if path.is_dir() and (path / "pool.json").is_file():
        pool = Pool(path)
        todo = [p for p in prompts if not pool.has(p.index)]
        if not todo and pool.step_costs is not None:
            return pool
    gen = gen or load_generator(cfg.generator)
    s = loop_settings(cfg, gen)
    check_lengths(gen, prompts, s.max_new_tokens, "data.path" if cfg.data.path else "data.prompts")
    pool = Pool.create(path, pool_settings(gen, s, candidates, candidate_settings(cfg.generator), top_logprobs))
    if not (path / "tokenizer").is_dir():
        tmp = Path(tempfile.mkdtemp(dir=path, prefix=".tokenizer-"))
        gen.tokenizer.save_pretrained(tmp)
        tmp.rename(path / "tokenizer")
    scorer = pool_roles(cfg, plugins, pool, gen).scorers(choose_roles(cfg, plugins, live=False))[0]
    reward = served(scorer.reward)
    todo = [p for p in prompts if not pool.has(p.index)]
    if len(todo) < len(prompts):
        log.info("resuming: %d of %d prompts already in %s", len(prompts) - len(todo), len(prompts), path)
    hidden = hidden_states and gen.info.hidden  # vLLM keeps its hidden states: such a pool has none
    bar = tqdm(total=len(todo), desc="pool", unit="prompt", disable=not cfg.output.progress)
    for batch in batches_of(todo, batch_prompts):
        for rec, states in record_prompts(gen, pool, batch, s, hidden):
            scorer(rec.final_requests())  # the final rewards, cached with their cost
            reward.save()
            if states is not None:
                pool.write_hidden(rec.index, states)
            pool.write_prompt(rec)  # last: a prompt in the pool has its final rewards and hidden states
            log.info("prompt %d: %d candidates in %.1f s", rec.index, len(rec.candidates), rec.record_seconds)
        bar.update(len(batch))
    bar.close()
    if pool.step_costs is None:  # once the pool is complete, on a machine as quiet as the recording's
        log.info("measuring decode step times at 1 to %d rows", candidates)
        pool.write_step_costs(measure_step_costs(gen, prompts[0], s, candidates))
    return pool


def run(cfg: DictConfig, plugins: Plugins, out_dir: Path | None) -> RunOutput:
    path = pool_dir(cfg, out_dir)
    prompts = prompts_of(cfg.data)
    a = cfg.experiment_args
    pool = record(
        cfg,
        plugins,
        path,
        prompts,
        int(a.candidates),
        top_logprobs=int(a.get("top_logprobs", 0)),
        batch_prompts=int(a.get("batch_prompts", 1)),
        hidden_states=bool(a.get("hidden_states", True)),
    )
    seconds = sum(pool.prompt(p.index).record_seconds for p in prompts)
    n_cands = sum(len(pool.prompt(p.index).candidates) for p in prompts)
    print(f"pool: {path} ({len(prompts)} prompts, {n_cands} candidates)")
    print(f"pool_seconds: {seconds:.1f}")
    return RunOutput(
        [],
        Compute(),
        out_dir,
        extra={"pool": str(path), "pool_seconds": seconds, "prompts": [p.index for p in prompts]},
    )
