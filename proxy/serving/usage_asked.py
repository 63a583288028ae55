"""Asking a stream for its token usage, so that a key's tokens-per-minute quota can count it.

OpenAI's API and vLLM put `usage` in a stream only when the body asks (`stream_options.include_usage`); llama.cpp
always does. Whether a body streams is read as loosely as the servers that need asking read it (vLLM and SGLang
take `1`, `"true"`, `"yes"` … for true, as Pydantic does): a stricter reading would let `"stream": 1` stream
uncounted.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.serving.route_paths import versionless

USAGE_ON_REQUEST_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
USAGE_ON_REQUEST_ROUTES = USAGE_ON_REQUEST_ROUTES | versionless(USAGE_ON_REQUEST_ROUTES)
_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "t", "y"})


def streams_loosely(value: Any) -> bool:
    """Whether a server reading `stream` as Pydantic does streams: true, 1, or a word meaning true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE_WORDS


def needs_usage_asked(path: str, payload: dict[str, Any] | None) -> bool:
    """Whether a body sent to `path` would stream without its usage unless it asks."""
    if payload is None or path not in USAGE_ON_REQUEST_ROUTES or not streams_loosely(payload.get("stream")):
        return False
    options = payload.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


def asking_usage(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` (changed in place) with `stream_options.include_usage` set, its other stream options kept."""
    options = payload.get("stream_options")
    payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return payload


def raw_body_asking_usage(path: str, content_type: str, body: bytes) -> bytes:
    """A body passed through as is (`/upstream/<model>/…`), asking for usage when it is a JSON object that streams
    on one of the routes that need asking; anything else (not JSON, not such a route) goes unchanged."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if path not in USAGE_ON_REQUEST_ROUTES or (media_type != "application/json" and not media_type.endswith("+json")):
        return body
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(payload, dict) or not needs_usage_asked(path, payload):
        return body
    return json.dumps(asking_usage(payload), ensure_ascii=False).encode()
