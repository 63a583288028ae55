"""Reading a model request: which model it wants, whether it streams, and the body to forward.

Bad input is answered here with a clear OpenAI-shaped error before the request
ever reaches the scheduler, so it can never hold the GPU or start a model.

Bodies over OFF_LOOP_BODY_BYTES are read on a worker thread (`off_loop_when_large`), and their JSON is
parsed with a Python-level object hook and re-encoded piece by piece: the C parser and encoder hold the
GIL for a whole call, so a thread alone would stall the event loop just as long (about 0.1 s to parse and
0.4 s to encode 27 MB of messages); this way the GIL changes hands as they go and every other stream
keeps flowing.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar
from urllib.parse import parse_qs

from proxy.serving.errors import ProxyError
from proxy.serving.multipart import MultipartError, replace_field, text_fields
from proxy.serving.route_paths import EXTRA_JSON_ROUTES, GET_ROUTES, versionless
from proxy.serving.usage_asked import asking_usage

# Reading a body this large inline would hold the event loop for about a millisecond.
OFF_LOOP_BODY_BYTES = 256 * 1024
_ENCODER = json.JSONEncoder(ensure_ascii=False)
_Result = TypeVar("_Result")

# POST routes whose JSON body names the model (llama-swap's list, minus the features we don't ship).
JSON_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/v1/reranking",
        "/rerank",
        "/reranking",
        "/v1/audio/speech",
        "/v1/images/generations",
        "/infill",
        "/completion",
    }
)
# POST routes that carry a multipart form with a `model` field.
MULTIPART_ROUTES = frozenset({"/v1/audio/transcriptions", "/v1/images/edits"})
# Each /v1 route also answers at its versionless /v/... alias.
JSON_ROUTES = JSON_ROUTES | EXTRA_JSON_ROUTES | versionless(JSON_ROUTES | EXTRA_JSON_ROUTES)
MULTIPART_ROUTES = MULTIPART_ROUTES | versionless(MULTIPART_ROUTES)
MODEL_ROUTES = JSON_ROUTES | MULTIPART_ROUTES | GET_ROUTES
UPSTREAM_ROUTE = "/upstream"
COMFYUI_ROUTE = "/comfyui"
MAX_WAIT_HEADER = "X-LlamaSwap-Max-Wait"
MAX_WAIT_SHOWN = 40  # characters of a refused value the error repeats: enough to recognise it
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")  # ASCII only: float() takes "1_0", "١٢", "nan"


def max_wait_seconds(headers: dict[str, str]) -> float | None:
    """The caller's `X-LlamaSwap-Max-Wait`: how long it will wait to be sent to the model, in seconds
    (None: no limit). Unlike the priority, a bad value is refused: silently waiting without the
    limit asked for could hold a caller far longer than it can bear."""
    value = headers.get(MAX_WAIT_HEADER.lower())
    if value is None:
        return None
    text = value.strip(" \t")
    seconds = float(text) if _DECIMAL.fullmatch(text) else 0.0
    if not 0 < seconds < math.inf:
        shown = value if len(value) <= MAX_WAIT_SHOWN else value[:MAX_WAIT_SHOWN] + "…"
        raise ProxyError(
            400,
            f"{MAX_WAIT_HEADER} takes a decimal number of seconds, e.g. 30 or 2.5: digits with at most one '.', "
            f"above 0 and below 10^308; not {shown!r}",
            "invalid_max_wait",
        )
    return seconds


def route_label(path: str) -> str:
    """A request path as a bounded metrics label: one of the model routes, `/upstream`, `/comfyui`, or `other`."""
    if path in MODEL_ROUTES:
        return path
    if path.startswith(UPSTREAM_ROUTE + "/"):
        return UPSTREAM_ROUTE
    if path.startswith(COMFYUI_ROUTE + "/"):
        return COMFYUI_ROUTE
    return "other"


@dataclass(frozen=True)
class ModelRequest:
    """What the proxy learnt from a request body."""

    requested_model: str
    stream: bool
    body: bytes
    content_type: str
    payload: dict[str, Any] | None = None  # the parsed JSON body, when it is JSON


async def off_loop_when_large(body: bytes, read: Callable[..., _Result], *args: Any) -> _Result:
    """`read(*args)`, on a worker thread when `body` is large enough to stall every other request."""
    if len(body) <= OFF_LOOP_BODY_BYTES:
        return read(*args)
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(read, *args))


def read_model_request(path: str, content_type: str, body: bytes) -> ModelRequest:
    """Find the model and stream flag; raises ProxyError (400/415) for anything unusable."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if path in MULTIPART_ROUTES or media_type == "multipart/form-data":
        if media_type != "multipart/form-data":
            raise ProxyError(415, f"{path} expects a multipart/form-data body with a 'model' field", "unsupported_media_type")
        return ModelRequest(_model_field(_multipart_fields(content_type, body)), False, body, content_type)
    if media_type == "application/x-www-form-urlencoded":
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise ProxyError(400, "the form body is not valid UTF-8", "invalid_encoding") from None
        fields = {k: v[0] for k, v in form.items()}
        return ModelRequest(_model_field(fields), fields.get("stream", "").lower() == "true", body, content_type)
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise ProxyError(
            415,
            f"send the request body as JSON with 'Content-Type: application/json' (got {media_type or 'no content type'!r})",
            "unsupported_media_type",
        )
    payload = _json_object(body)
    return ModelRequest(_model_field(payload), payload.get("stream") is True, body, content_type, payload)


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """What json.loads builds for an object anyway; being Python code, it lets other threads run."""
    return dict(pairs)


def _json_object(body: bytes) -> dict:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProxyError(400, f"the request body is not valid UTF-8 (byte {exc.start})", "invalid_encoding") from None
    if not text.strip():
        raise ProxyError(400, "the request body is empty; send a JSON object with a 'model' field", "invalid_json")
    try:
        payload = json.loads(text, object_pairs_hook=_object_pairs if len(body) > OFF_LOOP_BODY_BYTES else None)
    except json.JSONDecodeError as exc:
        raise ProxyError(
            400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", "invalid_json"
        ) from None
    except RecursionError:
        raise ProxyError(400, "the request body is not valid JSON: nested too deeply", "invalid_json") from None
    except ValueError as exc:  # an integer longer than Python reads (4300 digits)
        raise ProxyError(400, f"the request body cannot be read: {exc}", "invalid_json") from None
    if not isinstance(payload, dict):
        raise ProxyError(400, f"the request body must be a JSON object, not {type(payload).__name__}", "invalid_json")
    return payload


def _model_field(fields: dict) -> str:
    if "model" not in fields:
        raise ProxyError(400, "the request has no 'model' field; say which model should answer", "model_missing")
    model = fields["model"]
    if not isinstance(model, str):
        raise ProxyError(400, f"'model' must be a string, not {type(model).__name__}", "invalid_model")
    if not model.strip():
        raise ProxyError(400, "'model' is empty; say which model should answer", "model_missing")
    return model.strip()


def _multipart_fields(content_type: str, body: bytes) -> dict[str, str]:
    try:
        return text_fields(content_type, body)
    except MultipartError as exc:
        raise ProxyError(400, f"the multipart body could not be read: {exc}", "invalid_multipart") from None


def forwarded_body(request: ModelRequest, use_model_name: str, filters, ask_usage: bool = False) -> bytes:
    """Apply useModelName and the filters, and with `ask_usage` ask a stream for its token usage (a key's
    tokens-per-minute quota counts them); the original bytes travel untouched when nothing changes."""
    media_type = request.content_type.split(";", 1)[0].strip().lower()
    if media_type == "multipart/form-data":
        return replace_field(request.content_type, request.body, "model", use_model_name) if use_model_name else request.body
    if media_type != "application/json" and not media_type.endswith("+json"):
        return request.body
    if not use_model_name and filters.is_empty and not ask_usage:
        return request.body
    payload = request.payload
    if use_model_name:
        payload["model"] = use_model_name
    payload = filters.apply(payload, requested=request.requested_model)  # setParamsByID picks by the name asked for
    if ask_usage:
        asking_usage(payload)
    if len(request.body) > OFF_LOOP_BODY_BYTES:
        return _encode_in_pieces(payload)
    return json.dumps(payload, ensure_ascii=False).encode()


def _encode_in_pieces(payload: dict) -> bytes:
    """json.dumps's output, built by the pure-Python encoder one piece at a time so the GIL changes hands."""
    out = io.BytesIO()
    for piece in _ENCODER.iterencode(payload):
        out.write(piece.encode())
    return out.getvalue()  # hands over the buffer: no 27 MB copy while holding the GIL
