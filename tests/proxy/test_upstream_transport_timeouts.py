"""timeouts.keepalive and timeouts.tlsHandshake on the connections to a model server (idleConn is
tested end to end in tests/e2e/test_llama_swap_model_keys.py)."""

from __future__ import annotations

import asyncio
import socket
import time

import httpcore
import pytest

from proxy.config.model import UpstreamTimeouts
from proxy.upstream.clients import UpstreamClient

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def serve(answer: bytes | None):
    """A local TCP server that answers every connection with `answer` (None: never says a word)."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if answer is not None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        await asyncio.sleep(30)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("keepalive, expected", [(7.0, (1, 7, 7)), (None, (0, None, None))])
def test_keepalive_sets_tcp_keepalive_probes_on_each_connection(keepalive, expected):
    async def scenario():
        server, port = await serve(ANSWER)
        client = UpstreamClient(UpstreamTimeouts(keepalive=keepalive))
        try:
            response = await client.pool.request("GET", f"http://127.0.0.1:{port}/", extensions=client.extensions)
            sock = response.extensions["network_stream"].get_extra_info("socket")
            on = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) if on else None
            interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) if on else None
            return (1 if on else 0, idle, interval)
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(scenario()) == expected


def test_tls_handshake_timeout_bounds_a_server_that_never_answers_the_handshake():
    async def scenario():
        server, port = await serve(None)
        client = UpstreamClient(UpstreamTimeouts(connect=30, tls_handshake=0.3))
        started = time.monotonic()
        try:
            with pytest.raises(httpcore.ConnectTimeout, match="TLS handshake"):
                await client.pool.request("GET", f"https://127.0.0.1:{port}/", extensions=client.extensions)
            return time.monotonic() - started
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(scenario()) < 5  # the 30 s connect timeout does not apply to the handshake
