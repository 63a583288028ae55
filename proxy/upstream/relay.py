"""Forwarding one granted request upstream and streaming the answer back, chunk by chunk."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpcore
import httpx

from proxy.serving.auth import without_own_cookies
from proxy.serving.errors import ProxyError, error_event
from proxy.upstream.clients import UPSTREAM_ERRORS, UpstreamClient
from proxy.upstream.usage import usage_from_json, usage_from_sse
from scheduling.tickets import Outcome, RequestState

# RFC 9110 §7.6.1 hop-by-hop headers, plus what httpx/daphne set themselves.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
_JSON_KEEP_LIMIT = 4 * 1024 * 1024
_SSE_TAIL_CHUNKS = 16
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def as_sent(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Headers back to the bytes the client sent: httpx would refuse a non-ASCII str value."""
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def identity_headers(ticket_id: int, waited_s: float) -> dict[str, str]:
    """The headers naming a request's row and its wait, on every answer to a request that had a row."""
    return {"X-LlamaSwap-Request-Id": str(ticket_id), "X-LlamaSwap-Queue-Wait-Ms": str(int(waited_s * 1000))}


def upstream_headers(headers: dict[str, str], drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """What is forwarded of a request's headers (lower-case names): not `drop`, nor hop-by-hop or framing
    ones, nor this server's own cookies (an admin's session would reach the model server)."""
    return without_own_cookies((k, v) for k, v in headers.items() if k not in _NOT_FORWARDED and k not in drop)


def upstream_request(client: UpstreamClient, method: str, url: str, headers: list[tuple[bytes, bytes]],
                     body: bytes) -> httpcore.Request:
    """The request framed as httpx frames it: Host from the URL (which httpx parses and escapes), and
    Content-Length for a body, or 0 for a POST, PUT or PATCH without one."""
    scheme, host, port, path, netloc = _parsed(url)
    framing = [(b"host", netloc)]
    if body or method in _BODY_METHODS:
        framing.append((b"content-length", b"%d" % len(body)))
    return httpcore.Request(
        method, httpcore.URL(scheme=scheme, host=host, port=port, target=path),
        headers=framing + headers, content=body, extensions=client.extensions,
    )


@functools.lru_cache(maxsize=512)
def _parsed(url: str) -> tuple[bytes, bytes, int | None, bytes, bytes]:
    """The parts of a model URL as httpx parses and escapes them; the same few URLs come again and again."""
    target = httpx.URL(url)
    return target.raw_scheme, target.raw_host, target.port, target.raw_path, target.netloc


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    """The first value of a response header (`name` lower-case), or ""."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body's length from Content-Length, or None (chunked, or until the connection closes)."""
    if header_value(headers, b"transfer-encoding"):
        return None  # the chunks are the body, whatever length a model names beside them
    value = header_value(headers, b"content-length")
    return int(value) if value.isdigit() else None


def downstream_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The model's response headers the client gets: not the hop-by-hop ones, nor a Content-Length beside a
    Transfer-Encoding (HTTP lets the encoding override it; passed on, it would cut the body short for the client,
    and the rest would be read as the next answer on its connection)."""
    drop = HOP_BY_HOP | {"content-length"} if header_value(headers, b"transfer-encoding") else HOP_BY_HOP
    out = [(k, v) for k, v in headers if k.decode("latin-1").lower() not in drop]
    if header_value(headers, b"content-type").startswith("text/event-stream") and not header_value(headers, b"x-accel-buffering"):
        out.append((b"x-accel-buffering", b"no"))  # one already there (a peer that is a llamaswap) is not repeated
    return out


class ResponseSink(Protocol):
    """Where a relayed answer goes: an HTTP consumer's response, or anything that takes one."""

    response_started: bool

    async def send_headers(self, *, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None: ...

    async def send_body(self, body: bytes, *, more_body: bool = False) -> None: ...


def _ignore(outcome: Outcome) -> None:
    """For an answer that has no row to end."""


async def relay(sink: ResponseSink, client: UpstreamClient, model: str, method: str, url: str,
                headers: list[tuple[bytes, bytes]], body: bytes,
                answered: Callable[[Outcome], None] = _ignore, own_headers: list[tuple[bytes, bytes]] = ()) -> Outcome:
    """Send the request and stream the response to `sink`, with `own_headers` added to the model's;
    returns how it ended. Raises ProxyError only before any byte is sent.

    `answered` is given the same outcome as soon as the model has finished answering (or failed), before
    the last write to the client, so the GPU passes to the next request without waiting for that write.
    If the response has begun already (a loading state streamed the wait), the model's stream goes on
    it as is, and a model's error becomes an error event on it.
    """
    loop = asyncio.get_running_loop()
    request = upstream_request(client, method, url, headers, body)
    try:
        response = await client.pool.handle_async_request(request)
    except httpcore.TimeoutException as exc:
        raise ProxyError(504, f"model '{model}' did not answer in time ({type(exc).__name__})", "upstream_timeout") from None
    except UPSTREAM_ERRORS as exc:
        raise ProxyError(502, f"model '{model}' could not be reached: {exc or type(exc).__name__}", "upstream_unreachable") from None
    content_type = header_value(response.headers, b"content-type")
    is_sse = content_type.startswith("text/event-stream")
    is_json = "json" in content_type
    kept: deque[bytes] | list[bytes] = deque(maxlen=_SSE_TAIL_CHUNKS) if is_sse else []
    keep = is_sse or is_json
    if sink.response_started and response.status >= 400:
        return await _error_on_begun_stream(sink, model, response, answered)
    first_byte: float | None = None
    sent = 0
    # The piece that completes a body of known length goes out as the response's last write, once the GPU is
    # released, instead of a write and then an empty one: one write to the client fewer, and an earlier release.
    length = _content_length(response.headers)
    held = b""
    try:
        if not sink.response_started:
            mine = {name for name, _ in own_headers}  # lower-case; a model's of the same name (a peer's row id) gives way
            own = [h for h in downstream_headers(response.headers) if h[0].lower() not in mine] + list(own_headers)
            await sink.send_headers(status=response.status, headers=own)
        # Streams come as many small chunks worth batching; other bodies arrive in a few large reads,
        # which go straight through without the batching task's extra hop.
        chunks = _coalesced(response.aiter_stream()) if is_sse else _single(response.aiter_stream())
        async with contextlib.aclosing(chunks) as batches:
            async for chunks in batches:
                if first_byte is None:
                    first_byte = loop.time()
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                sent += len(data)
                if keep and (is_sse or sent <= _JSON_KEEP_LIMIT):
                    kept.append(data)
                if sent == length:
                    held = data
                else:
                    await sink.send_body(data, more_body=True)
    except UPSTREAM_ERRORS as exc:
        await response.aclose()
        if held:
            await sink.send_body(held, more_body=True)
        outcome = Outcome(
            state=RequestState.FAILED, status_code=502, first_byte_monotonic=first_byte, response_bytes=sent,
            error=f"model '{model}' stopped answering mid-response: {exc or type(exc).__name__}",
        )
        answered(outcome)
        await sink.send_body(error_event(502, outcome.error, "upstream_failed") if is_sse else b"")
        return outcome
    except BaseException:
        await response.aclose()
        raise
    await response.aclose()
    outcome = _read_outcome(response, kept, is_sse, is_json, first_byte, sent)
    answered(outcome)
    await sink.send_body(held)
    return outcome


async def _error_on_begun_stream(sink: ResponseSink, model: str, response: httpcore.Response,
                                 answered: Callable[[Outcome], None]) -> Outcome:
    try:
        body = await response.aread()
    except UPSTREAM_ERRORS:
        body = b""
    finally:
        await response.aclose()
    outcome = Outcome(state=RequestState.FAILED, status_code=response.status, error=_error_message(body, response), response_bytes=0)
    answered(outcome)
    await sink.send_body(error_event(response.status, f"model '{model}': {outcome.error}", "upstream_error"))
    return outcome


def _read_outcome(response: httpcore.Response, kept, is_sse: bool, is_json: bool, first_byte: float | None,
                  sent: int) -> Outcome:
    """How an answer the model finished ended: the error of a failed one and the token counts, from what
    was kept of the body."""
    failed = response.status >= 400
    usage: dict[str, Any] = {}
    if is_sse:
        usage = usage_from_sse(kept)
    elif is_json and kept and sent <= _JSON_KEEP_LIMIT:
        try:
            usage = usage_from_json(json.loads(b"".join(kept)))
        except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested too deeply to read
            pass
    return Outcome(
        state=RequestState.FAILED if failed else RequestState.COMPLETED, status_code=response.status,
        error=_error_message(b"".join(kept), response) if failed else "", usage=usage,
        first_byte_monotonic=first_byte, response_bytes=sent,
    )


async def _single(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    async for chunk in chunks:
        yield [chunk]


async def _coalesced(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """Yield what the upstream sent, batching chunks that arrive while the client write is under way.

    A reader task pulls chunks as fast as they come; each yield hands over everything read since the
    last one. A slow stream (tokens at a human pace) is forwarded chunk by chunk with no added delay;
    a fast one is written in fewer, larger pieces, so per-write costs stop dominating.
    """
    pending: list[bytes] = []
    arrived = asyncio.Event()
    finished: list[BaseException | None] = []

    async def read() -> None:
        try:
            async for chunk in chunks:
                pending.append(chunk)
                arrived.set()
            finished.append(None)
        except BaseException as exc:  # handed to the writer side, which re-raises it
            finished.append(exc)
        arrived.set()

    reader = asyncio.get_running_loop().create_task(read())
    try:
        while True:
            await arrived.wait()
            arrived.clear()
            if pending:
                batch = pending[:]
                pending.clear()
                yield batch
            if finished and not pending:
                if finished[0] is not None:
                    raise finished[0]
                return
    finally:
        if not reader.done():
            reader.cancel()
            await asyncio.wait([reader])


def _error_message(body: bytes, response: httpcore.Response) -> str:
    """llama-swap's rule: error.message, error, message or detail, else the status text."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested too deeply to read
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for key in ("error", "message", "detail"):
            if isinstance(payload.get(key), str):
                return payload[key]
    reason = response.extensions.get("reason_phrase", b"").decode("ascii", "ignore")
    return f"{response.status} {reason}"
