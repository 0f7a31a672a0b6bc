"""A live batch of candidate rows on a torch forward engine: what the loop needs between decision points
(``rodeco.common.protocols.Session``; opened by ``rodeco.core.generator.TorchGenerator.open_session``).

``TorchSession`` holds the engine's KV cache, which prompt and candidate each row is, the tokens generated so far,
per-row EOS, and (only when a reward asks) per-token log-probs and the final-layer hidden state of each row's latest
token (the state whose logits sampled it). A session opens empty; ``admit`` forwards each prompt once and fans its
cache out to its ``n`` rows, on the prompt's own clock, sampling, length and stop strings (``OpenPrompt``), whether
the batch is new or running; ``decode``, ``retire_finished`` and ``reject`` each return the rows that left the batch;
``fork`` copies rows (cache, tokens, log-probs) into new candidates next to their parents. ``force`` makes the rows
emit given tokens first (a pool's continuation of a copy is decoded from its parent's tokens so, step by step as the
live copy's parent was).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from rodeco.common.protocols import Generator
from rodeco.common.rows import BookColumn, RowBook
from rodeco.common.sampling import device_uniforms, row_keys, sample, uniforms
from rodeco.common.state import OpenPrompt, Row, SamplingParams, SessionSpec, SessionStats
from rodeco.common.stops import StopStrings
from rodeco.engines import Forward

__all__ = ["Row", "RowSource", "SessionStats", "TorchSession"]


class SessionGenerator(Generator, Protocol):
    """The generator of a ``TorchSession`` (``rodeco.core.generator.TorchGenerator``, or a pool's ``ReplayGenerator``):
    a ``Generator`` with its EOS ids as a tensor on its device."""

    eos_tensor: torch.Tensor


class RowSource(Protocol):
    """Where a session's tokens come from instead of sampling: a recorded pool's candidates
    (``rodeco.replays.pool_session.RecordedRows``). The session calls it at each point where its rows' tokens, log-probs
    or hidden states are decided or its rows are reordered; everything else (the engine, the budget's bookkeeping, the
    stats) stays the session's."""

    def tokens(self, sess: TorchSession) -> torch.Tensor: ...  # [B] this step's tokens
    def logprobs(self, sess: TorchSession, tok: torch.Tensor) -> torch.Tensor: ...  # [B] their log-probs
    def top_logprobs(self, sess: TorchSession, k: int) -> torch.Tensor: ...  # [B, k] the k most likely tokens'
    def hidden(self, sess: TorchSession) -> torch.Tensor | None: ...  # [B, hidden] or None
    def selected(self, rows: torch.Tensor) -> None: ...  # the rows were kept / repeated / reordered so
    def admitted(self, sess: TorchSession, prompts: list[OpenPrompt], rows: range) -> None: ...  # prompts joined
    def forking(self, sess: TorchSession) -> None: ...  # before a fork: may refuse it
    def forked(self, sess: TorchSession, parent_streams: list[int], slots: list[int], streams: list[int]) -> None: ...


class TorchSession:
    """Candidate rows of several prompts decoding together. Rows are sampled independently of each other: row
    ``(prompt, candidate)`` draws its random numbers from ``(seed, stream key of the prompt, the row's stream,
    step)``, so candidate ``i`` is the same sample whichever other rows share its batch."""

    prompt_of, cand, stream = BookColumn(), BookColumn(), BookColumn()  # per row, in batch order (``book``)

    def __init__(
        self,
        gen: SessionGenerator,
        spec: SessionSpec,
        engine: Forward,
        compact_fraction: float = 0.25,
        source: RowSource | None = None,
    ) -> None:
        self.gen, self.spec, self.engine = gen, spec, engine
        self.source = source  # the rows' tokens from a recording instead of sampling (a pool's replay)
        self.needs_logprobs = spec.needs_logprobs
        self.top_k = spec.top_logprobs  # k: each step's k most likely tokens' log-probs are kept (0: none)
        self.compact_fraction = compact_fraction
        # per prompt (its batch key): its stream key, seed, step when it started, length, sampling and stop strings
        self.stream_keys = np.zeros(0, dtype=np.uint64)
        self.seeds = np.zeros(0, dtype=np.int64)
        self.born = np.zeros(0, dtype=np.int64)
        self.max_new_of = np.zeros(0, dtype=np.int64)
        self.sampling_of: list[SamplingParams] = []
        self.stops_of: list[StopStrings] = []
        self.eos = gen.eos_tensor if not spec.ignore_eos else torch.tensor([-1], device=gen.device)  # never sampled
        self.needs_hidden = spec.needs_hidden or spec.record_hidden
        self.engine.keep_hidden = self.needs_hidden
        self.hidden: torch.Tensor | None = None  # [B, hidden] the state that sampled each row's latest token
        # when a list: (step, candidate ids, hidden [B, hidden]) appended before each token is sampled (pools)
        self.hidden_log: list[tuple[int, np.ndarray, torch.Tensor | None]] | None = [] if spec.record_hidden else None
        self.book = RowBook()  # which prompt, candidate and stream each row is
        self.t = 0  # the session's steps
        self.forced: torch.Tensor | None = None  # [B, L] tokens the rows emit at steps 0..L-1 instead of sampling
        dev = gen.device
        self.out = torch.zeros((0, 0), dtype=torch.long, device=dev)  # [B, W] each row's tokens, on its own clock
        self.lp = torch.zeros((0, 0), device=dev) if self.needs_logprobs else None
        self.top = torch.zeros((0, 0, self.top_k), device=dev) if self.top_k else None
        self.n_tok = torch.zeros(0, dtype=torch.long, device=dev)  # tokens kept per row (EOS included)
        self.finished = torch.zeros(0, dtype=torch.bool, device=dev)
        self.stopped = torch.zeros(0, dtype=torch.bool, device=dev)  # finished by a stop string
        self.pending: torch.Tensor | None = None  # sampled tokens not yet fed to the model
        self.logits: torch.Tensor | None = None  # None once sampled from (a pending token was fed)
        self.stats = SessionStats(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        # where the engine says (``EngineInfo``: off the CPU) a step waits for nothing on the host: the random numbers
        # are drawn on the device (``device_uniforms``, from each row's seed and key, uploaded once per selection), and
        # the finished rows are counted one step late (``_finished_count``, CUDA); on CPU neither waits
        info = gen.info
        self.device_uniforms = info.draws_on_device
        self.lag_finished = info.counts_finished_late
        self._draw_keys: tuple[torch.Tensor, torch.Tensor] | None = None  # device_uniforms' seeds and keys
        self._fin_host: torch.Tensor | None = None  # the last step's finished count, on its way to the host
        self._fin_event: torch.cuda.Event | None = None  # recorded behind that copy (CUDA)
        self._fin_pending = False  # a count of the current rows is in ``_fin_host``
        self._aside: dict[int, _Aside] = {}  # rows set aside (``park``), by handle
        self._handles = 0

    @property
    def rows(self) -> int:
        return len(self.prompt_of)

    def _next_tokens(self) -> torch.Tensor:
        """[B] this step's tokens: sampled from the logits with each row's own random stream (or forced)."""
        if self.source is not None:
            return self.source.tokens(self)
        if self.forced is not None and self.t < self.forced.shape[1]:
            return self.forced[:, self.t]
        logits = self.logits
        assert logits is not None  # set by prefill or by this step's forward
        steps = self.steps()
        if self.device_uniforms and isinstance(steps, int):  # every row at one step: drawn on the device
            if self._draw_keys is None:  # after a selection: each row's seed and key, once
                dev = logits.device
                seed = torch.from_numpy(self.seeds[self.prompt_of]).to(dev)
                self._draw_keys = seed, torch.from_numpy(self._row_keys().view(np.int64)).to(dev)
            u = device_uniforms(*self._draw_keys, steps)
        else:
            u = torch.from_numpy(uniforms(self.seeds[self.prompt_of], self._row_keys(), steps)).to(logits.device)
        return self._sample_each(logits, u)

    def _sample_each(self, logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Each row sampled with its prompt's settings: one call per distinct setting."""
        settings = [self.sampling_of[p] for p in self.prompt_of]
        if all(x == settings[0] for x in settings):
            return sample(logits, u, settings[0])
        tok = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for sp in set(settings):
            rows = torch.tensor([i for i, x in enumerate(settings) if x == sp], device=logits.device)
            tok[rows] = sample(logits[rows], u[rows], sp)
        return tok

    def steps(self) -> int | np.ndarray:
        """Tokens generated by each active row: one number while every row's prompt started at the same step, else
        per row (each prompt's own clock)."""
        s = self.t - self.born[self.prompt_of]
        return int(s[0]) if len(s) and bool((s == s[0]).all()) else s

    def clock(self, prompt: int) -> int:
        """Tokens generated by each active row of ``prompt`` (its batch key)."""
        return int(self.t - self.born[prompt])

    def _logprobs(self, tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B] the generator's log-probability of each row's token, and [B, k] the ``k`` most likely tokens' (None
        unless the spec asks for them)."""
        if self.source is not None:
            top = self.source.top_logprobs(self, self.top_k) if self.top_k else None
            return self.source.logprobs(self, tok), top
        assert self.logits is not None  # the logits this step sampled from
        lsm = torch.log_softmax(self.logits.float(), -1)
        return lsm.gather(-1, tok[:, None])[:, 0], (lsm.topk(self.top_k, dim=-1).values if self.top_k else None)

    def _track_memory(self) -> None:
        tokens = self.engine.allocated_tokens
        if tokens > self.stats.peak_kv_tokens:
            self.stats.peak_kv_tokens = tokens
            self.stats.peak_kv_bytes = tokens * self.gen.kv_bytes_per_token

    def _row_keys(self) -> np.ndarray:
        return row_keys(self.stream_keys[self.prompt_of], self.stream)

    @torch.inference_mode()
    def decode(self, until: int, pause: int | None = None) -> list[Row]:
        """Generate until every active row has ``until`` tokens (or has finished); with ``pause``, return early once
        they have ``pause`` (the cache stays sized for ``until``: a caller checking something every few tokens).
        Returns the rows that left on the way: all of them at ``max_new_tokens``, else finished rows once they are
        a ``compact_fraction`` of the batch (the rest stay until ``retire_finished``)."""
        until = min(until, int((self.born + self.max_new_of).max())) if self.rows else until  # each row stops at its
        # prompt's own length too
        stop_at = until if pause is None else min(pause, until)
        left: list[Row] = []
        while self.t < stop_at and self.rows:
            t0, pending = time.perf_counter(), self.pending
            stepped = pending is not None
            if pending is not None:
                self._step(pending)
            if self.hidden_log is not None:
                self.hidden_log.append((self.t, self.cand.copy(), self._hidden()))
            tok = torch.where(self.finished, self.gen.pad_id, self._next_tokens())
            steps = self.steps()
            if self.lp is not None or self.top is not None:
                lp, top = self._logprobs(tok)
                if self.lp is not None:
                    _put(self.lp, steps, lp)
                if self.top is not None and top is not None:
                    _put(self.top, steps, top)
            _put(self.out, steps, tok)
            self.t += 1
            self.n_tok = torch.where(self.finished, self.n_tok, self.n_tok + 1)
            self.finished |= torch.isin(tok, self.eos)
            if any(self.stops_of):
                self._stop_strings()
            self.pending = tok
            n_fin = self._finished_count()
            full = self._at_length()  # on the host: reading it waits for nothing
            if n_fin == self.rows or full.all():
                left += self._retire(torch.ones_like(self.finished))
            elif full.any():
                left += self._retire(torch.from_numpy(full).to(self.finished.device) | self.finished)
            elif n_fin >= max(1, self.compact_fraction * self.rows):
                left += self._retire(self.finished)
            if stepped:  # the whole step: forward, sampling, bookkeeping
                self.stats.step_seconds.append(time.perf_counter() - t0)
        return left

    def _step(self, pending: torch.Tensor) -> None:
        """Feed the rows' pending tokens: the next logits (and hidden states), charged to each prompt by its rows
        and its context (its prompt and its own tokens)."""
        st, context = self.stats, self.engine.length
        before = self.hidden if self.needs_hidden else None
        self.logits = self.hidden = None  # sampled from already: let the step not hold them and its own
        self.logits = self.engine.step(pending)  # [B, V]
        self.hidden = self.engine.last_hidden
        if before is not None and self.hidden is not None:  # a finished row keeps the state of its last step
            self.hidden = torch.where(self.finished[:, None], before.to(self.hidden.dtype), self.hidden)
        counts = np.bincount(self.prompt_of, minlength=len(st.decode_tokens))
        st.decode_tokens += counts
        # each prompt's rows at its own context: its prompt and the tokens cached before this one
        ctx = st.prefill_tokens + np.maximum(self.t - self.born - 1, 0)
        live = counts > 0
        st.decode_flops[live] += counts[live] * np.array([self.gen.flops_per_token(int(c)) for c in ctx[live]])
        st.steps += 1
        st.step_rows.append(self.rows)
        st.step_context.append(context)
        self._track_memory()

    def _at_length(self) -> np.ndarray:
        """[B] the rows that reached their prompt's ``max_new_tokens``."""
        return (self.t - self.born[self.prompt_of]) >= self.max_new_of[self.prompt_of]

    @torch.inference_mode()
    def admit(self, prompt_ids: list[list[int]], prompts: list[OpenPrompt]) -> list[int]:
        """Prompts join the batch (new or running) between steps: each is forwarded once, its cache fanned out to its
        ``n`` rows after the rows there are, and it starts its own clock; the rows there feed their pending tokens
        first, so every row samples its next token at the next step. Returns the new prompts' batch keys. Every
        prompt's rows draw on their own clock (``steps``), so a prompt's candidates are the samples it would draw
        alone."""
        if self.pending is not None and self.rows:
            t0 = time.perf_counter()
            self._step(self.pending)
            self.stats.step_seconds.append(time.perf_counter() - t0)
        self.pending = None
        gen, dev, B0, P0, P = self.gen, self.gen.device, self.rows, len(self.born), len(prompt_ids)
        L = max(len(p) for p in prompt_ids)
        ids = torch.full((P, L), gen.pad_id, dtype=torch.long)
        mask = torch.zeros((P, L), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, L - len(p) :] = torch.tensor(p)
            mask[i, L - len(p) :] = 1
        logits = self.engine.admit(ids.to(dev), mask.to(dev))  # [P, V]
        last = self.engine.last_hidden
        n = [op.n for op in prompts]
        fan = torch.arange(P, device=dev).repeat_interleave(torch.tensor(n, device=dev))
        self.engine.select(torch.cat([torch.arange(B0, device=dev), B0 + fan]))
        old_logits = self.logits if self.logits is not None and B0 else logits[:0]
        self.logits = torch.cat([old_logits, logits[fan]])
        if self.needs_hidden and last is not None:
            old_hidden = self.hidden if self.hidden is not None and B0 else last[:0]
            self.hidden = torch.cat([old_hidden, last[fan]])
        # the prompts' own settings
        self.stream_keys = np.append(self.stream_keys, np.array([op.stream_key for op in prompts], dtype=np.uint64))
        self.seeds = np.append(self.seeds, [op.seed for op in prompts]).astype(np.int64)
        self.born = np.append(self.born, np.full(P, self.t, dtype=np.int64))
        self.max_new_of = np.append(self.max_new_of, [op.max_new_tokens for op in prompts]).astype(np.int64)
        self.sampling_of += [op.sampling for op in prompts]
        self.stops_of += [StopStrings(tuple(op.stop)) for op in prompts]
        st = self.stats
        st.prefill_tokens = np.append(st.prefill_tokens, [len(p) for p in prompt_ids]).astype(np.int64)
        st.decode_tokens = np.append(st.decode_tokens, np.zeros(P, np.int64))
        st.decode_flops = np.append(st.decode_flops, np.zeros(P))
        self.book.admit(P0, n, [op.first for op in prompts])
        # per row: the new rows hold nothing yet; the buffers widen to the longest length asked
        width = max(self.out.shape[1], *(op.max_new_tokens for op in prompts))
        rows = len(fan)
        self.out = _grow(self.out, rows, width, gen.pad_id)
        self.lp = _grow(self.lp, rows, width, 0.0) if self.lp is not None else None
        self.top = _grow(self.top, rows, width, 0.0) if self.top is not None else None
        self.n_tok = torch.cat([self.n_tok, torch.zeros(rows, dtype=torch.long, device=dev)])
        self.finished = torch.cat([self.finished, torch.zeros(rows, dtype=torch.bool, device=dev)])
        self.stopped = torch.cat([self.stopped, torch.zeros(rows, dtype=torch.bool, device=dev)])
        self._draw_keys, self._fin_pending = None, False
        if self.source is not None:
            self.source.admitted(self, prompts, range(B0, B0 + rows))
        self._track_memory()
        return list(range(P0, P0 + P))

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """How many tokens more (at most ``most``) the rows ``rows`` can each sample while the cache they hold, plus
        ``row_overhead`` tokens a row, stays within ``tokens``: the engine's own count of the steps that feed them
        (``Forward.steps_within``). A row's latest token is fed at the next step, so right after an admission (no
        token pending) the first token takes no step."""
        free = int(self.pending is None and most > 0)
        return free + self.engine.steps_within(rows, tokens, row_overhead, most - free)

    def _finished_count(self) -> int:
        """How many rows have finished. With ``lag_finished`` (CUDA): as of the previous step, whose count was copied
        to the host behind that step's work, so reading it waits for nothing this step queued; 0 on the first step
        after a selection (whose rows the count was not of). A row that finishes is thus retired a step later (it
        emits padding meanwhile, charged), and its tokens are the same."""
        if not self.lag_finished:
            return int(self.finished.sum())
        n = 0
        if self._fin_pending:
            if self._fin_event is not None:
                self._fin_event.synchronize()
            assert self._fin_host is not None  # a pending count was copied into it
            n = int(self._fin_host.numpy()[0])
        if self._fin_host is None:  # once: a pinned buffer and an event on CUDA (on CPU, a test, the copy is done)
            cuda = self.finished.is_cuda
            self._fin_host = torch.zeros(1, dtype=torch.long, pin_memory=cuda)
            self._fin_event = torch.cuda.Event() if cuda else None
        self._fin_host.copy_(self.finished.sum().view(1), non_blocking=True)
        if self._fin_event is not None:
            self._fin_event.record()
        self._fin_pending = True
        return n

    def _stop_strings(self) -> None:
        """Rows whose text now holds a stop string finish (``rodeco.common.stops``)."""
        live = (~self.finished).nonzero()[:, 0].tolist()
        if not live:
            return
        hit = []
        for i in live:  # each prompt's own stop strings, on its own clock
            stops, n = self.stops_of[int(self.prompt_of[i])], self.clock(int(self.prompt_of[i]))
            if (
                stops
                and stops.ended([self.out[i, max(0, n - stops.tail_tokens) : n].tolist()], self.gen.decode_text)[0]
            ):
                hit.append(i)
        if hit:
            self.finished[hit] = True
            self.stopped[hit] = True

    def finished_rows(self) -> np.ndarray:
        """[rows] whether each row has finished (EOS, a stop string, its length) and waits to be retired."""
        return self.finished.cpu().numpy()

    def retire_finished(self, prompts: Collection[int] | None = None) -> list[Row]:
        """Move the rows that reached EOS out of the batch (``prompts``: only those prompts' rows); returns them."""
        which = self.finished
        if prompts is not None:
            which = which & torch.from_numpy(np.isin(self.prompt_of, list(prompts))).to(which.device)
        return self._retire(which) if bool(which.any()) else []

    def _retire(self, which: torch.Tensor) -> list[Row]:
        idx = which.nonzero()[:, 0].tolist()
        n_tok, fin, stop = self.n_tok.tolist(), self.finished.tolist(), self.stopped.tolist()
        left = [self._finished(i, n_tok[i], "stop" if stop[i] else "eos" if fin[i] else "length") for i in idx]
        self._with_hidden(left, idx)
        self.select((~which).nonzero()[:, 0])
        return left

    def _with_hidden(self, left: list[Row], idx: list[int]) -> None:
        """Rows ``idx`` leaving as ``left`` carry the state of their last step (when a reward asks): a finished
        row's is the one that sampled its last token (EOS included), after reading its whole response."""
        h = self._hidden() if self.needs_hidden and left else None
        if h is not None:
            got = h[torch.tensor(idx, dtype=torch.long, device=h.device)].float().cpu().numpy()
            for row, x in zip(left, got):
                row.hidden = x

    def _finished(self, i: int, n: int, reason: str) -> Row:
        lps = self.lp[i, :n].tolist() if self.lp is not None else None
        top = self.top[i, :n].tolist() if self.top is not None else None
        return self.book.leaving(i, self.out[i, :n].tolist(), lps, reason, self.gen.eos_ids, top)

    def reject(self, rows: list[int]) -> list[Row]:
        """Drop active rows (batch indices) after a decision point; returns them with their text so far."""
        steps = self.steps()
        left = [self._finished(i, steps if isinstance(steps, int) else int(steps[i]), "rejected") for i in rows]
        self._with_hidden(left, rows)
        keep = sorted(set(range(self.rows)) - set(rows))
        self.select(torch.tensor(keep, dtype=torch.long))
        return left

    def fork(self, parents: list[int], ids: list[int], streams: list[int]) -> list[int]:
        """Copy rows: copy ``j`` of row ``parents[j]`` (a batch index) becomes candidate ``ids[j]`` with stream
        ``streams[j]``, holding its parent's cache, tokens, log-probs and pending token; copies go right after their
        parent, so rows stay grouped by prompt. Returns the copies' batch indices."""
        source = self.source
        if source is not None:
            source.forking(self)
            parent_streams = [int(self.stream[r]) for r in parents]  # what the source continues each copy from
        order, slots = self.book.fork(parents, ids, streams)
        # the book is reordered; the draw keys follow at the next draw
        self._select(torch.tensor(order, dtype=torch.long))
        self._track_memory()
        if source is not None:
            source.forked(self, parent_streams, slots, streams)
        return slots

    def force(self, tokens: torch.Tensor) -> None:
        """Make every row emit ``tokens[row, t]`` at steps ``t < tokens.shape[1]`` (call after ``admit``, at step 0)."""
        self.forced = tokens.to(self.out.device)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (batch indices, repeats copy a row): cache, tokens and metadata alike."""
        self.book.take(rows.cpu().numpy())
        self._select(rows)

    @property
    def parks(self) -> bool:
        """Whether a prompt's rows can be set aside while the others decode (``park``): where the engine can, and
        the rows are sampled (not a recording's, nor forced)."""
        return self.engine.parks and self.source is None and self.forced is None and self.hidden_log is None

    def park(self, prompts: Collection[int]) -> int:
        """Set the rows of ``prompts`` (batch keys) aside, their cache, tokens and pending token kept: the other rows
        decode without them, and their prompts' clocks stop until ``unpark``. Returns its handle."""
        if not self.parks:
            raise NotImplementedError("this session cannot set rows aside (parks is False)")
        rows = np.flatnonzero(np.isin(self.prompt_of, list(prompts)))
        keep = torch.from_numpy(np.setdiff1d(np.arange(self.rows), rows))
        idx = torch.from_numpy(rows).to(self.out.device)
        aside = _Aside(
            self.engine.park(idx),
            self.t,
            np.asarray(sorted(set(prompts)), dtype=np.int64),
            (self.prompt_of[rows], self.cand[rows], self.stream[rows]),
            {k: None if v is None else v[idx] for k, v in self._per_row().items()},
        )
        self._handles += 1
        self._aside[self._handles] = aside
        self.book.take(keep.numpy())
        self._select(keep, engine=False)
        return self._handles

    def unpark(self, handle: int) -> None:
        """Rows set aside by ``park`` come back after the rows there are, their prompts' clocks going on where they
        stopped (each prompt's candidates are the samples it draws alone). Where one side has a token pending and the
        other has its logits (prompts admitted meanwhile), the pending side feeds its token first, as ``admit``
        does."""
        a = self._aside.pop(handle)
        self.born[a.prompts] += self.t - a.t
        pending_there = self.pending is not None or not self.rows
        if a.rows["pending"] is not None and not pending_there:
            here = self.park(np.unique(self.prompt_of))  # the parked rows alone feed their pending tokens
            self._restore(a)
            self._feed()
            self.unpark(here)
            return
        if a.rows["pending"] is None and self.pending is not None and self.rows:
            self._feed()
        self._restore(a)

    def _feed(self) -> None:
        """The rows feed their pending tokens: each holds its next logits, none pending (``admit``'s first step)."""
        assert self.pending is not None
        t0 = time.perf_counter()
        self._step(self.pending)
        self.stats.step_seconds.append(time.perf_counter() - t0)
        self.pending = None

    def _per_row(self) -> dict[str, torch.Tensor | None]:
        """What the session holds per row besides the book and the cache."""
        return {
            "out": self.out,
            "lp": self.lp,
            "top": self.top,
            "n_tok": self.n_tok,
            "finished": self.finished,
            "stopped": self.stopped,
            "pending": self.pending,
            "logits": self.logits if self.pending is None else None,
            "hidden": self.hidden,
        }

    def _restore(self, a: _Aside) -> None:
        """Rows set aside join after the rows there are (both sides with a token pending, or both with logits)."""
        self.engine.unpark(a.handle)
        B = self.rows
        self.book.prompt_of, self.book.cand, self.book.stream = (
            np.concatenate([mine, theirs]) for mine, theirs in zip((self.prompt_of, self.cand, self.stream), a.book)
        )
        here = self._per_row()
        for k, theirs in a.rows.items():
            mine = here[k]
            if theirs is None or (mine is None and B):
                joined = None
            elif mine is None or not B:
                joined = theirs
            else:
                if k in ("out", "lp", "top"):  # padded to the wider of the two
                    width = max(mine.shape[1], theirs.shape[1])
                    fill = self.gen.pad_id if k == "out" else 0.0
                    mine, theirs = _grow(mine, 0, width, fill), _grow(theirs, 0, width, fill)
                joined = torch.cat([mine, theirs.to(mine.dtype)])
            setattr(self, k, joined)
        self._draw_keys, self._fin_pending = None, False

    def _select(self, rows: torch.Tensor, engine: bool = True) -> None:
        """``select`` of everything but the book (reordered already); ``engine=False``: the engine's rows are set
        already (rows set aside)."""
        rows = rows.to(self.out.device)
        if engine:
            self.engine.select(rows)
        self.out, self.n_tok, self.finished = self.out[rows], self.n_tok[rows], self.finished[rows]
        self.stopped = self.stopped[rows]
        self.lp = self.lp[rows] if self.lp is not None else None
        self.top = self.top[rows] if self.top is not None else None
        self.pending = self.pending[rows] if self.pending is not None else None
        self.forced = self.forced[rows] if self.forced is not None else None
        # logits sampled from already (a token is pending) are not read again: dropped, not copied
        self.logits = self.logits[rows] if self.pending is None and self.logits is not None else None
        self.hidden = self.hidden[rows] if self.hidden is not None else None
        self._draw_keys, self._fin_pending = None, False  # of the rows before
        if self.source is not None:
            self.source.selected(rows.cpu())

    def close(self) -> None:
        """Nothing to release: the cache is freed with the session (vLLM's session aborts its requests here)."""

    def _hidden(self) -> torch.Tensor | None:
        """[B, hidden] the state that sampled each row's latest token (None unless asked)."""
        return self.source.hidden(self) if self.source is not None else self.hidden

    def active(self) -> list[Row]:
        """Every active row's response so far, in batch order."""
        steps = self.steps()

        def cut(buf: torch.Tensor | None) -> list:  # each row's entries up to its own step
            if buf is None:
                return [None] * self.rows
            if isinstance(steps, int):
                return buf[:, :steps].tolist()
            return [r[:n] for r, n in zip(buf.tolist(), steps)]

        ids, lps, tops = cut(self.out), cut(self.lp), cut(self.top)
        h = self._hidden() if self.needs_hidden else None
        hs = list(h.float().cpu().numpy()) if h is not None else [None] * self.rows
        return [
            Row(int(p), int(c), i, lp, hidden=x, stream=int(k), top_logprobs=t)
            for p, c, k, i, lp, x, t in zip(self.prompt_of, self.cand, self.stream, ids, lps, hs, tops)
        ]


@dataclass
class _Aside:
    """Rows set aside (``TorchSession.park``): the engine's handle, the step they left at, their prompts, their book
    columns (prompt, candidate, stream) and what the session held for them (``_per_row``)."""

    handle: int
    t: int
    prompts: np.ndarray
    book: tuple[np.ndarray, np.ndarray, np.ndarray]
    rows: dict[str, torch.Tensor | None]


def _put(buf: torch.Tensor, steps: int | np.ndarray, values: torch.Tensor) -> None:
    """``buf[row, steps[row]] = values[row]``: one column while every row is at the same step."""
    if isinstance(steps, int):
        buf[:, steps] = values
    else:
        rows = torch.arange(buf.shape[0], device=buf.device)
        buf[rows, torch.from_numpy(steps).to(buf.device)] = values.to(buf.dtype)


def _grow(buf: torch.Tensor, rows: int, width: int, fill: float) -> torch.Tensor:
    """``buf`` [B, W, ...] with ``rows`` rows of ``fill`` appended and its width grown to ``width``."""
    new = buf.new_full((buf.shape[0] + rows, max(width, buf.shape[1]), *buf.shape[2:]), fill)
    new[: buf.shape[0], : buf.shape[1]] = buf
    return new
