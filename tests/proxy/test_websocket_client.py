"""The WebSocket client the passthrough uses, against a hand-written server that sends exactly the frames
each test needs (fragments, pings, a refusal, a dropped connection)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from proxy.websockets import frames as wsf
from proxy.websockets.client import Closed, Message, ProtocolViolation, UpstreamRefused, connect


async def read_client_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    fin, opcode, masked, length = wsf.frame_header(await reader.readexactly(2))
    assert masked, "a client's frames must be masked"
    if wsf.extended_length_size(length):
        length = wsf.extended_length(await reader.readexactly(wsf.extended_length_size(length)))
    mask = await reader.readexactly(4)
    return opcode, wsf.unmask(await reader.readexactly(length), mask)


async def serve_once(script):
    """A server that completes the handshake, then runs `script(reader, writer, request_head)`."""
    seen = {}

    async def handle(reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        seen["head"] = head
        key = next(line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("sec-websocket-key"))
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + wsf.accept_key(key).encode() + b"\r\n\r\n"
        )
        await script(reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", seen


async def test_fragments_are_joined_and_pings_answered():
    pong = asyncio.get_running_loop().create_future()

    async def script(reader, writer):
        writer.write(wsf.encode_frame(wsf.TEXT, "hel".encode(), masked=False, fin=False))
        writer.write(wsf.encode_frame(wsf.PING, b"are you there", masked=False))
        writer.write(wsf.encode_frame(wsf.CONTINUATION, "lo ✓".encode(), masked=False))
        writer.write(wsf.encode_frame(wsf.BINARY, bytes(70_000), masked=False))
        pong.set_result(await read_client_frame(reader))
        opcode, payload = await read_client_frame(reader)
        writer.write(wsf.encode_frame(opcode, payload, masked=False))  # echo the client's message
        writer.write(wsf.encode_frame(wsf.CLOSE, wsf.close_payload(4100, "done"), masked=False))
        await writer.drain()

    server, base, seen = await serve_once(script)
    async with server:
        socket = await connect(base, "/ws?x=1", [("Cookie", "a=b"), ("Host", "evil")], ["chat"], 5)
        assert await socket.receive() == Message(text="hello ✓")
        assert await pong == (wsf.PONG, b"are you there")
        assert await socket.receive() == Message(data=bytes(70_000))
        await socket.send(Message(data=b"\x00\xff"))
        assert await socket.receive() == Message(data=b"\x00\xff")
        assert await socket.receive() == Closed(4100, "done")
    assert seen["head"].startswith("GET /ws?x=1 HTTP/1.1\r\n")
    assert "Cookie: a=b" in seen["head"] and "Host: evil" not in seen["head"]
    assert "Sec-WebSocket-Protocol: chat" in seen["head"]


async def test_a_dropped_connection_is_an_unclean_close():
    async def script(reader, writer):
        writer.close()

    server, base, _ = await serve_once(script)
    async with server:
        socket = await connect(base, "/", [], [], 5)
        assert await socket.receive() == Closed(1006, "the model server dropped the connection", clean=False)


async def test_a_continuation_without_a_message_is_a_protocol_violation():
    async def script(reader, writer):
        writer.write(wsf.encode_frame(wsf.CONTINUATION, b"x", masked=False))
        await writer.drain()

    server, base, _ = await serve_once(script)
    async with server:
        socket = await connect(base, "/", [], [], 5)
        with pytest.raises(ProtocolViolation):
            await socket.receive()


async def test_a_refused_upgrade_carries_its_status_and_body():
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nno socket")
        await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        with pytest.raises(UpstreamRefused) as info:
            await connect(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "/ws", [], [], 5)
    assert (info.value.status, info.value.body, info.value.content_type) == (404, b"no socket", "text/plain")


def test_close_payloads_round_trip_and_cut_long_reasons():
    assert wsf.parse_close(wsf.close_payload(1000, "bye")) == (1000, "bye")
    assert wsf.parse_close(b"") == (wsf.NO_STATUS, "")
    assert len(wsf.close_payload(4000, "x" * 500)) == 125
    assert struct.unpack("!H", wsf.close_payload(4409)[:2])[0] == 4409
