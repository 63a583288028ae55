"""httpcore's network layer on plain asyncio transports, for the connections to the model servers.

On asyncio, httpcore's default network backend is anyio, which costs more than the I/O itself on
this path: every read and write gets its own cancel scope and event-loop turn, and reading is
switched on and off in the selector around each read. Here a connection reads whatever arrives
into a buffer (up to a limit, so a slow client still holds a fast model back), a read returns what
is buffered without a loop turn, and a write goes to the transport once the request is complete: h11
writes a request's head and its body apart, and small writes are held until httpcore reads the answer
(or closes), so a request reaches the model as one send, not two that wake it twice. HTTP itself — h11,
the pool, keep-alive — stays httpcore's.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from typing import Any

import httpcore

_READ_LIMIT = 256 * 1024  # buffered bytes at which reading from the socket pauses
_HELD_LIMIT = 64 * 1024  # written bytes held for one send at most; more go out at once


class SocketStream(asyncio.Protocol, httpcore.AsyncNetworkStream):
    """One TCP connection: the asyncio protocol that fills the buffer, and the stream httpcore reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tls_handshake_timeout: float | None = None):
        self._loop = loop
        self._tls_handshake_timeout = tls_handshake_timeout
        self._transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._reading_paused = False
        self._eof = False
        self._error: Exception | None = None
        self._readable: asyncio.Future | None = None
        self._writable: asyncio.Future | None = None
        self._held: list[bytes] = []  # small writes not yet handed to the transport
        self._held_bytes = 0

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= _READ_LIMIT and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        return False  # close the transport: an HTTP/1.1 connection is done once the server half-closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake_reader()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _wake_reader(self) -> None:
        if self._readable is not None and not self._readable.done():
            self._readable.set_result(None)

    # -- httpcore.AsyncNetworkStream --------------------------------------------------------------
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            self._flush()
        if not self._chunks and not self._eof:
            self._readable = self._loop.create_future()
            try:
                await _within(self._readable, timeout, httpcore.ReadTimeout)
            finally:
                self._readable = None
        if not self._chunks:
            if self._error is not None:
                raise httpcore.ReadError(str(self._error) or type(self._error).__name__)
            return b""
        data = self._chunks.popleft()
        if len(data) > max_bytes:
            self._chunks.appendleft(data[max_bytes:])
            data = data[:max_bytes]
        self._buffered -= len(data)
        if self._reading_paused and self._buffered < _READ_LIMIT // 2:
            self._reading_paused = False
            self._transport.resume_reading()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError(str(self._error) if self._error else "the connection is closed")
        if self._writable is None and self._held_bytes + len(buffer) <= _HELD_LIMIT:
            self._held.append(buffer)  # sent with the rest of the request, at the first read
            self._held_bytes += len(buffer)
            return
        if self._held:
            self._flush()  # a large body is not copied to join it to the head
        self._transport.write(buffer)
        if self._writable is not None:
            await _within(self._writable, timeout, httpcore.WriteTimeout)
            if self._error is not None:
                raise httpcore.WriteError(str(self._error))

    def _flush(self) -> None:
        held = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        if not self._transport.is_closing():
            self._transport.write(held)

    async def aclose(self) -> None:
        if self._held:
            self._flush()
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> SocketStream:
        # httpcore passes the connect timeout; the handshake has its own (`timeouts.tlsHandshake`).
        timeout = self._tls_handshake_timeout
        try:
            self._transport = await asyncio.wait_for(
                self._loop.start_tls(self._transport, self, ssl_context, server_hostname=server_hostname), timeout)
        except TimeoutError:
            self._transport.abort()
            raise httpcore.ConnectTimeout(f"TLS handshake with {server_hostname} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            self._transport.abort()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # httpcore asks before reusing an idle connection: data or a close the loop has not seen yet
            # count too, as the server may have closed it a moment ago.
            if self._chunks or self._eof or self._transport.is_closing():
                return True
            sock = self._transport.get_extra_info("socket")
            poll = select.poll()
            poll.register(sock.fileno(), select.POLLIN)
            return bool(poll.poll(0))
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        return self._transport.get_extra_info(info)


async def _within(waiter: asyncio.Future, timeout: float | None, error: type[Exception]) -> None:
    """Wait for `waiter`; past `timeout` seconds raise `error` instead (a task cancellation stays one)."""
    if timeout is None:
        await waiter
        return
    expired = []

    def expire() -> None:
        if not waiter.done():
            expired.append(True)
            waiter.set_result(None)

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        await waiter
    finally:
        timer.cancel()
    if expired:
        raise error(f"no progress within {timeout:g} s")


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, tls_handshake_timeout: float | None = None):
        self.tls_handshake_timeout = tls_handshake_timeout

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options=None) -> SocketStream:
        loop = asyncio.get_running_loop()
        stream = SocketStream(loop, self.tls_handshake_timeout)
        try:
            transport, _ = await asyncio.wait_for(loop.create_connection(
                lambda: stream, host, port, local_addr=(local_address, 0) if local_address else None), timeout)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        for option in socket_options or ():  # asyncio has already turned Nagle off
            transport.get_extra_info("socket").setsockopt(*option)
        return stream

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
