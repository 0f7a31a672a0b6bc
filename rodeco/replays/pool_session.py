"""A pool served as a generator (``rodeco.common.protocols.Generator``): what ``rodeco.replays.replay`` runs the real
loop over.

- ``ReplayGenerator`` stands in for the generator: the pool's prompt ids, its saved tokenizer, the model's sizes
  (FLOPs and KV bytes) and a model-free engine layout (``rodeco.engines.layout``) that allocates as the engine the
  pool was recorded with does.
- Its sessions are torch sessions (``rodeco.core.session.TorchSession``) on that layout whose rows' tokens (and
  log-probs, hidden states) are the recorded ones of each candidate (``RecordedRows``). A copy
  (a forking policy's count above 1) continues with the pool's continuation of it: decoded once, on demand, by the
  live generator (``live_generator``) from its parent's tokens with its own stream
  (``ReplayGenerator.continuations``), stored in the pool under its stream and served from there afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rodeco.common.protocols import EngineInfo, Generator
from rodeco.common.shape import KVSpec
from rodeco.common.state import OpenPrompt, SamplingParams, SessionSpec
from rodeco.common.validation import ConfigError
from rodeco.core.generator import TorchGenerator
from rodeco.core.session import TorchSession
from rodeco.engines.layout import LAYOUTS
from rodeco.replays.pool import Pool, PoolPrompt, check_top_k, rounded_top, top_k_of


class ReplayGenerator:
    """A ``rodeco.common.protocols.Generator`` served from a pool: no model is loaded; its sessions replay the recorded
    candidates (``RecordedRows``) on a model-free layout of the engine the pool was recorded with."""

    device = torch.device("cpu")

    def __init__(self, pool: Pool, live: Callable[[], Generator] | None = None) -> None:
        from transformers import AutoTokenizer

        s = pool.settings
        self.pool, self.shape, self.name = pool, pool.shape, str(s["generator"].get("model", ""))
        self.tokenizer: Any = AutoTokenizer.from_pretrained(pool.path / "tokenizer")  # as ModelGenerator's
        self.eos_ids, self.pad_id = list(s["eos_ids"]), int(s["pad_id"])
        self.dtype = s.get("dtype", "")
        self.eos_tensor = torch.tensor(self.eos_ids)
        self.kv_bytes_per_token, self.max_context = self.shape.kv_bytes_per_token, self.shape.max_context
        # replayed on the CPU: torch's top-k, no host syncs to spare; prompts may join (the layouts admit as the
        # engines do), so an arrival trace replays through the open loop
        # (``rodeco.replays.replay_open.replay_arrivals``)
        self.info = EngineInfo(name=s["engine"])  # hidden: the pool's recorded states, where it has them
        self.layout = LAYOUTS[self.info.name]
        # pools recorded before blocks were recorded are of rodeco's engines: block 1
        self.kv = KVSpec(self.layout.shares_prefix, int(s.get("kv_block", 1)), self.layout.aligned)
        self._ids: dict[str, list[int]] = {}
        self._live_factory = live or (lambda: live_generator(pool))
        self._live: TorchGenerator | None = None
        self.continuation_seconds = 0.0  # spent decoding copies' continuations that the pool did not hold
        self.continued = 0  # continuations decoded (the rest served from the pool)
        self.opened: TorchSession | None = None  # the last session opened (what a modelled clock reads its steps from)

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
            sess = live.open_session(SessionSpec(needs_logprobs=True, top_logprobs=top_k_of(ps)))
            op = OpenPrompt(len(miss), int(ps["max_new_tokens"]), sampling, int(ps["seed"]), stream_key, index)
            sess.admit([self.pool.prompt(index).prompt_ids], [op])
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
                    **({"top_logprobs": rounded_top(r.top_logprobs)} if r.top_logprobs is not None else {}),
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

    def live(self) -> TorchGenerator:
        """The live generator that decodes continuations: loaded on first use (the pool's generator settings)."""
        if self._live is None:
            live = self._live_factory()
            if not isinstance(live, TorchGenerator):
                raise ConfigError(
                    "generator.engine",
                    live.info.name,
                    "continuations of copies are decoded with rodeco's own engines (fast, hf)",
                    "replay with generator.engine=fast",
                )
            self._live = live
        return self._live

    def add(self, p: PoolPrompt) -> None:
        self._ids[p.text] = p.prompt_ids

    def encode(self, prompt: str | list[dict[str, str]]) -> list[int]:
        """The recorded ids of a prompt of the pool, by its text (``add``)."""
        if not isinstance(prompt, str):
            raise TypeError("a pool's prompts are texts: a conversation was not recorded")
        return self._ids[prompt]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def flops_per_token(self, context: int) -> float:
        return self.shape.flops_per_token(context)

    def layer_devices(self) -> dict[str, int]:
        return {"cpu": self.shape.n_layers}

    def memory_report(self) -> None:
        return None

    def open_session(self, spec: SessionSpec) -> TorchSession:
        # the torch session over the engine's model-free layout, its rows' tokens the recorded ones; finished rows
        # leave the batch when they would live (compact_fraction)
        self.opened = TorchSession(
            self,
            spec,
            self.layout(self.kv.block, spec.kv_tokens),
            self.layout.compact_fraction,
            source=RecordedRows(self, spec),
        )
        return self.opened


class RecordedRows:
    """The pool's candidates as a session's rows (``rodeco.core.session.RowSource``): the row of stream ``c``
    (``first``, ``first + 1``, ...) emits the recorded tokens of pool candidate ``c mod M`` of its prompt (M: the pool's
    candidates per prompt), and finishes where the recording did. An offset ``first`` draws another set of
    candidates (wrapping round), as another seed would. A starting row's candidate id, stream and pool index are the
    one number ``c mod M``; a copy emits its continuation (``ReplayGenerator.continuations``)."""

    def __init__(self, gen: ReplayGenerator, spec: SessionSpec) -> None:
        self.gen, self.pool = gen, gen.pool
        self.indices = np.zeros(0, dtype=np.int64)  # per prompt: its dataset index, the pool's key
        self.rec = torch.empty(0, 0, dtype=torch.long)  # [B, T] each row's recorded tokens (EOS included)
        self.rec_lp = torch.empty(0, 0)  # [B, T] their log-probs
        self.k = check_top_k(self.pool, spec.top_logprobs)  # the top-k log-probs the pool records at each position
        self.rec_top = torch.empty(0, 0, self.k)  # [B, T, k] the k most likely tokens' log-probs

    def _recorded(self, sess: TorchSession, rows: range, T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The recorded tokens (EOS included), log-probs and top-k log-probs of ``rows``, ``T`` wide; their ids
        made pool ids."""
        sess.cand[rows.start : rows.stop] %= self.pool.candidates  # pool candidate ids
        sess.stream[rows.start : rows.stop] = sess.cand[rows.start : rows.stop]
        rec = torch.full((len(rows), T), self.gen.pad_id, dtype=torch.long)
        lp = torch.zeros((len(rows), T))
        top = torch.zeros((len(rows), T, self.k))
        for j, r in enumerate(rows):
            cand = self.pool.prompt(int(self.indices[sess.prompt_of[r]])).candidates[int(sess.cand[r])]
            toks = (cand.token_ids + ([cand.stop] if cand.stop is not None else []))[:T]
            rec[j, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            lp[j, : min(len(cand.logprobs), T)] = torch.tensor(cand.logprobs[:T])
            if self.k and cand.top_logprobs:
                top[j, : min(len(cand.top_logprobs), T)] = torch.tensor(cand.top_logprobs[:T])
        return rec, lp, top

    def admitted(self, sess: TorchSession, prompts: list[OpenPrompt], rows: range) -> None:
        """Prompts joined the batch: their ``rows`` (the last ones) emit their recorded candidates from their own
        step 0; the recordings widen to the longest length asked (the pool's at most: ``check_replayable``)."""
        self.indices = np.append(self.indices, [op.index for op in prompts]).astype(np.int64)
        T = max(self.rec.shape[1], *(op.max_new_tokens for op in prompts))
        rec, lp, top = self._recorded(sess, rows, T)
        self.rec = torch.cat([_widen(self.rec, T, self.gen.pad_id), rec])
        self.rec_lp = torch.cat([_widen(self.rec_lp, T, 0.0), lp])
        self.rec_top = torch.cat([_widen(self.rec_top, T, 0.0), top])

    def _at(self, buf: torch.Tensor, steps: int | np.ndarray) -> torch.Tensor:
        """Each row's entry at its own step (its prompt's clock)."""
        if isinstance(steps, int):
            return buf[:, steps]
        return buf[torch.arange(buf.shape[0]), torch.from_numpy(steps)]

    def tokens(self, sess: TorchSession) -> torch.Tensor:
        return self._at(self.rec, sess.steps())

    def logprobs(self, sess: TorchSession, tok: torch.Tensor) -> torch.Tensor:
        return self._at(self.rec_lp, sess.steps())

    def top_logprobs(self, sess: TorchSession, k: int) -> torch.Tensor:
        return self._at(self.rec_top, sess.steps())[:, :k]

    def hidden(self, sess: TorchSession) -> torch.Tensor | None:
        """The recorded state that sampled each row's latest token (zeros for a row that joined and has none yet:
        a prompt is scored only at its own decision points, never at its step 0); a finished row's last one."""
        steps = np.broadcast_to(np.asarray(sess.steps(), dtype=np.int64), (sess.rows,))
        steps = np.minimum(steps, sess.n_tok.cpu().numpy())  # a finished row's tokens stop at its last
        if not sess.rows or int(steps.max()) == 0:
            return None
        idx = torch.from_numpy(self.indices[sess.prompt_of])
        parts = {p: self.pool.hidden(p) for p in idx.unique().tolist()}
        out = torch.empty(sess.rows, next(iter(parts.values())).shape[-1])
        for p, h in parts.items():
            rows = (idx == p).nonzero()[:, 0].numpy()
            at = np.maximum(steps[rows] - 1, 0)
            got = torch.from_numpy(np.asarray(h[sess.cand[rows], at], dtype=np.float32))
            out[rows] = torch.where(torch.from_numpy(steps[rows] > 0)[:, None], got, 0.0)
        return out

    def selected(self, rows: torch.Tensor) -> None:
        self.rec, self.rec_lp, self.rec_top = self.rec[rows], self.rec_lp[rows], self.rec_top[rows]

    def forking(self, sess: TorchSession) -> None:
        if sess.needs_hidden:
            raise ConfigError(
                "partial_reward",
                "a reward that reads hidden states",
                "a pool records no hidden states of copies",
                "replay forking policies with a partial reward that reads text",
            )

    def forked(self, sess: TorchSession, parent_streams: list[int], slots: list[int], streams: list[int]) -> None:
        """Copies as live makes them; each then emits its continuation from the pool (decoded on first use)."""
        by_prompt: dict[int, list[int]] = {}
        for j, r in enumerate(slots):
            by_prompt.setdefault(int(sess.prompt_of[r]), []).append(j)
        T = self.rec.shape[1]
        for p, js in by_prompt.items():
            t = sess.clock(p)
            conts = self.gen.continuations(
                int(self.indices[p]),
                int(sess.stream_keys[p]),
                [parent_streams[j] for j in js],
                t,
                [sess.out[slots[j], :t].tolist() for j in js],
                [streams[j] for j in js],
            )
            for j, c in zip(js, conts):
                r = slots[j]
                toks = (c["tokens"] + ([c["stop"]] if c["stop"] is not None else []))[:T]
                self.rec[r, t:] = self.gen.pad_id
                self.rec[r, t : len(toks)] = torch.tensor(toks[t:], dtype=torch.long)
                self.rec_lp[r, t : min(len(c["logprobs"]), T)] = torch.tensor(c["logprobs"][t:T])
                top = c.get("top_logprobs") or []
                if self.k and len(top) > t:
                    self.rec_top[r, t : min(len(top), T)] = torch.tensor(top[t:T])


def live_generator(pool: Pool, compile_step: bool = False) -> Generator:
    """The generator a pool was recorded with, loaded from its settings (what decodes copies' continuations);
    ``compile_step``: its compiled decode step (the same tokens in fp32, faster on CPU)."""
    from omegaconf import OmegaConf

    from rodeco.core.loading import load_generator

    node = OmegaConf.create(pool.settings["generator"])
    if compile_step:
        node.compile = True
    return load_generator(node)


def _widen(buf: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """``buf`` [B, W, ...] widened to ``width`` columns of ``fill``."""
    if buf.shape[1] >= width:
        return buf
    return torch.cat([buf, buf.new_full((buf.shape[0], width - buf.shape[1], *buf.shape[2:]), fill)], dim=1)
