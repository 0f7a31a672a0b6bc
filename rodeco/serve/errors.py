"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, and the server's errors as exceptions."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered with OpenAI's error body: ``status`` and ``type`` as OpenAI uses them, ``param`` the request
    field at fault, ``headers`` extra response headers (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, value: Any, problem: str, fix: str, code: str = "invalid_value") -> APIError:
    """A 400 that names the field, its value and the fix."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return APIError(400, f"{param}={shown}: {problem}. Fix: {fix}", param=param, code=code)
