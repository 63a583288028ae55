"""The relay the fault tier puts between each process and PostgreSQL or Redis does what each fault
promises, checked against a real echo server and against the real PostgreSQL."""

from __future__ import annotations

import gc
import logging
import socket
import socketserver
import threading
import time

import pytest

from tests.conftest import POSTGRES_ADMIN_URL
from tests.faults.relay import Relay
from tests.served import wait_until


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def connect(relay: Relay) -> socket.socket:
    return socket.create_connection(("127.0.0.1", relay.port), timeout=5)


def test_bytes_pass_both_ways(echo):
    with Relay("127.0.0.1", echo) as relay, connect(relay) as client:
        client.sendall(b"hello")
        assert client.recv(100) == b"hello"


def test_a_cut_resets_open_connections_refuses_new_ones_and_restore_listens_on_the_same_port(echo):
    with Relay("127.0.0.1", echo) as relay:
        port = relay.port
        client = connect(relay)
        client.sendall(b"x")
        assert client.recv(10) == b"x"
        relay.cut()
        with pytest.raises(OSError):  # reset (or, at worst, the end of the stream then a reset)
            client.sendall(b"y")
            if client.recv(10) == b"":
                raise ConnectionResetError
        client.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        relay.restore()
        assert relay.port == port
        with connect(relay) as again:
            again.sendall(b"z")
            assert again.recv(10) == b"z"


def test_a_stall_holds_bytes_until_restore_then_delivers_them(echo):
    with Relay("127.0.0.1", echo) as relay, connect(relay) as client:
        relay.stall()
        client.sendall(b"held")
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):
            client.recv(10)
        relay.restore()
        client.settimeout(5)
        assert client.recv(10) == b"held"


def test_a_delay_slows_each_chunk_and_restore_ends_it(echo):
    with Relay("127.0.0.1", echo) as relay, connect(relay) as client:
        relay.delay(0.3)
        began = time.monotonic()
        client.sendall(b"slow")
        assert client.recv(10) == b"slow"
        assert time.monotonic() - began >= 0.6  # held once each way
        relay.restore()
        began = time.monotonic()
        client.sendall(b"fast")
        assert client.recv(10) == b"fast"
        assert time.monotonic() - began < 0.3


def test_close_leaves_no_task_for_the_garbage_collector(echo, caplog):
    """A relay's tasks end before `close()` returns: its pumps, and a connection still being accepted when it closes
    (which would start pumps after the cut). One left pending is destroyed wherever the garbage collector runs next;
    in pytest's assertion rewriter that crashed CPython 3.11 and failed a run whose every test passed."""
    relay = Relay("127.0.0.1", echo).start()
    with connect(relay) as relayed:
        relayed.sendall(b"x")
        assert relayed.recv(10) == b"x"  # two pumps running
        relay.stall()
        with connect(relay) as accepted:  # its handshake with the echo server waits for the network
            wait_until(lambda: relay.connections == 2, 5, 0.01, "the second connection to be accepted")
            relay.close()
    del relayed, accepted, relay
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
    assert not [record.getMessage() for record in caplog.records], caplog.text


def test_postgresql_through_a_cut_relay_fails_and_answers_again_after_restore():
    psycopg = pytest.importorskip("psycopg")
    host, port = POSTGRES_ADMIN_URL.split("@", 1)[1].split("/", 1)[0].split(":")
    with Relay(host, int(port)) as relay:
        url = POSTGRES_ADMIN_URL.replace(f"{host}:{port}", relay.url_host)
        try:
            connection = psycopg.connect(url, connect_timeout=5)
        except psycopg.OperationalError as exc:
            pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}")
        assert connection.execute("SELECT 1").fetchone() == (1,)
        relay.cut()
        with pytest.raises(psycopg.OperationalError):
            connection.execute("SELECT 1")
        relay.restore()
        with psycopg.connect(url, connect_timeout=5) as again:
            assert again.execute("SELECT 1").fetchone() == (1,)
