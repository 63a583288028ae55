"""OpenAI-shaped error bodies: what every client library already knows how to show."""

from __future__ import annotations

import json
from http import HTTPStatus

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


class ProxyError(Exception):
    """A request that llamaswap answers itself, with an OpenAI-shaped JSON error."""

    def __init__(self, status: int, message: str, code: str | None = None, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or default_code(status)
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.code)


def default_code(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


def error_type(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, code: str | None = None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": error_type(status), "param": None, "code": code or default_code(status)}}
    ).encode()


def error_event(status: int, message: str, code: str | None = None) -> bytes:
    """The SSE frames that tell a streaming client its stream failed, then end it."""
    return b"data: " + error_body(status, message, code) + b"\n\ndata: [DONE]\n\n"
