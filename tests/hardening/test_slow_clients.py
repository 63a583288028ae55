"""Slow clients against the real service: a connection that never completes its request head is closed
after `--client-timeout`, while queue waits and streams longer than that are never cut."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e

CLIENT_TIMEOUT_S = 1.0
# Far above the client timeout, far below Twisted's own idle timeout of 60 s.
CLOSED_WITHIN_S = 15.0
TOKENS, TPS = 3, 1.0  # a stream of about 3 s: three client timeouts long


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slow-clients")
    text = f"""
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", str(TPS), "--tokens", str(TOKENS))}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """
    with Served(tmp, text, extra_args=("--client-timeout", str(CLIENT_TIMEOUT_S))) as s:
        yield s


def closed_by_server(sock: socket.socket, trickle: bytes) -> bool:
    """Send `trickle` one byte every 0.3 s (never a complete request); whether the server hangs up in time."""
    sock.settimeout(0.3)
    deadline = time.monotonic() + CLOSED_WITHIN_S
    sent = 0
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            pass
        except ConnectionError:
            return True
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent:sent + 1])
            except ConnectionError:
                return True
            sent += 1
    return False


def test_a_client_sending_its_headers_a_byte_at_a_time_is_disconnected(served):
    head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        assert closed_by_server(sock, head)
    assert httpx.get(served.base + "/health", timeout=10).status_code == 200


def test_a_client_that_connects_and_sends_nothing_is_disconnected(served):
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        assert closed_by_server(sock, b"")


def test_a_client_that_stops_sending_its_body_is_disconnected(served):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"model\": ")
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(head)
        assert closed_by_server(sock, b"")


def test_streams_and_queue_waits_longer_than_the_client_timeout_are_not_cut(served):
    """The second request waits about 3 s for the GPU, and each stream lasts about 3 s."""
    results: list[tuple[int, str]] = []

    def stream():
        text = ""
        with httpx.stream("POST", served.base + "/v1/chat/completions", timeout=60,
                          json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            for line in r.iter_lines():
                text += line + "\n"
            results.append((r.status_code, text))

    clients = [threading.Thread(target=stream) for _ in range(2)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)
    assert [status for status, _ in results] == [200, 200]
    for _, text in results:
        assert text.count('"content"') >= TOKENS and "data: [DONE]" in text, text
