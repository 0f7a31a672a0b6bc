"""The HTTP layer: a Starlette app over a ``Scheduler``. OpenAI's endpoints and bodies, rodeco's extras in a
``rodeco`` object; every error is OpenAI's error body, and nothing a client sends gets a 500 or stops the server."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rodeco.core.config import ServeConfig
from rodeco.serve.errors import APIError
from rodeco.serve.jobs import Job, Planner
from rodeco.serve.metrics import Metrics
from rodeco.serve.scheduler import Answer, Scheduler
from rodeco.serve.schema import ChatRequest, CompletionRequest, parse

log = logging.getLogger(__name__)
OPEN_PATHS = ("/health",)  # answered without a key


class State:
    """What the endpoints share: the planner, the batcher, the metrics, the limits, and whether it is draining."""

    def __init__(
        self,
        planner: Planner,
        scheduler: Scheduler,
        metrics: Metrics,
        serve: ServeConfig,
        api_key: str | None,
        model: str,
    ) -> None:
        self.planner, self.scheduler, self.metrics, self.serve = planner, scheduler, metrics, serve
        self.api_key, self.model = api_key, model
        self.draining = False
        self.created = int(time.time())


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


class Guard:
    """Pure ASGI middleware: the body size limit (413), the API key (401), draining (503), and a last net that
    turns any unexpected exception into a 500 with the error body (the server goes on)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        st, path = self.state, scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            if path not in OPEN_PATHS and st.api_key is not None:
                given = headers.get("authorization", "")
                token = given[7:] if given.lower().startswith("bearer ") else ""
                if not hmac.compare_digest(token.encode(), st.api_key.encode()):
                    raise APIError(
                        401,
                        "missing or wrong API key. Fix: send 'Authorization: Bearer <key>' with the "
                        "server's key (serve.api_key or RODECO_API_KEY)",
                        type="authentication_error",
                        code="invalid_api_key",
                    )
            if st.draining and path.startswith("/v1/") and scope["method"] == "POST":
                raise APIError(
                    503,
                    "the server is shutting down. Fix: retry on another instance",
                    type="server_error",
                    code="shutting_down",
                )
            limit = st.serve.max_body_bytes
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                raise APIError(
                    413,
                    f"the body ({length} bytes) is larger than serve.max_body_bytes={limit}. Fix: "
                    "send a smaller request",
                    code="body_too_large",
                )
        except APIError as e:
            await error_response(e)(scope, receive, send)
            return
        seen, sent = 0, False

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise APIError(
                        413,
                        f"the body is larger than serve.max_body_bytes={limit}. Fix: send a smaller request",
                        code="body_too_large",
                    )
            return msg

        async def tracked(msg: Message) -> None:
            nonlocal sent
            sent = sent or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, limited, tracked)
        except APIError as e:
            if not sent:
                await error_response(e)(scope, receive, send)
        except Exception as e:  # a bug of ours: answered, logged, and the server goes on
            log.exception("unexpected error on %s", path)
            if not sent:
                await error_response(
                    APIError(
                        500,
                        f"internal error ({type(e).__name__}); the server goes on",
                        type="server_error",
                        code="internal_error",
                    )
                )(scope, receive, send)


def watch(job: Job) -> asyncio.Future:
    """The job's future in this event loop; an outcome nobody waits for any more (a cancelled job's) is consumed."""
    fut = asyncio.wrap_future(job.future)
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


async def wait_for(state: State, job: Job, request: Request) -> Answer:
    """The job's answer; a client that goes away, or a job past ``serve.request_timeout_s``, cancels it."""
    fut = watch(job)
    deadline = time.monotonic() + state.serve.request_timeout_s
    while True:
        done, _ = await asyncio.wait({fut}, timeout=0.1)
        if done:
            return fut.result()
        if await request.is_disconnected():
            state.scheduler.cancel(job, "the client disconnected")
            raise APIError(499, "client disconnected", code="cancelled")
        if time.monotonic() > deadline:
            raise timed_out(state, job)


def timed_out(state: State, job: Job) -> APIError:
    """A job past ``serve.request_timeout_s``: cancelled, and the 504 that says so."""
    state.scheduler.cancel(job, "timed out")
    return APIError(
        504,
        f"the request took longer than serve.request_timeout_s={state.serve.request_timeout_s} s. "
        "Fix: lower best_of or max_tokens, or retry later",
        type="timeout_error",
        code="timeout",
    )


def choices_of(job: Job, a: Answer) -> list[Any]:
    """The job's ``n`` choices, best first: the winner, then the other finished candidates by reward."""
    r = a.result
    rest = sorted(
        (c for c in (r.candidates or []) if c.finished and c.candidate_id != r.best.candidate_id),
        key=lambda c: -(c.score if c.score is not None else float("-inf")),
    )
    return [r.best, *rest][: job.n]


def finish_reason(c: Any) -> str:
    return "length" if c.stop_reason == "length" else "stop"


def usage(job: Job, chosen: list[Any]) -> dict[str, int]:
    completion = sum(len(c.token_ids) + (c.stop_reason == "eos") for c in chosen)
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": job.prompt_tokens + completion,
    }


def rodeco_block(job: Job, a: Answer, chosen: list[Any]) -> dict[str, Any]:
    r, comp = a.result, a.result.compute
    cands = r.candidates or []
    return {
        "choices": [
            {"index": i, "reward": c.score, "candidate_id": c.candidate_id, "tokens": len(c.token_ids)}
            for i, c in enumerate(chosen)
        ],
        "policy": job.policy,
        "best_of": job.key.best_of,
        "seed": job.seed,
        "kv_tokens": job.kv_tokens,
        "candidates_started": r.n_start,
        "candidates_rejected": sum(c.stop_reason == "rejected" for c in cands),
        "rounds": len(r.rounds),
        "prefill_tokens": comp.gen_prefill_tokens,
        "decode_tokens": comp.gen_decode_tokens,
        "flops": comp.total_flops,
        "bon_flops_modelled": a.bon_flops_modelled,
        "queue_seconds": round(a.queue_s, 4),
        "decode_seconds": round(a.decode_s, 4),
        "batch_requests": a.batch_requests,
        # its own seconds of each phase: its share of the decode steps, prefill and pruning it was in, of the
        # reward calls that scored it (on the reward thread, off the decode thread), and held: its rows set aside
        # while they waited for their scores
        "time_s": {k: round(float(v), 4) for k, v in comp.time_s.items()},
    }


def render(state: State, job: Job, req: Any, a: Answer) -> dict[str, Any]:
    chosen = choices_of(job, a)
    chat = isinstance(req, ChatRequest)
    choices = [
        ({"index": i, "message": {"role": "assistant", "content": c.text}} if chat else {"index": i, "text": c.text})
        | {"finish_reason": finish_reason(c), "logprobs": None}
        for i, c in enumerate(chosen)
    ]
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{job.id}-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": state.model,
        "choices": choices,
        "usage": usage(job, chosen),
        "rodeco": rodeco_block(job, a, chosen),
    }


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def stream(state: State, job: Job, req: Any) -> AsyncIterator[bytes]:
    """Server-sent events the openai client parses unchanged: round-by-round progress as SSE comments (which it
    ignores) while the candidates decode, then the winner (and the other choices) once chosen, then ``[DONE]``.
    The first token comes when the winner is known: the whole decode."""
    chat = isinstance(req, ChatRequest)
    base = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{job.id}-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": state.model,
    }
    fut = watch(job)
    deadline = time.monotonic() + state.serve.request_timeout_s
    try:
        yield b": rodeco queued\n\n"
        while True:
            done, _ = await asyncio.wait({fut}, timeout=0.25)
            while not job.events.empty():
                yield f": rodeco {json.dumps(job.events.get())}\n\n".encode()
            if done:
                break
            if time.monotonic() > deadline:
                raise timed_out(state, job)
            yield b": rodeco waiting\n\n"  # keeps the connection alive; a gone client shows here
        a = fut.result()
        chosen = choices_of(job, a)
        state.metrics.first_token.observe(time.monotonic() - job.submitted)
        for i, c in enumerate(chosen):
            if chat:
                yield sse(
                    base
                    | {
                        "choices": [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None,
                                "logprobs": None,
                            }
                        ]
                    }
                )
                yield sse(
                    base
                    | {"choices": [{"index": i, "delta": {"content": c.text}, "finish_reason": None, "logprobs": None}]}
                )
                yield sse(
                    base | {"choices": [{"index": i, "delta": {}, "finish_reason": finish_reason(c), "logprobs": None}]}
                )
            else:
                yield sse(
                    base
                    | {"choices": [{"index": i, "text": c.text, "finish_reason": finish_reason(c), "logprobs": None}]}
                )
        last = {"choices": [], "rodeco": rodeco_block(job, a, chosen)}
        if req.stream_options is not None and req.stream_options.include_usage:
            last["usage"] = usage(job, chosen)
        yield sse(base | last)
        yield b"data: [DONE]\n\n"
    except APIError as e:
        yield sse(e.body())
        yield b"data: [DONE]\n\n"
    finally:  # the client went away (the stream was cancelled) or it ended: nothing of it decodes on
        if not job.future.done():
            state.scheduler.cancel(job, "the client disconnected")


def make_app(state: State) -> Starlette:
    m = state.metrics

    async def completions(
        request: Request, kind: type[ChatRequest] | type[CompletionRequest], endpoint: str
    ) -> Response:
        t0 = time.monotonic()
        status = 500
        try:
            req = parse(await request.body(), kind)
            job = state.planner.plan(req)
            state.scheduler.submit(job)
            if req.stream:
                status = 200
                return StreamingResponse(
                    stream(state, job, req), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
                )
            a = await wait_for(state, job, request)
            status = 200
            m.latency.labels(endpoint=endpoint).observe(time.monotonic() - t0)
            return JSONResponse(render(state, job, req, a))
        except APIError as e:
            status = e.status
            return error_response(e)
        finally:
            m.requests.labels(endpoint=endpoint, status=str(status)).inc()

    async def chat(request: Request) -> Response:
        return await completions(request, ChatRequest, "chat")

    async def complete(request: Request) -> Response:
        return await completions(request, CompletionRequest, "completions")

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": state.model, "object": "model", "created": state.created, "owned_by": "rodeco"}],
            }
        )

    async def health(request: Request) -> Response:
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "in_flight": state.scheduler.in_flight()})

    async def metrics(request: Request) -> Response:
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        return error_response(
            APIError(
                code,
                f"{request.method} {request.url.path}: "
                f"{'no such endpoint' if code == 404 else 'method not allowed'}. Fix: use "
                "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health "
                "or GET /metrics",
                code="not_found" if code == 404 else "method_not_allowed",
            )
        )

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", complete, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    app.add_middleware(Guard, state=state)
    return app
