"""A Channels HTTP consumer whose handler runs in a child task.

A stock AsyncHttpConsumer only reads `http.disconnect` after `handle()` returns,
so a client that hangs up mid-stream goes unnoticed for ~10 s. Running the
handler as a child task keeps the dispatch loop free: the disconnect arrives
within a millisecond and cancels the handler, which closes the upstream
request and frees the GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from proxy.serving.errors import ProxyError, error_body
from proxy.api.unavailable import as_unavailable

log = logging.getLogger("llamaswap.proxy")


class StreamingHttpConsumer(AsyncHttpConsumer):
    #: Bodies larger than this are answered with 413 without being kept in memory.
    max_body_bytes: int = 32 * 1024 * 1024
    #: No channel of its own: the scheduler is reached through its front door. (With a layer
    #: configured, Channels would otherwise open a channel and a receive loop per request.)
    channel_layer_alias = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._job: asyncio.Task | None = None
        self._received = 0
        self.body_too_large = False
        self.response_started = False
        self.response_ended = False

    async def __call__(self, scope, receive, send):
        """Channels' own loop for a consumer with no channel layer, without its task per message: Channels wraps each
        `receive()` in a task and waits on it with `asyncio.wait()`, two turns of the event loop for every message
        (the request, then its disconnect), where one source of messages needs neither; a message already queued
        is dispatched at once."""
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    async def dispatch(self, message):
        """Channels closes stale DB connections (a thread hop) before every message; these consumers
        never touch the database — the recorder thread does — so each message goes straight to its handler."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def http_request(self, message):
        if self._job is not None:
            return
        chunk = message.get("body", b"")
        self._received += len(chunk)
        if self._received > self.body_limit():
            self.body_too_large = True
            self.body.clear()
        else:
            self.body.append(chunk)
        if not message.get("more_body"):
            self._job = asyncio.get_running_loop().create_task(self._run(b"".join(self.body)))
            self.body.clear()

    def body_limit(self) -> int:
        return self.max_body_bytes

    async def _run(self, body: bytes) -> None:
        try:
            await self.handle(body)
        except ProxyError as exc:
            await self.send_error(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a child task's crash is invisible to daphne: answer it here
            refusal = as_unavailable(exc)  # the scheduler or the database away: 503, not a crash
            if refusal is None:
                log.exception("unexpected failure while handling %s", self.scope.get("path"))
                refusal = ProxyError(500, "llamaswap hit an unexpected error; see its log", "internal_error")
            await self.send_error(refusal)

    async def http_disconnect(self, message):
        if self._job is not None and not self._job.done():
            self._job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._job
        await self.disconnect()
        raise StopConsumer()

    async def send_headers(self, *, status=200, headers=None):
        self.response_started = True
        await super().send_headers(status=status, headers=headers)

    async def send_body(self, body, *, more_body=False):
        if not more_body:
            self.response_ended = True
        await super().send_body(body, more_body=more_body)

    async def send_error(self, exc: ProxyError) -> None:
        """Answer with an OpenAI-shaped JSON error, or just end the response if it already began."""
        if self.response_ended:
            return
        if self.response_started:
            await self.send_body(b"")
            return
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in exc.headers.items()]
        await self.send_response(exc.status, error_body(exc.status, exc.message, exc.code), headers=headers)

    def header(self, name: bytes) -> str | None:
        """The first value of a request header, decoded as latin-1 (what HTTP allows)."""
        for key, value in self.scope.get("headers", []):
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    def header_map(self) -> dict[str, str]:
        """Lower-cased request headers; the first of repeated headers wins."""
        headers: dict[str, str] = {}
        for key, value in self.scope.get("headers", []):
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        return headers
