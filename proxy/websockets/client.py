"""The client side of a WebSocket to a model server, over asyncio streams.

Written against RFC 6455 rather than borrowed from autobahn: autobahn's asyncio client is built around
protocol callbacks, while the passthrough needs an awaitable `receive()` it can race against the
browser's side. No extensions (no compression) are offered, so every frame is plain.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.websockets import frames as wsf

HEAD_LIMIT = 64 * 1024  # the upstream's handshake answer: status line and headers
REFUSAL_BODY_LIMIT = 64 * 1024  # what is kept of an upstream's non-101 answer, to show the client
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one message, all its fragments together
# Headers the passthrough sets itself, or that belong to one hop of the connection.
_NOT_FORWARDED = frozenset({
    "host", "connection", "upgrade", "sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol",
    "sec-websocket-extensions", "sec-websocket-accept", "content-length", "transfer-encoding", "keep-alive",
    "proxy-connection", "te", "trailer",
})


class UpstreamRefused(Exception):
    """The model server answered the upgrade with something other than 101."""

    def __init__(self, status: int, body: bytes, content_type: str):
        super().__init__(f"the model server answered the WebSocket upgrade with HTTP {status}")
        self.status = status
        self.body = body
        self.content_type = content_type


class ProtocolViolation(Exception):
    """The model server sent frames RFC 6455 does not allow."""


@dataclass(frozen=True)
class Message:
    """One whole message: `text` for a text message, else `data`."""

    text: str | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Closed:
    """The model server closed the socket: with a close frame (its code), or by dropping the connection."""

    code: int
    reason: str = ""
    clean: bool = True


class UpstreamSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, subprotocol: str | None):
        self._reader = reader
        self._writer = writer
        self.subprotocol = subprotocol
        self._close_sent = False

    async def send(self, message: Message) -> None:
        if message.text is not None:
            await self._write(wsf.TEXT, message.text.encode())
        else:
            await self._write(wsf.BINARY, message.data or b"")

    async def close(self, code: int, reason: str = "", wait_s: float = 0.0) -> None:
        """Send our close frame (once) and end the connection. With `wait_s`, first give the server that
        long to answer and hang up (RFC 6455 has the server close the TCP connection first), so a model
        stopped next is not stopped in the middle of its side of the close; what it sends meanwhile is
        dropped. Nothing else may be reading then."""
        if not self._close_sent:
            self._close_sent = True
            try:
                await self._write(wsf.CLOSE, wsf.close_payload(code, reason))
            except (ConnectionError, RuntimeError):
                pass
        if wait_s > 0:
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(wait_s):
                    while await self._reader.read(65536):
                        pass
        self._writer.close()

    async def receive(self) -> Message | Closed:
        """The next whole message, answering pings on the way; Closed once the server is done."""
        parts: list[bytes] = []
        size = 0
        message_opcode = None
        while True:
            try:
                fin, opcode, payload = await self._read_frame()
            except (asyncio.IncompleteReadError, ConnectionError):
                return Closed(1006, "the model server dropped the connection", clean=False)
            if opcode == wsf.PING:
                await self._write(wsf.PONG, payload)
            elif opcode == wsf.PONG:
                continue
            elif opcode == wsf.CLOSE:
                code, reason = wsf.parse_close(payload)
                if not self._close_sent:  # the closing handshake: echo the code
                    await self.close(code)
                return Closed(code, reason)
            else:
                if (opcode == wsf.CONTINUATION) != (message_opcode is not None):
                    raise ProtocolViolation("a continuation frame without a message, or a new message inside one")
                message_opcode = message_opcode if opcode == wsf.CONTINUATION else opcode
                size += len(payload)
                if size > MAX_MESSAGE_BYTES:
                    raise ProtocolViolation(f"a message over {MAX_MESSAGE_BYTES} bytes")
                parts.append(payload)
                if fin:
                    whole = b"".join(parts)
                    if message_opcode == wsf.TEXT:
                        return Message(text=whole.decode("utf-8", "replace"))
                    return Message(data=whole)

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        fin, opcode, masked, length = wsf.frame_header(await self._reader.readexactly(2))
        if opcode not in (wsf.CONTINUATION, wsf.TEXT, wsf.BINARY) and opcode not in wsf.CONTROL_OPCODES:
            raise ProtocolViolation(f"unknown opcode {opcode:#x}")
        extra = wsf.extended_length_size(length)
        if extra:
            length = wsf.extended_length(await self._reader.readexactly(extra))
        if length > MAX_MESSAGE_BYTES:
            raise ProtocolViolation(f"a frame over {MAX_MESSAGE_BYTES} bytes")
        mask = await self._reader.readexactly(4) if masked else b""
        payload = await self._reader.readexactly(length)
        return fin, opcode, wsf.unmask(payload, mask) if masked else payload

    async def _write(self, opcode: int, payload: bytes) -> None:
        self._writer.write(wsf.encode_frame(opcode, payload, masked=True))
        await self._writer.drain()


async def connect(
    base_url: str, path: str, headers: list[tuple[str, str]], subprotocols: list[str], timeout: float | None,
) -> UpstreamSocket:
    """Open `path` (with its query) on the server at `base_url` as a WebSocket.

    `headers` are the client's, forwarded except the hop-by-hop and handshake ones. Raises
    UpstreamRefused for a non-101 answer, OSError or TimeoutError when the server cannot be reached.
    """
    parts = urlsplit(base_url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    prefix = parts.path.rstrip("/")
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(
            host, port, ssl=ssl.create_default_context() if secure else None, limit=HEAD_LIMIT,
        )
        try:
            key = wsf.new_key()
            lines = [
                f"GET {prefix}{path} HTTP/1.1", f"Host: {parts.netloc.rpartition('@')[2]}", "Upgrade: websocket", "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
            ]
            if subprotocols:
                lines.append("Sec-WebSocket-Protocol: " + ", ".join(subprotocols))
            lines += [f"{name}: {value}" for name, value in headers if name.lower() not in _NOT_FORWARDED]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            await writer.drain()
            status, answer = await _read_head(reader)
            if status != 101:
                raise UpstreamRefused(status, await _refusal_body(reader, answer), answer.get("content-type", ""))
            if answer.get("sec-websocket-accept") != wsf.accept_key(key):
                raise UpstreamRefused(502, b"the model server's Sec-WebSocket-Accept does not match our key", "text/plain")
        except BaseException:
            writer.close()
            raise
    return UpstreamSocket(reader, writer, answer.get("sec-websocket-protocol"))


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
        raise UpstreamRefused(502, b"the model server's answer to the WebSocket upgrade is not HTTP", "text/plain") from None
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(status_line.split(" ", 2)[1])
    except (IndexError, ValueError):
        raise UpstreamRefused(502, b"the model server's answer to the WebSocket upgrade is not HTTP", "text/plain") from None
    answer: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            answer.setdefault(name.strip().lower(), value.strip())
    return status, answer


async def _refusal_body(reader: asyncio.StreamReader, answer: dict[str, str]) -> bytes:
    try:
        length = min(int(answer.get("content-length", "0")), REFUSAL_BODY_LIMIT)
        return await reader.readexactly(length)
    except (ValueError, asyncio.IncompleteReadError, ConnectionError):
        return b""
