"""CORS preflight: every OPTIONS request, on any path, is answered here with 204.

A browser sends the preflight before a cross-origin request from a web page (a chat UI on another
port, say) and never attaches credentials to it, so it is answered before routing and before the
API key is checked, on the model routes and Django's alike. Any origin is allowed, as in llama-swap:
the API key, not the origin, is what protects the service.
"""

from __future__ import annotations

import re

ALLOWED_METHODS = b"GET, POST, PUT, PATCH, DELETE, OPTIONS"
DEFAULT_ALLOWED_HEADERS = b"Content-Type, Authorization, Accept, X-Requested-With"
MAX_AGE_SECONDS = b"86400"
# RFC 9110 token characters: a requested header name with anything else is not echoed back.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def allowed_headers(requested: str) -> bytes:
    """The requested header names that are well-formed, or the default list when none is."""
    names = [name.strip() for name in requested.split(",")]
    valid = [name for name in names if _HEADER_NAME.fullmatch(name)]
    return ", ".join(valid).encode("latin-1") if valid else DEFAULT_ALLOWED_HEADERS


class PreflightAnswerer:
    """ASGI middleware in front of every HTTP route: OPTIONS gets the preflight answer, the rest passes."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            return await self.app(scope, receive, send)
        requested = ""
        for name, value in scope.get("headers", []):
            if name.lower() == b"access-control-request-headers":
                requested = value.decode("latin-1")
                break
        headers = [
            (b"access-control-allow-origin", b"*"),
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-allow-headers", allowed_headers(requested)),
            (b"access-control-max-age", MAX_AGE_SECONDS),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
