"""Replay: the real loop (``decode_batch``: the same budget arithmetic, ``RoundView``s, policy plugins and checks,
the same compute accounting) run over a recorded pool instead of a model: ``open_pool`` gives a pool and its
generator (``rodeco.replays.pool_session``), ``replay_batch`` decodes prompts of it under a run's settings, with
rewards served from the pool (``rodeco.replays.pool_rewards``); ``check_replayable`` refuses settings the pool was not
recorded with. Pools are recorded by ``rodeco.replays.recording``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rodeco.common.protocols import Generator, LoopHooks, Policy
from rodeco.common.state import Compute, PromptRef, PromptResult
from rodeco.common.validation import ConfigError
from rodeco.core.contracts import Scorer
from rodeco.core.loop import START_BY_POLICY, LoopSettings, decode_batch
from rodeco.core.rounds import rows_per_prompt
from rodeco.replays.pool import Pool
from rodeco.replays.pool_rewards import PoolReward
from rodeco.replays.pool_session import ReplayGenerator


def check_replayable(pool: Pool, s: LoopSettings, n: int | str) -> None:
    """The run's settings must be the pool's (the candidates depend on them) and ask for no more than it holds."""
    ps = pool.settings
    got = {"seed": s.seed, "temperature": s.sampling.temperature, "top_k": s.sampling.top_k, "top_p": s.sampling.top_p}
    want = {"seed": ps["seed"], **ps["sampling"]}
    for k in got:
        if got[k] != want[k]:
            key = "seed" if k == "seed" else f"sampling.{k}"
            raise ConfigError(
                key,
                got[k],
                f"the pool was recorded with {key}={want[k]}",
                f"replay with {key}={want[k]}, or record a pool with these settings",
            )
    if s.max_new_tokens > ps["max_new_tokens"]:
        raise ConfigError(
            "sampling.max_new_tokens",
            s.max_new_tokens,
            f"the pool's candidates stop at {ps['max_new_tokens']} tokens",
            f"use at most {ps['max_new_tokens']}",
        )
    if s.ignore_eos:
        raise ConfigError(
            "sampling.ignore_eos",
            True,
            "a pool records candidates up to their EOS only",
            "replay with sampling.ignore_eos=false",
        )
    if s.stop:
        raise ConfigError(
            "sampling.stop",
            list(s.stop),
            "a pool records candidates up to their EOS, not to a stop string",
            "replay with sampling.stop=[] (decode live to use stop strings)",
        )
    if n != "auto" and int(n) > pool.candidates:
        raise ConfigError(
            "n", n, f"the pool holds {pool.candidates} candidates per prompt", f"use n<={pool.candidates}"
        )


def pool_served(*scorers: Scorer | None) -> list[PoolReward]:
    """The pool-served rewards behind the scorers (each once): what a replay charges and saves."""
    served = [sc.reward for sc in scorers if sc is not None and isinstance(sc.reward, PoolReward)]
    return list({id(r): r for r in served}.values())


def replay_prompt(
    pool: Pool,
    gen: ReplayGenerator,
    reward: Scorer,
    policy: Policy,
    index: int,
    s: LoopSettings,
    first: int = 0,
    hooks: LoopHooks | None = None,
    partial: Scorer | None = None,
) -> tuple[PromptResult, Compute, float]:
    """One prompt of the pool through the real loop under ``s``: its result, its compute, and the reward seconds
    charged (``replay_batch`` of one prompt)."""
    (res,), comp, seconds = replay_batch(pool, gen, reward, policy, [index], s, first, hooks, partial)
    return res, comp, seconds


def replay_batch(
    pool: Pool,
    gen: ReplayGenerator,
    reward: Scorer,
    policy: Policy,
    indices: list[int],
    s: LoopSettings,
    first: int = 0,
    hooks: LoopHooks | None = None,
    partial: Scorer | None = None,
    on_done: Callable[[PromptResult], None] | None = None,
) -> tuple[list[PromptResult], Compute, float]:
    """Prompts of the pool decoded together, as one live batch of them (``data.batch_prompts``) would be, through
    the real loop under ``s``: their results, the batch's compute, and the reward seconds charged (the rewards'
    time as computed live). ``reward`` and ``partial`` are the roles' scorers (``Roles.reward``, ``Roles.partial``)
    over pool-served rewards (``PoolReward``, ``OracleReward``). ``n: auto`` and ``n: policy`` are capped at the
    pool's candidates; rows are candidates ``first``, ``first + 1``, ... wrapping round. ``on_done(result)`` is
    called as soon as a prompt is final; ``hooks`` (a ``Plugins``) are fired by the loop at each decision point and
    each prompt's end (after ``on_done``), as in a live run."""
    ps = [pool.prompt(i) for i in indices]
    for p in ps:
        gen.add(p)
    charged = pool_served(reward, partial)
    seconds0 = sum(r.seconds for r in charged)
    if s.n in ("auto", START_BY_POLICY):
        budget, base = s.budget.for_batch([len(p.prompt_ids) for p in ps], gen.kv)
        s = dataclasses.replace(s, n=rows_per_prompt(s, budget, base, len(ps), policy, cap=pool.candidates))
    check_replayable(pool, s, s.n)
    res, comp = decode_batch(
        gen,
        reward,
        policy,
        [PromptRef(p.index, p.text, meta=p.meta) for p in ps],
        s,
        on_done=on_done,
        partial=partial,
        first=first,
        hooks=hooks,
    )
    return res, comp, sum(r.seconds for r in charged) - seconds0


def open_pool(
    path: str | Path, key: str = "pool", live: Callable[[], Generator] | None = None
) -> tuple[Pool, ReplayGenerator]:
    """A pool and its generator; ``live`` builds the live generator that decodes copies' continuations (default:
    the pool's own, loaded on first use)."""
    pool = Pool(path, key)
    return pool, ReplayGenerator(pool, live)
