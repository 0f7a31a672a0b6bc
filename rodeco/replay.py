"""Replay: the real loop (``decode_batch``: the same budget arithmetic, ``RoundView``s, policy plugins and checks,
the same compute accounting) run over a recorded pool instead of a model.

- ``ReplayGenerator`` stands in for the generator: the pool's prompt ids, its saved tokenizer, the model's sizes
  (FLOPs and KV bytes) and a model-free engine layout (``rodeco.engines.layout``) that allocates as the engine the
  pool was recorded with does.
- ``PoolSession`` is a ``Session`` whose next tokens (and log-probs) are the recorded ones of each candidate. A copy
  (a forking policy's count above 1) continues with the pool's continuation of it: decoded once, on demand, by the
  live generator from its parent's tokens with its own stream (``ReplayGenerator.continuations``), stored in the pool
  under its stream and served from there afterwards.
- ``PoolReward`` serves rewards from the pool's cache, computing what is missing on first use, and charges every
  request the tokens, FLOPs and seconds it cost when it was computed, as a live run would pay them.
- ``OracleReward`` (``partial_reward=oracle``) scores a partial response with its candidate's final reward: the
  ceiling a perfect decision-time scorer would reach with the same schedule and samples.
- ``record_prompt`` records one prompt of a pool with the live model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rodeco.contracts import Scorer, reward_cost, reward_info
from rodeco.data import Prompt
from rodeco.engines.layout import LAYOUTS
from rodeco.generator import TorchGenerator
from rodeco.loop import START_BY_POLICY, LoopSettings, decode_batch, rows_per_prompt, session_spec
from rodeco.pool import Pool, PoolCandidate, PoolPrompt
from rodeco.protocols import EngineInfo, Generator, Policy, Reward, RewardCost
from rodeco.sampling import COPY_BIT
from rodeco.session import TorchSession
from rodeco.shape import KVSpec
from rodeco.state import Compute, PromptRef, PromptResult, SamplingParams, ScoreRequest, SessionSpec
from rodeco.validation import ConfigError

# ModelShape fields a pool's settings leave out: pools recorded before they existed must still extend
UNRECORDED_SHAPE = ("vocab_size", "hidden_size")


def pool_settings(gen: Generator, s: LoopSettings, candidates: int, generator_cfg: dict[str, Any]) -> dict[str, Any]:
    """What a pool's candidates depend on; replaying needs the same, extending the pool too."""
    return {
        "candidates": candidates,
        "max_new_tokens": s.max_new_tokens,
        "seed": s.seed,
        "sampling": {"temperature": s.sampling.temperature, "top_k": s.sampling.top_k, "top_p": s.sampling.top_p},
        "generator": generator_cfg,
        "engine": gen.info.name,
        "shape": {k: v for k, v in gen.shape.to_dict().items() if k not in UNRECORDED_SHAPE},
        "dtype": str(gen.dtype),
        "eos_ids": gen.eos_ids,
        "pad_id": gen.pad_id,
        **({"kv_block": gen.kv.block} if gen.kv.block != 1 else {}),
    }  # pools of rodeco's engines: as before


def record_prompt(gen: Generator, pool: Pool, prompt: Prompt, s: LoopSettings) -> tuple[PoolPrompt, np.ndarray | None]:
    """Decode ``pool.candidates`` candidates of one prompt to the end, as Best-of-M with no budget would, with the
    same random streams as a live run (candidate ``i`` of prompt ``index``). Returns them with their costs, and the
    hidden states ``[M, max_new_tokens, hidden]`` (float16): ``[c, t]`` is the state that sampled candidate ``c``'s
    token ``t`` (what a ``needs_hidden_states`` reward gets at length ``t + 1``; zeros past the candidate's end), or
    None where the engine keeps them to itself (vLLM)."""
    t0 = time.perf_counter()
    sess = gen.open_session(
        session_spec(
            s,
            pool.candidates,
            [PromptRef(prompt.index, prompt.text)],
            needs_logprobs=True,
            record_hidden=gen.provides_hidden,
        )
    )
    ids = gen.encode(prompt.text)
    sess.prefill([ids])
    prefill_s = time.perf_counter() - t0
    rows = sess.decode(until=s.max_new_tokens) + sess.retire_finished()
    rows.sort(key=lambda r: r.candidate_id)
    st = sess.stats
    hidden = None
    if sess.hidden_log:
        width = sess.hidden_log[0][2].shape[-1]
        hidden = np.zeros((pool.candidates, s.max_new_tokens, width), dtype=np.float16)
        for t, cand, h in sess.hidden_log:
            hidden[cand, t] = h.float().cpu().numpy()
    return PoolPrompt(
        index=prompt.index,
        text=prompt.text,
        prompt_ids=ids,
        prefill_seconds=prefill_s,
        candidates=[PoolCandidate(r.token_ids, gen.decode_text(r.token_ids), r.logprobs or [], r.stop) for r in rows],
        steps={"rows": st.step_rows, "context": st.step_context, "seconds": st.step_seconds},
        record_seconds=time.perf_counter() - t0,
    ), hidden


def measure_step_costs(
    gen: Generator, prompt: Prompt, s: LoopSettings, max_rows: int, steps: int = 48
) -> dict[str, Any]:
    """Decode step times of the live engine at 1, 2, 4, ..., ``max_rows`` rows of one prompt (``steps`` steps each,
    EOS ignored so the batch stays full): what the time model of replayed runs is fitted to."""
    out: dict[str, Any] = {"rows": [], "context": [], "seconds": [], "prompt_index": prompt.index}
    ids = gen.encode(prompt.text)
    rows = [2**j for j in range(int(np.log2(max_rows)) + 1)]
    for r in rows:
        sess = gen.open_session(SessionSpec(r, s.sampling, steps + 1, s.seed, (prompt.index,), ignore_eos=True))
        sess.prefill([ids])
        sess.decode(until=steps + 1)
        st = sess.stats
        out["rows"] += st.step_rows
        out["context"] += st.step_context
        out["seconds"] += st.step_seconds
    return out


class ReplayGenerator:
    """A ``rodeco.protocols.Generator`` served from a pool: no model is loaded; its sessions replay the recorded
    candidates (``PoolSession``) on a model-free layout of the engine the pool was recorded with."""

    device = torch.device("cpu")
    provides_hidden = True  # the pool's recorded hidden states, where it has them (Pool.hidden)
    kv_pool_tokens = None

    def __init__(self, pool: Pool, live: Callable[[], Generator] | None = None) -> None:
        from transformers import AutoTokenizer

        s = pool.settings
        self.pool, self.shape, self.name = pool, pool.shape, str(s["generator"].get("model", ""))
        self.tokenizer = AutoTokenizer.from_pretrained(pool.path / "tokenizer")
        self.eos_ids, self.pad_id = list(s["eos_ids"]), int(s["pad_id"])
        self.dtype = s.get("dtype", "")
        self.eos_tensor = torch.tensor(self.eos_ids)
        self.kv_bytes_per_token, self.max_context = self.shape.kv_bytes_per_token, self.shape.max_context
        self.info = EngineInfo(name=s["engine"])  # replayed on the CPU: torch's top-k, no host syncs to spare
        self.layout = LAYOUTS[self.info.name]
        # pools recorded before blocks were recorded are of rodeco's engines: block 1
        self.kv = KVSpec(shares_prefix=self.layout.shares_prefix, block=int(s.get("kv_block", 1)))
        self._ids: dict[str, list[int]] = {}
        self._live_factory, self._live = live or (lambda: live_generator(pool)), None
        self.continuation_seconds = 0.0  # spent decoding copies' continuations that the pool did not hold
        self.continued = 0  # continuations decoded (the rest served from the pool)

    def continuations(
        self, index: int, stream_key: int, parents: list[int], step: int, prefixes: list[list[int]], streams: list[int]
    ) -> list[dict[str, Any]]:
        """The continuations of copies of prompt ``index`` made after ``step`` tokens: copy ``j`` holds
        ``prefixes[j]`` (its parent's tokens, of stream ``parents[j]``) and has stream ``streams[j]``. Served from
        the pool; the missing ones decoded together by the live generator, as the live copy continues: its parent's
        tokens fed step by step (``TorchSession.force``), then sampled with its own stream to the pool's
        ``max_new_tokens``; stored in the pool at once."""
        have = self.pool.continuations(index)
        miss = [j for j, st in enumerate(streams) if str(st) not in have]
        if miss:
            t0 = time.perf_counter()
            ps = self.pool.settings
            live = self.live()
            sampling = SamplingParams(**ps["sampling"])
            sess = live.open_session(
                SessionSpec(
                    len(miss), sampling, int(ps["max_new_tokens"]), int(ps["seed"]), (stream_key,), needs_logprobs=True
                )
            )
            sess.prefill([self.pool.prompt(index).prompt_ids])
            sess.stream[:] = [streams[j] for j in miss]
            sess.cand[:] = miss
            sess.force(torch.tensor([prefixes[j] for j in miss], dtype=torch.long).reshape(len(miss), step))
            rows = sess.decode(until=int(ps["max_new_tokens"])) + sess.retire_finished()
            seconds = (time.perf_counter() - t0) / len(miss)
            for r in rows:
                j = r.candidate_id
                assert r.token_ids[:step] == prefixes[j], "a continuation must start with its parent's tokens"
                have[str(streams[j])] = {
                    "parent": parents[j],
                    "step": step,
                    "tokens": r.token_ids,
                    "logprobs": r.logprobs,
                    "stop": r.stop,
                    "seconds": seconds,
                    "text": live.decode_text(r.token_ids),
                }
            self.pool.write_continuations(index, have)
            self.continuation_seconds += time.perf_counter() - t0
            self.continued += len(miss)
        out = [have[str(st)] for st in streams]
        for e, p, st in zip(out, parents, streams):
            if e["parent"] != p or e["step"] != step:
                raise ConfigError(
                    "pool",
                    str(self.pool.path),
                    f"continuation {st} of prompt {index} was stored for "
                    f"parent {e['parent']} at step {e['step']}, not {p} at {step}",
                    "remove the pool's continuations/ folder (it is rebuilt on demand)",
                )
        return out

    def live(self) -> Generator:
        """The live generator that decodes continuations: loaded on first use (the pool's generator settings)."""
        if self._live is None:
            self._live = self._live_factory()
            if not isinstance(self._live, TorchGenerator):
                raise ConfigError(
                    "generator.engine",
                    self._live.info.name,
                    "continuations of copies are decoded with rodeco's own engines (fast, hf)",
                    "replay with generator.engine=fast",
                )
        return self._live

    def add(self, p: PoolPrompt) -> None:
        self._ids[p.text] = p.prompt_ids

    def encode(self, text: str) -> list[int]:
        return self._ids[text]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def flops_per_token(self, context: int) -> float:
        return self.shape.flops_per_token(context)

    def layer_devices(self) -> dict[str, int]:
        return {"cpu": self.shape.n_layers}

    def memory_report(self) -> None:
        return None

    def open_session(self, spec: SessionSpec) -> PoolSession:
        # finished rows leave the batch when they would live (compact_fraction)
        return PoolSession(self, spec, self.layout(self.kv.block), self.layout.compact_fraction)


class PoolSession(TorchSession):
    """A session whose candidates are the pool's: the row of stream ``c`` (``first``, ``first + 1``, ...) emits
    the recorded tokens of pool candidate ``c mod M`` of its prompt (M: the pool's candidates per prompt), and
    finishes where the recording did. An offset ``first`` draws another set of candidates (wrapping round), as
    another seed would. A starting row's candidate id, stream and pool index are the one number ``c mod M``; a
    copy emits its continuation (``ReplayGenerator.continuations``)."""

    def __init__(self, gen: ReplayGenerator, spec: SessionSpec, engine: Any, compact_fraction: float) -> None:
        super().__init__(gen, spec, engine, compact_fraction)
        self.pool = gen.pool
        self.indices = np.asarray(spec.indices, dtype=np.int64)  # per prompt: its dataset index, the pool's key

    def prefill(self, prompt_ids: list[list[int]]) -> None:
        super().prefill(prompt_ids)
        self.cand = self.cand % self.pool.candidates  # pool candidate ids
        self.stream = self.cand.copy()
        B, T = self.rows, self.max_new
        self.rec = torch.full((B, T), self.gen.pad_id, dtype=torch.long)
        self.rec_lp = torch.zeros((B, T))
        for r, (p, c) in enumerate(zip(self.indices[self.prompt_of], self.cand)):
            cand = self.pool.prompt(int(p)).candidates[int(c)]
            toks = (cand.token_ids + ([cand.stop] if cand.stop is not None else []))[:T]
            self.rec[r, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            self.rec_lp[r, : min(len(cand.logprobs), T)] = torch.tensor(cand.logprobs[:T])

    def _next_tokens(self) -> torch.Tensor:
        return self.rec[:, self.t]

    def _hidden(self) -> torch.Tensor | None:
        """The recorded state that sampled each row's latest token."""
        if self.t == 0:
            return None
        idx = torch.from_numpy(self.indices[self.prompt_of])
        parts = {p: self.pool.hidden(p) for p in idx.unique().tolist()}
        out = torch.empty(self.rows, next(iter(parts.values())).shape[-1])
        for p, h in parts.items():
            rows = (idx == p).nonzero()[:, 0]
            out[rows] = torch.from_numpy(np.asarray(h[self.cand[rows.numpy()], self.t - 1], dtype=np.float32))
        return out

    def _logprobs(self, tok: torch.Tensor) -> torch.Tensor:
        return self.rec_lp[:, self.t]

    def select(self, rows: torch.Tensor) -> None:
        super().select(rows)
        self.rec, self.rec_lp = self.rec[rows.cpu()], self.rec_lp[rows.cpu()]

    def fork(self, parents: list[int], ids: list[int], streams: list[int]) -> list[int]:
        """Copies as live makes them; each then emits its continuation from the pool (decoded on first use)."""
        if self.needs_hidden:
            raise ConfigError(
                "partial_reward",
                "a reward that reads hidden states",
                "a pool records no hidden states of copies",
                "replay forking policies with a partial reward that reads text",
            )
        parent_streams = [int(self.stream[r]) for r in parents]
        slots = super().fork(parents, ids, streams)
        by_prompt: dict[int, list[int]] = {}
        for j, r in enumerate(slots):
            by_prompt.setdefault(int(self.prompt_of[r]), []).append(j)
        T, t = self.max_new, self.t
        for p, js in by_prompt.items():
            conts = self.gen.continuations(
                int(self.indices[p]),
                int(self.keys[p]),
                [parent_streams[j] for j in js],
                t,
                [self.out[slots[j], :t].tolist() for j in js],
                [streams[j] for j in js],
            )
            for j, c in zip(js, conts):
                r = slots[j]
                toks = (c["tokens"] + ([c["stop"]] if c["stop"] is not None else []))[:T]
                self.rec[r, t:] = self.gen.pad_id
                self.rec[r, t : len(toks)] = torch.tensor(toks[t:], dtype=torch.long)
                self.rec_lp[r, t : min(len(c["logprobs"]), T)] = torch.tensor(c["logprobs"][t:T])
        return slots


class PoolReward:
    """A reward served from the pool's cache (``scores/<key>/``): each (prompt, candidate, length, partial) is
    computed once by ``reward``, on first use, and charged to every run that asks for it with the tokens, FLOPs and
    seconds it cost then (a call's cost is shared among its requests in proportion to their lengths)."""

    def __init__(self, pool: Pool, reward: Reward, key: str) -> None:
        self.pool, self.reward, self.key = pool, reward, key
        self.info = reward_info(reward)
        self.needs_logprobs, self.needs_hidden_states = self.info.needs_logprobs, self.info.needs_hidden_states
        self.cost = RewardCost()
        self.seconds = 0.0  # charged: what the requests served took when they were computed
        self.computed = 0  # requests computed (cache misses)
        self._entries: dict[int, dict[str, list[float]]] = {}
        self._dirty: set[int] = set()

    @property
    def identity(self) -> str | None:
        return self.info.identity

    def entries(self, index: int) -> dict[str, list[float]]:
        if index not in self._entries:
            self._entries[index] = self.pool.scores(self.key, index)
        return self._entries[index]

    @staticmethod
    def _key(r: ScoreRequest) -> str:
        """A starting candidate by its id (as before copies existed), a copy by its stream, which names its
        lineage under any policy (its id is only the next free one of its run)."""
        who = f"s{r.stream}" if r.stream is not None and r.stream & COPY_BIT else str(r.candidate_id)
        return f"{who}:{len(r.response_ids)}:{int(r.partial)}"

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        miss = [r for r in requests if self._key(r) not in self.entries(r.prompt_index)]
        if miss:
            self._compute(list({(r.prompt_index, self._key(r)): r for r in miss}.values()))
        out = []
        for r in requests:
            score, tokens, flops, seconds = self.entries(r.prompt_index)[self._key(r)]
            self.cost.tokens += tokens
            self.cost.flops += flops
            self.seconds += seconds
            out.append(score)
        self.cost.calls += 1
        return out

    def final_score(self, index: int, candidate: int, stream: int | None = None) -> float:
        """Candidate ``candidate``'s final reward (a copy's, by its ``stream``: its stored continuation's), computed
        on first use, charged to no one."""
        p = self.pool.prompt(index)
        if stream is not None and stream & COPY_BIT:
            c = self.pool.continuations(index)[str(stream)]
            req = ScoreRequest(
                p.text,
                c["text"],
                tuple(c["tokens"]),
                partial=False,
                prompt_index=index,
                candidate_id=candidate,
                logprobs=tuple(c["logprobs"]),
                stream=stream,
            )
        else:
            req = p.request(candidate)
        if self._key(req) not in self.entries(index):
            self._compute([req])
        return self.entries(index)[self._key(req)][0]

    def _compute(self, reqs: list[ScoreRequest]) -> None:
        cost = reward_cost(self.reward)
        t0, f0 = (cost.tokens, cost.flops) if cost is not None else (0, 0.0)
        start = time.perf_counter()
        scores = list(self.reward.score(reqs))
        seconds = time.perf_counter() - start
        t1, f1 = (cost.tokens, cost.flops) if cost is not None else (0, 0.0)
        weights = np.array([len(r.response_ids) + 1 for r in reqs], dtype=np.float64)
        share = weights / weights.sum()
        for r, sc, w in zip(reqs, scores, share):
            self.entries(r.prompt_index)[self._key(r)] = [float(sc), (t1 - t0) * w, (f1 - f0) * w, seconds * w]
            self._dirty.add(r.prompt_index)
        self.computed += len(reqs)

    def save(self) -> None:
        for index in sorted(self._dirty):
            self.pool.write_scores(self.key, index, self._entries[index])
        self._dirty.clear()


class OracleReward:
    """``partial_reward=oracle``: each partial response scored with its candidate's final reward under ``final``,
    and charged what ``final`` costs on the partial response (what ``partial_reward=same`` pays), so that oracle
    rows differ from ``same`` rows only in what they decide."""

    identity = None

    def __init__(self, final: PoolReward) -> None:
        self.final = final
        self.cost = final.cost  # one tally: charging a partial request goes through the final reward's cache

    def score(self, requests: Sequence[ScoreRequest]) -> list[float]:
        self.final.score(requests)  # the charge
        return [self.final.final_score(r.prompt_index, r.candidate_id, r.stream) for r in requests]


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


def replay_prompt(
    pool: Pool,
    gen: ReplayGenerator,
    reward: Scorer,
    policy: Policy,
    index: int,
    s: LoopSettings,
    first: int = 0,
    on_round=None,
    partial: Scorer | None = None,
) -> tuple[PromptResult, Compute, float]:
    """One prompt of the pool through the real loop under ``s``: its result, its compute, and the reward seconds
    charged (``replay_batch`` of one prompt)."""
    (res,), comp, seconds = replay_batch(pool, gen, reward, policy, [index], s, first, on_round, partial)
    return res, comp, seconds


def replay_batch(
    pool: Pool,
    gen: ReplayGenerator,
    reward: Scorer,
    policy: Policy,
    indices: list[int],
    s: LoopSettings,
    first: int = 0,
    on_round=None,
    partial: Scorer | None = None,
) -> tuple[list[PromptResult], Compute, float]:
    """Prompts of the pool decoded together, as one live batch of them (``data.batch_prompts``) would be, through
    the real loop under ``s``: their results, the batch's compute, and the reward seconds charged (the rewards'
    time as computed live). ``reward`` and ``partial`` are the roles' scorers (``Roles.reward``, ``Roles.partial``)
    over pool-served rewards (``PoolReward``, ``OracleReward``). ``n: auto`` and ``n: policy`` are capped at the
    pool's candidates; rows are candidates ``first``, ``first + 1``, ... wrapping round."""
    ps = [pool.prompt(i) for i in indices]
    for p in ps:
        gen.add(p)
    served = [reward.reward] + ([partial.reward] if partial is not None else [])
    charged = list({id(r): r for r in served if isinstance(r, PoolReward)}.values())
    seconds0 = sum(r.seconds for r in charged)
    if s.n in ("auto", START_BY_POLICY):
        budget, base = s.budget.for_batch([len(p.prompt_ids) for p in ps], gen.kv)
        s = dataclasses.replace(s, n=rows_per_prompt(s, budget, base, len(ps), policy, cap=pool.candidates))
    check_replayable(pool, s, s.n)
    res, comp = decode_batch(
        gen,
        reward,
        policy,
        [PromptRef(p.index, p.text) for p in ps],
        s,
        on_round=on_round,
        partial=partial,
        first=first,
    )
    return res, comp, sum(r.seconds for r in charged) - seconds0


def live_generator(pool: Pool, compile_step: bool = False) -> Generator:
    """The generator a pool was recorded with, loaded from its settings (what decodes copies' continuations);
    ``compile_step``: its compiled decode step (the same tokens in fp32, faster on CPU)."""
    from omegaconf import OmegaConf

    from rodeco.loading import load_generator

    node = OmegaConf.create(pool.settings["generator"])
    if compile_step:
        node.compile = True
    return load_generator(node)


def open_pool(
    path: str | Path, key: str = "pool", live: Callable[[], Generator] | None = None
) -> tuple[Pool, ReplayGenerator]:
    """A pool and its generator; ``live`` builds the live generator that decodes copies' continuations (default:
    the pool's own, loaded on first use)."""
    pool = Pool(path, key)
    return pool, ReplayGenerator(pool, live)
