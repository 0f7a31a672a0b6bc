"""``rodeco task=serve``'s answers to bad requests: a table of malformed requests, each a specific 4xx with OpenAI's
error body naming the field and the fix; a hypothesis fuzz over the request schema (nothing a client sends gets a 5xx
or stops the server); the API key; the binding check; and a full queue's 429.

Servers run in this process over the tiny in-memory Llama, on 127.0.0.1 only, each stopped by its fixture.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from serve_helpers import metric, running

from rodeco.common.validation import ConfigError

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = {"role": "user", "content": "write a haiku"}
# the main server's limits, small so that the table tests them (and the fuzz's valid requests decode fast)
MAX_BEST_OF, MAX_TOKENS = 8, 64
LIMITS = [
    "serve.best_of=4",
    f"serve.max_best_of={MAX_BEST_OF}",
    f"serve.max_tokens={MAX_TOKENS}",
    "sampling.max_new_tokens=4",
]
ERROR_KEYS = {"message", "type", "param", "code"}


def build_gen(model: Any, tokenizer: Any) -> Any:
    from rodeco.core.generator import TorchGenerator

    return TorchGenerator(model, tokenizer, engine="fast", name="tiny")


@pytest.fixture(scope="module")
def server(tiny_model, tiny_tokenizer):
    """One server for the table and the fuzz (no API key, whatever this shell's RODECO_API_KEY)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RODECO_API_KEY", raising=False)
        with running(build_gen(tiny_model, tiny_tokenizer), LIMITS) as (url, state):
            yield url, state


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server[0], timeout=60) as c:
        yield c


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [USER], **kw}


def completion(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "give three tips", **kw}


def error_of(r: Any) -> dict[str, Any]:
    """The OpenAI error body's ``error`` object, its four keys checked."""
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert ERROR_KEYS <= set(err), err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    return err


def good(http: Any) -> None:
    r = http.post(CHAT, json=chat(max_tokens=2, best_of=2, seed=1))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


# -- the table ---------------------------------------------------------------------------------------------------------
# (id, method, path, body: a dict sent as JSON, or bytes sent as they are, status, param (None: none named), code)
LONG = "the quick brown fox jumps over the lazy dog " * 40  # ~400 tokens: past the tiny model's 256 positions
TABLE: list[tuple[str, str, str, Any, int, str | None, str | None]] = [
    # wrong types
    ("n-string", "POST", CHAT, chat(n="2"), 400, "n", "invalid_value"),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), 400, "temperature", "invalid_value"),
    ("messages-not-list", "POST", CHAT, {"model": "tiny", "messages": "hi"}, 400, "messages", "invalid_value"),
    ("max_tokens-float", "POST", COMPLETIONS, completion(max_tokens=4.5), 400, "max_tokens", "invalid_value"),
    ("stream-string", "POST", CHAT, chat(stream="yes"), 400, "stream", "invalid_value"),
    (
        "role-unknown",
        "POST",
        CHAT,
        {"model": "tiny", "messages": [{"role": "tool", "content": "x"}]},
        400,
        "messages.0.role",
        "invalid_value",
    ),
    # out of range
    ("temperature-3", "POST", CHAT, chat(temperature=3), 400, "temperature", "invalid_value"),
    ("top_p-0", "POST", CHAT, chat(top_p=0), 400, "top_p", "invalid_value"),
    ("n-0", "POST", CHAT, chat(n=0), 400, "n", "invalid_value"),
    ("max_tokens-0", "POST", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("best_of-above-max", "POST", CHAT, chat(best_of=MAX_BEST_OF + 1), 400, "best_of", "invalid_value"),
    ("n-above-max-no-best_of", "POST", CHAT, chat(n=MAX_BEST_OF + 1), 400, "n", "invalid_value"),
    ("n-above-best_of", "POST", CHAT, chat(n=4, best_of=2), 400, "n", "invalid_value"),
    ("max_tokens-huge", "POST", CHAT, chat(max_tokens=MAX_TOKENS + 1), 400, "max_tokens", "invalid_value"),
    (
        "max_completion_tokens-huge",
        "POST",
        CHAT,
        chat(max_completion_tokens=10**9),
        400,
        "max_completion_tokens",
        "invalid_value",
    ),
    ("seed-past-64-bits", "POST", CHAT, chat(seed=2**70), 400, "seed", "invalid_value"),
    ("too-many-stops", "POST", CHAT, chat(stop=["a", "b", "c", "d", "e"]), 400, "stop", "invalid_value"),
    ("empty-stop", "POST", COMPLETIONS, completion(stop=[""]), 400, "stop", "invalid_value"),
    # rodeco's own object
    ("policy-unknown", "POST", CHAT, chat(rodeco={"policy": "beam"}), 400, "rodeco.policy", "unknown_policy"),
    ("policy-path", "POST", CHAT, chat(rodeco={"policy": "../../x.yaml"}), 400, "rodeco.policy", "unknown_policy"),
    (
        "alpha-out-of-range",
        "POST",
        CHAT,
        chat(rodeco={"policy": "fixed", "params": {"alpha": 0.99}}),
        400,
        "rodeco.params.alpha",
        "invalid_value",
    ),
    (
        "param-not-offered",
        "POST",
        CHAT,
        chat(rodeco={"policy": "fixed", "params": {"beta": 0.5}}),
        400,
        "rodeco.params.beta",
        "unknown_parameter",
    ),
    ("kv_tokens-too-small", "POST", CHAT, chat(rodeco={"kv_tokens": 1}), 400, "rodeco.kv_tokens", "invalid_value"),
    (
        "kv_tokens-above-budget",
        "POST",
        CHAT,
        chat(rodeco={"kv_tokens": 10**9}),
        400,
        "rodeco.kv_tokens",
        "invalid_value",
    ),
    ("rodeco-unknown-key", "POST", CHAT, chat(rodeco={"polcy": "none"}), 400, "rodeco.polcy", "unknown_parameter"),
    # the body itself
    ("bad-json", "POST", CHAT, b'{"model": "tiny", "messages": [', 400, None, "invalid_json"),
    ("json-array", "POST", CHAT, b'[{"model": "tiny"}]', 400, None, "invalid_json"),
    ("json-nested-too-deep", "POST", COMPLETIONS, b"[" * 5000 + b"]" * 5000, 400, None, "invalid_json"),
    ("not-utf8", "POST", CHAT, b"\xff\xfe\xfd", 400, None, "invalid_json"),
    (
        "lone-surrogate",
        "POST",
        CHAT,
        b'{"model": "tiny", "messages": [{"role": "user", "content": "a\\ud800"}]}',
        400,
        "messages.0.content",
        "invalid_value",
    ),
    # prompts
    ("prompt-past-context", "POST", COMPLETIONS, completion(prompt=LONG), 400, "prompt", "context_length_exceeded"),
    (
        "messages-past-context",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": LONG}]),
        400,
        "messages",
        "context_length_exceeded",
    ),
    ("empty-prompt", "POST", COMPLETIONS, completion(prompt="  "), 400, "prompt", "invalid_value"),
    ("two-prompts", "POST", COMPLETIONS, completion(prompt=["a", "b"]), 400, "prompt", "invalid_value"),
    (
        "ends-with-assistant",
        "POST",
        CHAT,
        chat(messages=[USER, {"role": "assistant", "content": "ok"}]),
        400,
        "messages.1.role",
        "invalid_value",
    ),
    ("no-messages", "POST", CHAT, chat(messages=[]), 400, "messages", "invalid_value"),
    ("missing-messages", "POST", CHAT, {"model": "tiny"}, 400, "messages", "missing_parameter"),
    ("missing-prompt", "POST", COMPLETIONS, {"model": "tiny"}, 400, "prompt", "missing_parameter"),
    # names where a name belongs
    ("model-unknown", "POST", CHAT, chat(model="gpt-4o"), 404, "model", "model_not_found"),
    ("model-path", "POST", COMPLETIONS, completion(model="/etc/passwd"), 404, "model", "model_not_found"),
    # OpenAI fields rodeco does not implement, and fields nobody defined
    ("logprobs", "POST", CHAT, chat(logprobs=True), 400, "logprobs", "unsupported_parameter"),
    (
        "tools",
        "POST",
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "f"}}]),
        400,
        "tools",
        "unsupported_parameter",
    ),
    (
        "response_format-json",
        "POST",
        CHAT,
        chat(response_format={"type": "json_object"}),
        400,
        "response_format",
        "unsupported_parameter",
    ),
    ("echo", "POST", COMPLETIONS, completion(echo=True), 400, "echo", "unsupported_parameter"),
    ("unknown-field", "POST", CHAT, chat(frobnicate=1), 400, "frobnicate", "unknown_parameter"),
    # routes
    ("unknown-endpoint", "POST", "/v1/embeddings", completion(), 404, None, "not_found"),
    ("wrong-method", "GET", CHAT, None, 405, None, "method_not_allowed"),
    ("wrong-method-models", "POST", "/v1/models", {}, 405, None, "method_not_allowed"),
]


def test_table_is_wide():
    ids = [c[0] for c in TABLE]
    assert len(ids) == len(set(ids)) and len(ids) >= 24


@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_malformed_request(http, case):
    _, method, path, body, status, param, code = case
    if isinstance(body, bytes):
        r = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
    elif body is None:
        r = http.request(method, path)
    else:
        r = http.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = error_of(r)
    assert err["param"] == param, err
    assert err["code"] == code, err
    assert err["type"] == "invalid_request_error", err
    assert "Fix:" in err["message"], err
    if param is not None:
        assert param in err["message"], err


def test_still_serves_after_the_table(http):
    """Run after the table (file order): the server answers a good request on both endpoints."""
    good(http)
    r = http.post(COMPLETIONS, json=completion(max_tokens=2, best_of=2, seed=1, rodeco={"policy": "none"}))
    assert r.status_code == 200, r.text
    assert r.json()["rodeco"]["policy"]["name"] == "none"


def test_alpha_in_range_is_taken(http):
    """The range check is not a blanket refusal: alpha inside serve.policies.fixed.alpha decodes."""
    r = http.post(CHAT, json=chat(max_tokens=3, best_of=4, rodeco={"policy": "fixed", "params": {"alpha": 0.5}}))
    assert r.status_code == 200, r.text
    assert r.json()["rodeco"]["policy"]["alpha"] == 0.5


def test_errors_are_counted(server, http):
    """A refused request is counted under its status in /metrics, not as a 5xx."""

    before = metric(http.get("/metrics").text, "rodeco_requests_total", 'endpoint="chat",status="400"')
    assert http.post(CHAT, json=chat(n=0)).status_code == 400
    text = http.get("/metrics").text
    assert metric(text, "rodeco_requests_total", 'endpoint="chat",status="400"') == before + 1
    assert metric(text, "rodeco_requests_total", 'endpoint="chat",status="500"') == 0


# -- the body size limit: a server of its own with a small serve.max_body_bytes --------------------------------------
SMALL_BODY = 2048


@pytest.fixture(scope="module")
def small(tiny_model, tiny_tokenizer):
    """A server with a 2 KB body limit, one request a batch and a queue of one (the 413 and 429 tests); its batcher
    waits 0.5 s for arrivals, so a request stays queued long enough for the next ones to find the queue full."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RODECO_API_KEY", raising=False)
        with running(
            build_gen(tiny_model, tiny_tokenizer),
            [
                f"serve.max_body_bytes={SMALL_BODY}",
                "serve.max_queue=1",
                "serve.batch_requests=1",
                "serve.retry_after_s=2",
            ],
        ) as (url, state):
            yield url, state


def test_oversize_body_is_413(small):
    url, _ = small
    big = chat(messages=[{"role": "user", "content": "x" * (2 * SMALL_BODY)}])
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post(CHAT, json=big)  # with Content-Length: refused before the body is read
        assert r.status_code == 413, r.text
        err = error_of(r)
        assert err["code"] == "body_too_large" and "serve.max_body_bytes" in err["message"] and "Fix:" in err["message"]

        def chunks():  # no Content-Length (chunked): refused once the bytes read pass the limit
            data = json.dumps(big).encode()
            for i in range(0, len(data), 512):
                yield data[i : i + 512]

        r = c.post(CHAT, content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        assert error_of(r)["code"] == "body_too_large"
        # just under the limit is read and parsed (a 400 from the schema, not a 413)
        r = c.post(CHAT, json=chat(n=0, user="u" * (SMALL_BODY - 200)))
        assert r.status_code == 400 and error_of(r)["param"] == "n", r.text


# -- a full queue ------------------------------------------------------------------------------------------------------
def test_full_queue_is_429_with_retry_after(small):
    url, state = small
    slow = chat(best_of=8, max_tokens=16, seed=0, rodeco={"policy": "none"})
    results: list[tuple[int, dict[str, str], str]] = []
    lock = threading.Lock()
    go = threading.Barrier(6, timeout=30)

    def send() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            go.wait()
            r = c.post(CHAT, json=slow)
            with lock:
                results.append((r.status_code, dict(r.headers), r.text))

    threads = [threading.Thread(target=send, daemon=True) for _ in range(6)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, 90 - (time.monotonic() - t0)))
    assert not any(t.is_alive() for t in threads), "a request did not finish in 90 s"
    codes = sorted(s for s, _, _ in results)
    assert len(codes) == 6 and set(codes) <= {200, 429}, codes
    assert codes.count(200) >= 1, codes
    full = [(h, text) for s, h, text in results if s == 429]
    assert full, f"no request found the queue full: {codes}"
    for headers, text in full:
        assert headers.get("retry-after") == "2", headers
        err = json.loads(text)["error"]
        assert ERROR_KEYS <= set(err) and err["type"] == "rate_limit_error" and err["code"] == "queue_full", err
        assert "serve.max_queue" in err["message"] and "Fix:" in err["message"], err
    # the queue drained: the server takes requests again
    deadline = time.monotonic() + 30
    while state.scheduler.in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.post(CHAT, json=chat(max_tokens=2, best_of=2)).status_code == 200


# -- the fuzz ----------------------------------------------------------------------------------------------------------
def json_values(max_leaves: int = 6) -> Any:
    scalars = (
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12)
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=max_leaves,
    )


# text that may carry a lone surrogate (sent as JSON's \udXXX escape) or control characters
ODD_TEXT = st.builds(
    lambda a, s, b: a + s + b,
    st.text(max_size=8),
    st.sampled_from(["", "\ud800", "\udfff", "\x00", "\u202e", "<|user|>", "</s>"]),
    st.text(max_size=8),
)

VALID = {
    "max_tokens": st.integers(1, 4),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "seed": st.integers(0, 2**31),
    "stop": st.none() | st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "n": st.integers(1, 2),
    "best_of": st.integers(2, 4),
    "stream": st.booleans(),
    "user": st.text(max_size=8),
    "rodeco": st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(["fixed", "none"]),
            "params": st.just({}),
        },
    ),
}
INVALID = {
    "model": st.sampled_from(["", "gpt-4", "/etc/passwd", "../tiny", "TINY"]) | json_values(2),
    "messages": st.sampled_from(
        [
            [],
            "hi",
            [{}],
            [{"role": "assistant", "content": "x"}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
        ]
    )
    | st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot"]), "content": ODD_TEXT}),
        min_size=1,
        max_size=3,
    )
    | json_values(3),
    "prompt": ODD_TEXT | st.lists(st.text(max_size=4), max_size=3) | json_values(3),
    "max_tokens": st.integers(-3, 0) | st.integers(MAX_TOKENS + 1, 2**64) | st.floats() | st.text(max_size=3),
    "max_completion_tokens": st.integers(-3, 0) | st.integers(MAX_TOKENS + 1, 10**6) | st.booleans(),
    "temperature": st.floats(2.0001, 1e300)
    | st.floats(max_value=-0.0001)
    | st.just(float("nan"))
    | st.text(max_size=3),
    "top_p": st.floats(max_value=0) | st.floats(1.0001, 10) | st.just(float("inf")) | st.booleans(),
    "seed": st.integers(2**63, 2**80) | st.floats() | st.text(max_size=3),
    "stop": st.lists(st.text(max_size=3), min_size=5, max_size=7) | st.just([""]) | st.integers(),
    "n": st.integers(-3, 0) | st.integers(5, 100) | st.text(max_size=2),
    "best_of": st.integers(-3, 0) | st.integers(MAX_BEST_OF + 1, 10**9) | st.floats(),
    "stream": st.text(max_size=3) | st.integers(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values(1), "x": st.none()}),
    "rodeco": st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(["beam", "../../x.yaml", "", "fixed", "none"]) | json_values(1),
            "params": st.dictionaries(st.sampled_from(["alpha", "beta", "k"]), json_values(1), max_size=2),
            "kv_tokens": st.integers(-10, 10**12) | json_values(1),
            "extra": json_values(1),
        },
    )
    | json_values(2),
}
UNSUPPORTED_VALUES = st.sampled_from(
    [
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "response_format",
        "logit_bias",
        "presence_penalty",
        "echo",
        "suffix",
        "functions",
    ]
)


@st.composite
def requests(draw: Any) -> tuple[str, dict[str, Any]]:
    """A valid request with up to three fields made invalid and up to two extra (unknown or unsupported) keys."""
    is_chat = draw(st.booleans())
    body: dict[str, Any] = {"model": "tiny"}
    if is_chat:
        body["messages"] = [{"role": "user", "content": draw(st.text(min_size=1, max_size=20).filter(str.strip))}]
    else:
        body["prompt"] = draw(st.text(min_size=1, max_size=20).filter(str.strip))
    for k in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=4, unique=True)):
        body[k] = draw(VALID[k])
    if body.get("n", 1) > body.get("best_of", 4):
        body["n"] = body["best_of"]
    for k in draw(st.lists(st.sampled_from(sorted(INVALID)), max_size=3, unique=True)):
        body[k] = draw(INVALID[k])
    extras = draw(
        st.dictionaries(UNSUPPORTED_VALUES | st.text(min_size=1, max_size=6) | ODD_TEXT, json_values(2), max_size=2)
    )
    body.update(extras)
    return (CHAT if is_chat else COMPLETIONS), body


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(req=requests())
def test_fuzz_requests_never_5xx(http, req):
    path, body = req
    r = http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.text)
    event(f"status {r.status_code}")  # --hypothesis-show-statistics: how many reached a decode
    if r.status_code >= 400:
        err = error_of(r)
        assert "Fix:" in err["message"], err
    elif body.get("stream") is True:
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        assert r.status_code == 200 and r.json()["choices"], r.text


@settings(max_examples=30, deadline=None, database=None)
@given(raw=st.binary(max_size=64) | st.text(max_size=40).map(str.encode))
def test_fuzz_raw_bodies_never_5xx(http, raw):
    r = http.post(COMPLETIONS, content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    error_of(r)


def test_health_after_the_fuzz(http):
    assert http.get("/health").status_code == 200
    good(http)


# -- the API key -------------------------------------------------------------------------------------------------------
def check_key(url: str, key: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        body = chat(max_tokens=2, best_of=2)
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": key},  # no "Bearer "
            {"Authorization": f"Bearer {key}x"},
            {"Authorization": "Basic " + key},
        ):
            r = c.post(CHAT, json=body, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            err = error_of(r)
            assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key", err
            assert "Fix:" in err["message"] and key not in err["message"], err
        for path in ("/v1/models", "/metrics", "/v1/nope"):  # closed too, even a path that does not exist
            assert c.get(path).status_code == 401, path
        assert c.get("/health").status_code == 200  # open: load balancers probe it without a key
        r = c.post(CHAT, json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        r = c.get("/v1/models", headers={"Authorization": f"bearer {key}"})
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"


def test_api_key_from_config(tiny_gen, monkeypatch):
    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    with running(tiny_gen("fast"), ["serve.api_key=secret", *LIMITS]) as (url, state):
        assert state.api_key == "secret"
        check_key(url, "secret")


def test_api_key_from_environment(tiny_gen, monkeypatch):
    monkeypatch.setenv("RODECO_API_KEY", "from-env")
    with running(tiny_gen("fast"), LIMITS) as (url, state):
        assert state.api_key == "from-env"
        check_key(url, "from-env")


def test_openai_client_gets_authentication_error(tiny_gen, monkeypatch):
    import openai
    from serve_helpers import client

    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    with running(tiny_gen("fast"), ["serve.api_key=secret", *LIMITS]) as (url, _):
        with pytest.raises(openai.AuthenticationError) as e:
            client(url, "nope").models.list()
        assert e.value.status_code == 401
        assert client(url, "secret").models.list().data[0].id == "tiny"


# -- binding -----------------------------------------------------------------------------------------------------------
def config(*overrides: str) -> Any:
    from rodeco.compose import load_config

    return load_config(["reward=logprob", *overrides])


def test_a_vote_that_stops_is_not_served():
    from rodeco.plugins import default_plugins
    from rodeco.serve import check_serve

    with pytest.raises(ConfigError, match="winner.stop"):
        check_serve(config("winner.rule=majority", "winner.stop=beta"), default_plugins())
    check_serve(config(), default_plugins())


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("serve.rejection_start=most", "serve.rejection_start"),
        ("serve.latency_target=0", "serve.latency_target"),
        ("serve.latency_target=-3", "serve.latency_target"),
        ("serve.decode_threads=0", "serve.decode_threads"),
        ("serve.reward_threads=0", "serve.reward_threads"),
    ],
)
def test_bad_admission_settings_name_their_key(override, key):
    from rodeco.plugins import default_plugins
    from rodeco.serve import check_serve

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        check_serve(config(override), default_plugins())
    assert e.value.key == key and "Fix:" in str(e.value)
    check_serve(
        config("serve.rejection_start=best_of", "serve.latency_target=30", "serve.decode_threads=1"), default_plugins()
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5"])
def test_public_binding_without_key_is_refused(host, monkeypatch):
    from rodeco.serve import check_binding

    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    with pytest.raises(ConfigError) as e:
        check_binding(config(f"serve.host='{host}'"))
    assert "serve.host" in str(e.value) and host in str(e.value)
    assert "serve.api_key" in str(e.value)  # the fix


def test_public_binding_allowed_without_key_warns(monkeypatch, caplog):
    from rodeco.serve import check_binding

    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="rodeco.serve"):
        check_binding(config("serve.host=0.0.0.0", "serve.allow_public_without_key=true"))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "rodeco.serve"]
    assert len(warned) == 1 and "0.0.0.0" in warned[0].getMessage() and "no API key" in warned[0].getMessage()


def test_public_binding_with_key_passes(monkeypatch, caplog):
    from rodeco.serve import check_binding

    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="rodeco.serve"):
        check_binding(config("serve.host=0.0.0.0", "serve.api_key=secret"))
        monkeypatch.setenv("RODECO_API_KEY", "from-env")
        check_binding(config("serve.host=0.0.0.0"))
    assert not [r for r in caplog.records if r.name == "rodeco.serve"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_binding_needs_no_key(host, monkeypatch):
    from rodeco.serve import check_binding

    monkeypatch.delenv("RODECO_API_KEY", raising=False)
    check_binding(config(f"serve.host='{host}'"))


# -- admission by latency slack ----------------------------------------------------------------------------------------
def test_a_request_the_plan_has_miss_the_latency_target_is_429_at_once(tiny_model, tiny_tokenizer):
    from rodeco.serve.slack import StepModel

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RODECO_API_KEY", raising=False)
        with running(build_gen(tiny_model, tiny_tokenizer), ["serve.latency_target=5", "serve.retry_after_s=3"]) as (
            url,
            state,
        ):
            times = state.scheduler.step_times
            assert times is not None and times.model.seconds(8, 20) > 0  # fitted at start-up
            with httpx.Client(base_url=url, timeout=60) as c:
                assert c.post(CHAT, json=chat(max_tokens=4, best_of=2)).status_code == 200
                times.model, times.refit_every = StepModel(0.5, 0.0, 0.0), 10**9  # half a second a step, kept
                t0 = time.monotonic()
                r = c.post(CHAT, json=chat(max_tokens=16, best_of=2))  # 8 s planned: past the 5 s target
                assert r.status_code == 429 and time.monotonic() - t0 < 2, r.text
                err = error_of(r)
                assert err["type"] == "rate_limit_error" and err["code"] == "latency_target", err
                assert "serve.latency_target" in err["message"] and "Fix:" in err["message"], err
                assert r.headers["retry-after"] == "3"  # it never could: serve.retry_after_s
                assert c.post(CHAT, json=chat(max_tokens=4, best_of=2)).status_code == 200  # 2 s planned
                assert metric(c.get("/metrics").text, "rodeco_refused_latency_target_total") == 1
