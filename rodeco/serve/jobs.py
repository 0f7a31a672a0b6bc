"""A request turned into a job: its prompt (with its own index, stream key and seed), its batch key (the settings a
batch shares), its budget, and everything checked against what the server offers (``Planner``)."""

from __future__ import annotations

import itertools
import json
import math
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rodeco.common.budget import Budget, full_length_tokens
from rodeco.common.protocols import Generator
from rodeco.common.state import PolicyInfo, PromptRef, SamplingParams
from rodeco.common.validation import ConfigError
from rodeco.compose import option_node
from rodeco.core.config import SamplingConfig, ServeConfig
from rodeco.core.contracts import policy_info
from rodeco.plugins import BuildContext, Plugins
from rodeco.serve.errors import APIError, bad_field
from rodeco.serve.schema import ChatRequest, CompletionRequest

MAX_STOPS = 4  # as OpenAI


@dataclass(frozen=True)
class BatchKey:
    """What the requests of one batch share: candidates per prompt, sampling, length, stop strings and the policy
    with its parameters. Prompts, seeds and budgets may differ."""

    best_of: int
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    policy: str  # the policy node as JSON


REJECTION_STARTS = ("auto", "best_of")  # serve.rejection_start's values


@dataclass
class Job:
    id: int  # the server's serial number: the prompt's index in the trace and results (its identity)
    ref: PromptRef
    key: BatchKey
    n: int
    kv_tokens: int  # its budget
    prompt_tokens: int
    seed: int
    policy: dict[str, Any]
    rows: int  # the rows it starts: best_of, or (serve.rejection_start=auto, a rejecting policy) what its budget holds
    stream: bool = False
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    step0: int = 0  # the server's decode steps when it started (its progress: the steps since)
    shared: int = 0  # the most requests that decoded beside it (itself included), in the open batch
    future: Future = field(default_factory=Future)
    cancelled: bool = False
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)  # round-by-round progress, for streams

    def cancel(self) -> None:
        self.cancelled = True


class Planner:
    """Checks a request against the server's offer and turns it into a ``Job``."""

    def __init__(
        self,
        gen: Generator,
        serve: ServeConfig,
        offered: dict[str, dict[str, Any]],
        default_policy: dict[str, Any],
        budget: Budget,
        sampling: SamplingConfig,
        plugins: Plugins,
        model: str,
        needs_record: tuple[str, ...] = (),
    ) -> None:
        self.gen, self.serve, self.budget, self.plugins, self.model = gen, serve, budget, plugins, model
        self.needs_record = needs_record  # the fields the server's rewards read of a request's record
        self.sampling = sampling  # the server config's sampling: top_k and the defaults
        self.default_policy = default_policy
        self.offered = offered  # option name -> the ranges of the parameters a request may set
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def plan(self, req: ChatRequest | CompletionRequest) -> Job:
        s = self.serve
        if req.model != self.model:
            raise APIError(
                404,
                f"model={req.model!r}: unknown model. Fix: use {self.model!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        ref_text, messages = self._prompt(req)
        best_of = req.best_of if req.best_of is not None else max(req.n, s.best_of)
        if req.n < 1:
            raise bad_field("n", req.n, "must be at least 1", "give n >= 1")
        most = min(s.max_best_of, s.max_batch_rows)
        limit = "serve.max_best_of" if most == s.max_best_of else "serve.max_batch_rows"
        if not 1 <= best_of <= most:
            if req.best_of is None:  # best_of defaults to max(n, serve.best_of): here n is what is too large
                raise bad_field(
                    "n", req.n, f"must be at most {limit}={most} (best_of defaults to n)", f"give n <= {most}"
                )
            raise bad_field("best_of", best_of, f"must be in [1, {most}] ({limit})", f"give best_of <= {most}")
        if req.n > best_of:
            raise bad_field(
                "n", req.n, f"more choices than candidates (best_of={best_of})", "give n <= best_of, or raise best_of"
            )
        max_tokens = req.new_tokens()
        max_tokens = int(self.sampling.max_new_tokens) if max_tokens is None else max_tokens
        field_name = (
            "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"
        )
        if not 1 <= max_tokens <= s.max_tokens:
            raise bad_field(
                field_name,
                max_tokens,
                f"must be in [1, {s.max_tokens}] (serve.max_tokens)",
                f"give {field_name} <= {s.max_tokens}",
            )
        temperature = float(self.sampling.temperature if req.temperature is None else req.temperature)
        if not (math.isfinite(temperature) and 0 <= temperature <= 2):
            raise bad_field("temperature", req.temperature, "must be in [0, 2]", "give e.g. 1.0 (0: greedy)")
        top_p = float(self.sampling.top_p if req.top_p is None else req.top_p)
        if not (math.isfinite(top_p) and 0 < top_p <= 1):
            raise bad_field("top_p", req.top_p, "must be in (0, 1]", "give e.g. 1.0 (no nucleus cut)")
        stops = req.stops()
        if len(stops) > MAX_STOPS or any(not x for x in stops):
            raise bad_field("stop", req.stop, f"at most {MAX_STOPS} non-empty strings", "give fewer, non-empty stops")
        if req.seed is not None and not -(2**63) <= req.seed < 2**63:
            raise bad_field("seed", req.seed, "must fit in 64 bits", "give a seed in [-2**63, 2**63)")
        seed = req.seed if req.seed is not None else secrets.randbits(31)
        policy, info = self._policy(req)
        sampling = SamplingParams(temperature, int(self.sampling.top_k), top_p)
        with self.lock:
            jid = next(self.ids)
        record = dict(req.rodeco.record) if req.rodeco is not None else {}  # what the rewards read beside the text
        for name in self.needs_record:
            if record.get(name) is None:
                raise bad_field(
                    "rodeco.record",
                    record,
                    f"the server's reward scores against the prompt's {name}, and the request gives none",
                    f'send "rodeco": {{"record": {{"{name}": ...}}}}',
                )
        ref = PromptRef(index=jid, text=ref_text, stream=0, seed=seed, messages=messages, meta=record)
        ids = self.gen.encode(ref.source)
        if self.gen.max_context and len(ids) + max_tokens > self.gen.max_context:
            raise bad_field(
                "messages" if messages is not None or isinstance(req, ChatRequest) else "prompt",
                f"({len(ids)} tokens)",
                f"prompt + {field_name}={max_tokens} exceeds the model's context ({self.gen.max_context} tokens)",
                f"shorten the prompt or lower {field_name}",
                code="context_length_exceeded",
            )
        key = BatchKey(best_of, sampling, max_tokens, stops, json.dumps(policy, sort_keys=True))
        kv = self._kv_tokens(req, info, best_of, req.n, len(ids), max_tokens)
        rows = self._rows(info, best_of, kv, len(ids), max_tokens)
        return Job(jid, ref, key, req.n, kv, len(ids), seed, policy, rows, stream=req.stream)

    def _rows(self, info: PolicyInfo, best_of: int, kv_tokens: int, prompt: int, max_tokens: int) -> int:
        """The rows a request starts: ``best_of``; a rejecting policy's under ``serve.rejection_start=auto``, as many
        as its budget holds at the first decision point (``n=auto``, Speculative Rejection's regime), at least
        ``best_of`` and at most ``serve.max_best_of`` and ``serve.max_batch_rows``."""
        if not info.rejects or self.serve.rejection_start != "auto":
            return best_of
        b = self.budget
        own, base = Budget(kv_tokens, b.min_tokens_per_round, row_overhead=b.row_overhead).for_batch(
            [prompt], self.gen.kv
        )
        fit = own.auto_n(1, base, base + max_tokens)
        return max(best_of, min(fit, self.serve.max_best_of, self.serve.max_batch_rows))

    def _prompt(self, req: ChatRequest | CompletionRequest) -> tuple[str, tuple[tuple[str, str], ...] | None]:
        """The prompt as the rewards read it, and a conversation's messages (None for one user message, which is
        then what the CLI would decode for the same text)."""
        if isinstance(req, CompletionRequest):
            p = req.prompt
            if isinstance(p, list):
                if len(p) != 1:
                    raise bad_field(
                        "prompt",
                        p,
                        "rodeco serves one prompt a request",
                        "send one request per prompt (they are batched together)",
                    )
                p = p[0]
            if not p.strip():
                raise bad_field("prompt", p, "empty prompt", "give the prompt some text")
            return p, None
        msgs = [(m.role if m.role != "developer" else "system", m.text()) for m in req.messages]
        if not msgs:
            raise bad_field("messages", [], "no messages", "send at least one user message")
        if msgs[-1][0] != "user":
            raise bad_field(
                f"messages.{len(msgs) - 1}.role",
                msgs[-1][0],
                "the conversation must end with a user message",
                "end it with the user's turn the model should answer",
            )
        if not msgs[-1][1].strip():
            raise bad_field(
                f"messages.{len(msgs) - 1}.content", msgs[-1][1], "empty message", "give the user's message some text"
            )
        if len(msgs) == 1:
            return msgs[0][1], None
        return "\n\n".join(f"{r}: {c}" for r, c in msgs), tuple(msgs)

    def _policy(self, req: ChatRequest | CompletionRequest) -> tuple[dict[str, Any], PolicyInfo]:
        """The request's policy node (a policy the server offers, with parameters within their ranges) and what
        the policy declares (``PolicyInfo``)."""
        opts = req.rodeco
        name = None
        if opts is None or opts.policy is None:
            node = dict(self.default_policy)
        else:
            name = opts.policy
            if name not in self.offered:
                raise bad_field(
                    "rodeco.policy",
                    name,
                    "not a policy this server offers",
                    f"use one of {sorted(self.offered)} (serve.policies)",
                    code="unknown_policy",
                )
            node = option_node("policy", name, self.plugins)
        allowed = self.offered.get(name if name is not None else str(node["name"]), {})
        for k, v in opts.params.items() if opts is not None else ():
            if k not in allowed:
                raise bad_field(
                    f"rodeco.params.{k}",
                    v,
                    "not a parameter a request may set for this policy",
                    f"set only {sorted(allowed)} (serve.policies)",
                    code="unknown_parameter",
                )
            node[k] = _in_range(f"rodeco.params.{k}", v, allowed[k])
        try:  # the policy's own checks (a whole number of beams, ...), here rather than in the batch
            built = self.plugins.build_policy(node, BuildContext(plugins=self.plugins))
        except ConfigError as e:
            key = e.key.split(".", 1)[-1] if e.key.startswith("policy.") else e.key
            raise bad_field(
                f"rodeco.params.{key}", e.value, e.problem, e.fix.replace("policy.", "rodeco.params.")
            ) from None
        return node, policy_info(built, str(node["name"]))

    def _kv_tokens(
        self,
        req: ChatRequest | CompletionRequest,
        info: PolicyInfo,
        best_of: int,
        n: int,
        prompt: int,
        max_tokens: int,
    ) -> int:
        """The request's budget: what it asks (``rodeco.kv_tokens``), else Best-of-N's full memory for a policy that
        never rejects, else the memory of ``serve.request_memory`` of its rows at full length; it must let ``n``
        rows reach the end, the first round decode, and fit the server's budget."""
        kv = self.gen.kv
        asked = req.rodeco.kv_tokens if req.rodeco is not None else None
        full = full_length_tokens(best_of, prompt, max_tokens, kv)
        if asked is None:
            rows = best_of if not info.rejects else max(n, math.ceil(best_of * self.serve.request_memory))
            tokens = full_length_tokens(rows, prompt, max_tokens, kv)
        else:
            tokens = asked
        least = max(full_length_tokens(n, prompt, max_tokens, kv), self._first_round(best_of, prompt, max_tokens))
        if not info.rejects:
            least = max(least, full)
        if asked is None:
            tokens = max(tokens, least)  # a short max_tokens: the first round may need more than the share
        if tokens < least:
            raise bad_field(
                "rodeco.kv_tokens",
                tokens,
                f"too small: {n} choice(s) to the end and the first round of "
                f"{best_of} candidates need {least} KV tokens"
                + (" (Best-of-N, a policy that never rejects, holds every row to the end)" if not info.rejects else ""),
                f"give at least {least}, or lower best_of or max_tokens",
            )
        cap = self.budget.kv_tokens
        if cap is not None and tokens > cap:
            raise bad_field(
                "rodeco.kv_tokens" if asked is not None else "best_of",
                asked or best_of,
                f"the request needs {tokens} KV tokens, more than the server's budget ({cap})",
                "lower best_of or max_tokens" + (", or kv_tokens" if asked is not None else ""),
            )
        return int(tokens)

    def _first_round(self, best_of: int, prompt: int, max_tokens: int) -> int:
        b, base = self.budget.for_batch([prompt], self.gen.kv)
        shared = full_length_tokens(0, prompt, 0, self.gen.kv)
        m = min(b.min_tokens_per_round, max_tokens)
        return shared + best_of * Budget(None, block=self.gen.kv.block).held(base + m)


def _in_range(param: str, value: Any, spec: Any) -> Any:
    """``value`` if ``spec`` (``[lo, hi]`` or ``{choices: [...]}``) allows it, else a 400."""
    if isinstance(spec, dict) and "choices" in spec:
        if value not in list(spec["choices"]):
            raise bad_field(param, value, "not one of the allowed values", f"use one of {list(spec['choices'])}")
        return value
    lo, hi = spec
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (lo <= value <= hi)
        or not math.isfinite(value)
    ):
        raise bad_field(param, value, f"must be a number in [{lo}, {hi}]", f"give a value in [{lo}, {hi}]")
    return value
