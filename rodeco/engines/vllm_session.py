"""``VLLMSession``: the candidate rows of ``generator.engine=vllm`` (``rodeco.engines.vllm``, whose module doc says
how they map to vLLM's requests), one vLLM request per row, with ``rodeco.common.protocols.Session``'s interface: admit
prompts on their own clocks, decode to a decision point, reject, copy, the stats the accounting reads.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any, Protocol

import numpy as np

from rodeco.common.budget import block_shared
from rodeco.common.protocols import EngineInfo
from rodeco.common.rows import BookColumn, RowBook
from rodeco.common.shape import KVSpec
from rodeco.common.state import OpenPrompt, Row, SamplingParams, SessionSpec, SessionStats
from rodeco.common.stops import StopStrings
from rodeco.common.validation import ConfigError


def alone_steps_within(
    plen: np.ndarray, prompts: np.ndarray, held: np.ndarray, block: int, tokens: int, row_overhead: int, most: int
) -> int:
    """How many steps (at most ``most``) rows can take within ``tokens``, counted as vLLM's block manager holds them
    when their prompt decodes alone (an upper bound: a row's latest token counted too). Per row: ``plen`` its prompt's
    length, ``prompts`` its prompt, ``held`` the tokens of its own it holds. Each prompt's full blocks once, each row
    the rest of its prompt and its own tokens in whole blocks, and ``row_overhead`` tokens a row. Counted as alone, so
    that a prompt's decision points do not depend on its neighbours: one that joined a running batch holds its prompt
    once per row (``VLLMSession.admit``), which vLLM's pool (``budget=engine``) absorbs. The live session and its
    replay (``rodeco.engines.layout.VLLMLayout``) both count with it."""
    if len(plen) == 0 or most <= 0:
        return max(0, most)
    alone = block_shared(plen, block)
    shared = int(sum(alone[prompts == p][0] for p in np.unique(prompts)))
    own = plen - alone + held
    k = np.arange(0, most + 1)
    total = shared + (-(-(own[:, None] + k[None]) // block) * block).sum(0) + row_overhead * len(plen)
    fits = np.flatnonzero(total <= tokens)
    return int(fits.max()) if len(fits) else 0


class VLLMHandle(Protocol):
    """What a session reads of its generator (``rodeco.engines.vllm.VLLMGenerator``): vLLM's ``LLM``, the block
    pool's use and peak, preemptions, request ids, and the ``Generator`` members the stats need."""

    llm: Any
    info: EngineInfo
    kv: KVSpec
    eos_ids: list[int]
    kv_bytes_per_token: int
    peak_blocks: int

    def blocks_in_use(self) -> int: ...
    def preemptions(self) -> int: ...
    def next_id(self) -> int: ...
    def decode_text(self, ids: list[int]) -> str: ...
    def flops_per_token(self, context: int) -> float: ...


def request_seed(seed: int, key: int, candidate: int) -> int:
    """vLLM's seed for the row of stream ``candidate`` of the prompt with stream key ``key`` (by default its dataset
    index): a pure function of the three."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, key, candidate]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))  # < 2**63


class VLLMSession:
    """Candidate rows of several prompts decoding in vLLM (see the module doc); the interface of ``Session``."""

    prompt_of, cand, stream = BookColumn(), BookColumn(), BookColumn()  # per row, in batch order (``book``)

    def __init__(self, gen: VLLMHandle, spec: SessionSpec) -> None:
        if spec.needs_hidden:
            raise ConfigError(
                "partial_reward",
                "(a reward that needs hidden states)",
                "the vllm engine does not provide the generator's hidden states",
                "use generator.engine=fast or hf, or a partial reward that scores text",
            )
        self.gen = gen
        self.needs_logprobs = spec.needs_logprobs
        self.top_k = spec.top_logprobs  # each position's k most likely tokens' log-probs (vLLM's logprobs=k)
        self.ignore_eos = spec.ignore_eos
        # per prompt: its settings and the step it joined at (its clock's 0); stop strings are checked here on each
        # new token (rodeco.common.stops), as live rows are
        self.seeds: list[int] = []
        self.stream_keys: list[int] = []
        self.sampling_of: list[SamplingParams] = []
        self.max_new_of: list[int] = []
        self.stops_of: list[StopStrings] = []
        self.born: list[int] = []
        self.prompt_ids: list[list[int]] = []
        self.prompt_lens: list[int] = []
        self.stats = SessionStats(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        self.preempt0 = self.gen.preemptions()
        self.gen.peak_blocks = self.gen.blocks_in_use()
        self.ids: list[str] = []  # per row: vLLM's request id
        self.tokens: list[list[int]] = []
        self.lps: list[list[float]] = []
        self.tops: list[list[list[float]]] = []  # per row: [tokens][k]
        self.done: list[str] = []  # "eos" | "length" | "stop" once the row finished
        self.fresh: list[int] = []  # its request's prompt length until its first output (from a prefill), then 0
        self.row_of: dict[str, int] = {}
        self.hidden_log: list | None = None  # never filled: vLLM keeps its hidden states (record_hidden is ignored)
        self.book = RowBook()  # which prompt, candidate and stream each row is
        self.t = 0
        self.uid = gen.next_id()

    @property
    def rows(self) -> int:
        return len(self.prompt_of)

    def clock(self, prompt: int) -> int:
        """Tokens generated by each active row of prompt ``prompt`` (its own clock, from the step it joined)."""
        return self.t - self.born[prompt]

    def _params(self, max_tokens: int, seed: int | None, prompt: int = 0) -> Any:
        from vllm import SamplingParams as VP
        from vllm.sampling_params import RequestOutputKind

        s = self.sampling_of[prompt]
        return VP(
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            seed=seed,  # top_k 0: off, as in rodeco
            max_tokens=max_tokens,
            logprobs=self.top_k if self.top_k else 0 if self.needs_logprobs else None,
            detokenize=False,
            ignore_eos=self.ignore_eos,
            stop_token_ids=[] if self.ignore_eos else list(self.gen.eos_ids),
            output_kind=RequestOutputKind.DELTA,
        )

    def admit(self, prompt_ids: list[list[int]], prompts: list[OpenPrompt]) -> list[int]:
        """Prompts join the batch between steps, each with its own settings and clock: their rows submitted as
        requests seeded as they are alone (``request_seed``), so a prompt's candidates are the samples it draws
        decoding alone. Into an empty batch each prompt is prefilled once first (a one-token request whose blocks
        stay cached, shared by its rows). Into a running one each row prefills the prompt itself, in the next step: a
        prompt prefilled once first would step the running rows past their clocks, since vLLM steps every request it
        holds; so a joining prompt's blocks are held once per row, and charged as each row's prefill. Returns the new
        prompts' batch keys."""
        self._fits(self.rows + sum(op.n for op in prompts), prompts[0].n)
        P0, warm = len(self.prompt_ids), self.rows == 0
        self.seeds += [int(op.seed) for op in prompts]
        self.stream_keys += [int(op.stream_key) for op in prompts]
        self.sampling_of += [op.sampling for op in prompts]
        self.max_new_of += [int(op.max_new_tokens) for op in prompts]
        self.stops_of += [StopStrings(tuple(op.stop)) for op in prompts]
        self.born += [self.t] * len(prompts)
        self._start(prompt_ids, [op.n for op in prompts], [op.first for op in prompts], warm)
        return list(range(P0, P0 + len(prompts)))

    def steps_within(self, rows: np.ndarray, tokens: int, row_overhead: int, most: int) -> int:
        """How many steps (at most ``most``) ``rows`` can take within ``tokens``: ``alone_steps_within`` of their
        prompts' lengths and the tokens they have sampled."""
        prompts = self.prompt_of[rows]
        plen = np.asarray(self.prompt_lens, dtype=np.int64)[prompts]
        sampled = np.array([len(self.tokens[r]) for r in rows], dtype=np.int64)
        return alone_steps_within(plen, prompts, sampled, self.gen.kv.block, tokens, row_overhead, most)

    def _fits(self, rows: int, n: int) -> None:
        most = self.gen.info.max_rows  # generator.max_num_seqs
        if most is not None and rows > most:
            raise ConfigError(
                "n",
                n,
                f"{rows} rows exceed generator.max_num_seqs={most}, and the rows of a "
                "decision point must all step together",
                "raise generator.max_num_seqs, or lower n or data.batch_prompts",
            )

    def _start(self, prompt_ids: list[list[int]], n: list[int], first: list[int], warm: bool) -> None:
        """Prompts ``prompt_ids`` (their settings entered already), with ``warm`` prefilled once each (a one-token
        request whose blocks stay cached), and their ``n[j]`` rows submitted after the rows there are."""
        from vllm.inputs import TokensPrompt

        llm, P0, st = self.gen.llm, len(self.prompt_ids), self.stats
        self.prompt_ids += [list(p) for p in prompt_ids]
        self.prompt_lens += [len(p) for p in prompt_ids]
        self.prompt_len = max(self.prompt_lens)
        st.prefill_tokens = np.append(st.prefill_tokens, np.zeros(len(prompt_ids), np.int64))
        st.decode_tokens = np.append(st.decode_tokens, np.zeros(len(prompt_ids), np.int64))
        st.decode_flops = np.append(st.decode_flops, np.zeros(len(prompt_ids)))
        keys = range(P0, P0 + len(prompt_ids))
        shared = [i for i in keys if warm and block_shared(self.prompt_lens[i], self.gen.kv.block)]
        once = {f"w{self.uid}-{i}": i for i in shared}
        for rid, j in once.items():
            llm.add_request(rid, TokensPrompt(prompt_token_ids=self.prompt_ids[j]), self._params(1, None, j))
        while once:  # no other request is running: prefill opens the session
            for o in llm.step():
                i = once.pop(o.request_id, None) if o.finished else None
                if i is not None:
                    st.prefill_tokens[i] += self.prompt_lens[i] - int(o.num_cached_tokens or 0)
        B0 = self.rows
        self.book.admit(P0, n, first)
        new = range(B0, self.rows)
        self.ids += [f"r{self.uid}-{self.prompt_of[r]}-{self.cand[r]}" for r in new]  # vLLM's request ids
        self.row_of = {rid: r for r, rid in enumerate(self.ids)}
        self.tokens += [[] for _ in new]
        self.lps += [[] for _ in new]
        self.tops += [[] for _ in new]
        self.done += ["" for _ in new]
        self.fresh += [self.prompt_lens[self.prompt_of[r]] for r in new]
        for r in new:
            p = int(self.prompt_of[r])
            llm.add_request(
                self.ids[r],
                TokensPrompt(prompt_token_ids=self.prompt_ids[p]),
                self._params(
                    self.max_new_of[p], request_seed(self.seeds[p], self.stream_keys[p], int(self.stream[r])), p
                ),
            )
        self._track_memory()

    def _track_memory(self) -> None:
        st = self.stats
        st.peak_kv_tokens = max(st.peak_kv_tokens, self.gen.peak_blocks * self.gen.kv.block)
        st.peak_kv_bytes = st.peak_kv_tokens * self.gen.kv_bytes_per_token
        st.preemptions = self.gen.preemptions() - self.preempt0

    def _absorb(self, outs: list[Any]) -> None:
        """Append each row's new tokens; charge the forwards: a row's first token came from its prompt's tail
        (prefill), every later one from a decode forward over its context."""
        st, counts, flops = self.stats, np.zeros(len(self.stream_keys), np.int64), np.zeros(len(self.stream_keys))
        stopped: list[str] = []
        for o in outs:
            r = self.row_of.get(o.request_id)
            if r is None:
                continue
            c, p = o.outputs[0], int(self.prompt_of[r])
            new = list(c.token_ids)
            if self.fresh[r] and new:  # its request's prefill: the prompt (a copy's: and its parent's tokens)
                st.prefill_tokens[p] += self.fresh[r] - int(o.num_cached_tokens or 0)
                self.fresh[r] = 0
                k = len(new) - 1
            else:
                k = len(new)
            for j in range(k):
                flops[p] += self.gen.flops_per_token(self.prompt_lens[p] + len(self.tokens[r]) + j)
            counts[p] += k
            self.tokens[r] += new
            if c.logprobs and (self.needs_logprobs or self.top_k):
                lps, tops = _logprobs(c.logprobs, new, self.top_k)
                self.lps[r] += lps
                self.tops[r] += tops
            if o.finished:
                self.done[r] = "eos" if c.finish_reason == "stop" else "length"
            elif (
                (stops := self.stops_of[p])
                and new
                and stops.hit(self.gen.decode_text(self.tokens[r][-stops.tail_tokens :]))
            ):
                self.done[r] = "stop"
                stopped.append(o.request_id)
        if stopped:  # a stop string: the row ends here, its blocks freed
            self.gen.llm.abort_request(stopped)
        st.decode_tokens += counts
        st.decode_flops += flops
        if counts.any():
            st.steps += 1
            st.step_rows.append(int(counts.sum()))
            st.step_context.append(self.prompt_len + self.t)

    def decode(self, until: int, pause: int | None = None) -> list[Row]:
        """Step the engine until the session's step count is ``until`` (``pause``, if sooner; no further than its
        longest prompt's last token): each active row then holds its prompt's clock in tokens, or has finished.
        Returns the rows that finished on the way (vLLM has freed their blocks already)."""
        last = max((self.born[p] + self.max_new_of[p] for p in set(self.prompt_of.tolist())), default=self.t)
        until = min(until, last, until if pause is None else pause)
        llm, left = self.gen.llm, []
        while self.rows and any(len(self.tokens[r]) < until - self.born[p] for r, p in enumerate(self.prompt_of)):
            if not llm.has_unfinished_requests():
                raise RuntimeError("vLLM holds no request for rows rodeco still decodes")
            t0 = time.perf_counter()
            self._absorb(llm.step())
            self._track_memory()
            left += self._leave([r for r in range(self.rows) if self.done[r]])
            self.stats.step_seconds.append(time.perf_counter() - t0)
        behind = {len(self.tokens[r]) - (until - self.born[p]) for r, p in enumerate(self.prompt_of)}
        if self.rows and behind != {0}:  # every row steps every step: a prompt's rows reach its point together
            raise RuntimeError(
                f"vLLM advanced the rows unevenly (off their prompts' clocks by {sorted(behind)} tokens at step "
                f"{until}): its KV pool or max_num_seqs is smaller than the batch; leave budget.kv_tokens at most "
                "the pool (null: the pool itself)"
            )
        self.t = until if self.rows else self.t
        return left

    def finished_rows(self) -> np.ndarray:
        """Rows that finished and wait to be retired: none here (a finished row leaves as it finishes)."""
        return np.zeros(self.rows, dtype=bool)

    def retire_finished(self, prompts: Collection[int] | None = None) -> list[Row]:
        return []  # finished rows leave as they finish

    def _leave(self, rows: list[int], reason: str | None = None) -> list[Row]:
        """Rows ``rows`` (batch indices) leave the batch, as ``Row``s (the EOS token is not part of a response)."""
        if not rows:
            return []
        out = [
            self.book.leaving(
                r,
                self.tokens[r],
                list(self.lps[r]) if self.needs_logprobs else None,
                reason or self.done[r],
                self.gen.eos_ids,
                [list(x) for x in self.tops[r]] if self.top_k else None,
            )
            for r in rows
        ]
        gone = set(rows)
        keep = [r for r in range(self.rows) if r not in gone]
        self.book.take(keep)
        self._reorder(keep)
        self.row_of = {rid: r for r, rid in enumerate(self.ids)}
        return out

    def _reorder(self, order: list[int]) -> None:
        """What the session holds per row, beside its book, in the new batch order (batch indices of the old)."""
        self.ids = [self.ids[r] for r in order]
        self.tokens = [self.tokens[r] for r in order]
        self.lps = [self.lps[r] for r in order]
        self.tops = [self.tops[r] for r in order]
        self.done = [self.done[r] for r in order]
        self.fresh = [self.fresh[r] for r in order]

    def reject(self, rows: list[int]) -> list[Row]:
        """Abort active rows (batch indices) after a decision point, freeing their blocks; returns them."""
        self.gen.llm.abort_request([self.ids[r] for r in rows])
        return self._leave(sorted(rows), "rejected")

    def fork(self, parents: list[int], ids: list[int], streams: list[int]) -> list[int]:
        """Copies as new requests: the prompt and the parent's tokens, seeded from the copy's stream
        (``request_seed``), served from vLLM's prefix cache; each goes right after its parent. The uncached part
        of each copy's prompt is charged as its prefill (vLLM's ``num_cached_tokens``)."""
        from vllm.inputs import TokensPrompt

        order, slots = self.book.fork(parents, ids, streams)
        self._reorder(order)
        for r in slots:
            self.tokens[r], self.lps[r] = list(self.tokens[r]), list(self.lps[r])  # its own, from its parent's
            self.tops[r] = list(self.tops[r])
            p = int(self.prompt_of[r])
            clock = self.clock(p)
            self.ids[r], self.fresh[r] = f"r{self.uid}-{p}-{int(self.cand[r])}", self.prompt_lens[p] + clock
            self.gen.llm.add_request(
                self.ids[r],
                TokensPrompt(prompt_token_ids=self.prompt_ids[p] + self.tokens[r]),
                self._params(
                    self.max_new_of[p] - clock,
                    request_seed(self.seeds[p], self.stream_keys[p], int(self.stream[r])),
                    p,
                ),
            )
        self.row_of = {rid: r for r, rid in enumerate(self.ids)}
        return slots

    def active(self) -> list[Row]:
        return [
            Row(
                int(p),
                int(c),
                list(t),
                list(lp) if self.needs_logprobs else None,
                stream=int(k),
                top_logprobs=[list(x) for x in top] if self.top_k else None,
            )
            for p, c, k, t, lp, top in zip(self.prompt_of, self.cand, self.stream, self.tokens, self.lps, self.tops)
        ]

    def close(self) -> None:
        """Abort whatever is still running (a run stopped between decision points)."""
        if self.rows:
            self.gen.llm.abort_request(list(self.ids))

    parks = False  # vLLM steps every request it holds: a prompt's rows cannot wait aside (scores on the decode thread)

    def park(self, prompts: Collection[int]) -> int:
        raise NotImplementedError("a vLLM session cannot set rows aside (parks is False)")

    def unpark(self, handle: int) -> None:
        raise NotImplementedError("a vLLM session cannot set rows aside (parks is False)")


def _logprobs(positions: Any, tokens: list[int], k: int) -> tuple[list[float], list[list[float]]]:
    """vLLM's per-position log-prob dicts (token id -> ``Logprob`` with its ``rank``; with ``logprobs=k``: the k most
    likely tokens and the sampled one) as the sampled tokens' log-probs and each position's top k (descending)."""
    lps, tops = [], []
    for d, tok in zip(positions, tokens):
        lps.append(d[tok].logprob if tok in d else next(iter(d.values())).logprob)
        if k:
            ranked = sorted((x for x in d.values() if x.rank is not None and x.rank <= k), key=lambda x: x.rank)
            tops.append([float(x.logprob) for x in ranked[:k]])
    return lps, tops
