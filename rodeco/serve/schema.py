"""The request bodies the server takes (OpenAI's chat and completions requests, plus ``best_of`` and a ``rodeco``
object), parsed strictly: bad JSON, a wrong type, an unknown field or an OpenAI field rodeco does not support is a
400 that names the field, the value and the fix."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from rodeco.serve.errors import APIError, bad_field

Number = Union[StrictInt, StrictFloat]

# OpenAI fields rodeco does not implement: accepted only at the value that turns them off
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False),
    "suffix": (None, ""),
    "parallel_tool_calls": (None,),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "metadata": (None, {}),
}

FIXES = {
    "model": "use a name GET /v1/models lists",
    "messages": "send a list of {role, content} messages ending with a user message",
    "prompt": "send the prompt as one string",
    "max_tokens": "give a whole number of at least 1",
    "max_completion_tokens": "give a whole number of at least 1",
    "temperature": "give a number in [0, 2] (0: greedy)",
    "top_p": "give a number in (0, 1]",
    "seed": "give a whole number",
    "stop": "give a string or a list of up to 4 non-empty strings",
    "n": "give a whole number of at least 1, at most best_of",
    "best_of": "give a whole number of at least n",
    "stream": "give true or false",
    "user": "give a string",
    "rodeco": 'send {"policy": NAME, "params": {...}, "kv_tokens": N, "record": {...}}; every key is optional',
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RodecoOptions(_Strict):
    """What a request may choose of rodeco's: a policy the server offers, its parameters within their ranges, and
    its budget in KV tokens; and the prompt's record beyond its text (``record``: a ``gold_answer``), which the
    server's rewards receive with each request (``ScoreRequest.meta``)."""

    policy: StrictStr | None = None
    params: dict[StrictStr, Union[StrictBool, StrictInt, StrictFloat, StrictStr]] = Field(default_factory=dict)
    kv_tokens: StrictInt | None = None
    record: dict[StrictStr, Union[StrictBool, StrictInt, StrictFloat, StrictStr]] = Field(default_factory=dict)


class ContentPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[StrictStr, list[ContentPart]]
    name: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Common(_Strict):
    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    seed: StrictInt | None = None
    stop: Union[StrictStr, list[StrictStr], None] = None
    user: StrictStr | None = None
    n: StrictInt = 1
    best_of: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    rodeco: RodecoOptions | None = None

    def stops(self) -> tuple[str, ...]:
        return () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatRequest(_Common):
    messages: list[Message]
    max_completion_tokens: StrictInt | None = None

    def new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Common):
    prompt: Union[StrictStr, list[StrictStr]]

    def new_tokens(self) -> int | None:
        return self.max_tokens


RequestT = TypeVar("RequestT", bound=_Common)


def parse(body: bytes, kind: type[RequestT]) -> RequestT:
    """A request body as ``kind``, or an ``APIError`` (400) naming what is wrong."""
    try:
        return _parse(body, kind)
    except RecursionError:  # JSON nested past Python's recursion limit: json.loads (or a repr of it) gives up
        raise APIError(
            400, "the body's JSON is nested too deeply. Fix: send a flat JSON object", code="invalid_json"
        ) from None


def _lone_surrogate(data: Any) -> str | None:
    """The path of the first string (or key) in ``data`` holding a lone UTF-16 surrogate (JSON's ``"\\ud800"``):
    not Unicode text, which no tokenizer (nor the JSON answer naming it) can encode. Iterative: any depth."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # fast: UTF-8 has no surrogates
        return None
    except UnicodeEncodeError:
        pass
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        path, v = todo.pop()
        if isinstance(v, str) and _SURROGATE.search(v):
            return path or "body"
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, x in items:
            name = str(k).encode("utf-8", "backslashreplace").decode("utf-8")
            sub = f"{path}.{name}" if path else name
            if isinstance(k, str) and _SURROGATE.search(k):
                return sub
            todo.append((sub, x))
    return None


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _parse(body: bytes, kind: type[RequestT]) -> RequestT:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(
            400,
            f"the body is not valid JSON ({e}). Fix: send a JSON object with Content-Type: application/json",
            code="invalid_json",
        ) from None
    if not isinstance(data, dict):
        raise APIError(
            400,
            f"the body is a JSON {type(data).__name__}, not an object. Fix: send a JSON object",
            code="invalid_json",
        )
    bad = _lone_surrogate(data)
    if bad is not None:
        raise APIError(
            400,
            f"{bad}: a lone UTF-16 surrogate (a \\ud800-\\udfff escape not in a pair) is not "
            "text. Fix: send valid Unicode (UTF-8) strings",
            param=bad,
            code="invalid_value",
        )
    off = [k for k, ok in UNSUPPORTED.items() if k in data and data[k] not in ok]
    if off:
        raise APIError(
            400,
            f"rodeco does not support {', '.join(off)} (given {', '.join(f'{k}={data[k]!r}'[:80] for k in off)}). "
            "Fix: leave them out",
            param=off[0],
            code="unsupported_parameter",
        )
    data = {k: v for k, v in data.items() if k not in UNSUPPORTED}
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err["loc"]]
        # a union's error names its member type after the field: report the field the client wrote
        param = ".".join(x for x in loc if x not in _TYPE_NAMES)
        if err["type"] == "extra_forbidden":
            raise bad_field(
                param,
                err.get("input"),
                "unknown field",
                "leave it out (OpenAI's chat/completions fields, best_of and rodeco are taken)",
                code="unknown_parameter",
            ) from None
        if err["type"] == "missing":
            raise bad_field(param, None, "required", FIXES.get(loc[0], "give it"), code="missing_parameter") from None
        raise bad_field(param, err.get("input"), err["msg"].lower(), FIXES.get(loc[0], "see docs/serve.md")) from None


_TYPE_NAMES = {
    "str",
    "int",
    "float",
    "bool",
    "list[str]",
    "list[ContentPart]",
    "function-after",
    "none",
    "dict",
    "is-instance",
    "literal",
    "lax-or-strict",
}
