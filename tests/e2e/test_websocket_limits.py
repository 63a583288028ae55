"""WebSockets at the edges: a long wait for the model, big messages, a model that dies under an open
socket, and a shutdown with a socket still open."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import socket
import struct
import threading
import time

import httpx
import pytest
import websocket  # websocket-client: a client that shares no code with the passthrough

from tests.e2e.conftest import close_frame, db_rows
from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


def ws_url(served, path: str) -> str:
    return served.base.replace("http://", "ws://") + path


def test_a_close_frame_is_read_from_a_server_that_reset_the_connection_after_sending_it():
    """A bare server that completes the handshake, sends close 4503 and resets the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    reset = threading.Event()

    def serve():
        with listener, listener.accept()[0] as conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            key = re.search(rb"(?im)^sec-websocket-key:\s*(\S+)", request).group(1)
            accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            payload = struct.pack("!H", 4503) + b"gone"
            conn.sendall(bytes([0x80 | websocket.ABNF.OPCODE_CLOSE, len(payload)]) + payload)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        reset.set()

    threading.Thread(target=serve, daemon=True).start()
    ws = websocket.create_connection(f"ws://127.0.0.1:{listener.getsockname()[1]}/", timeout=10)
    try:
        assert reset.wait(10)
        assert close_frame(ws) == (4503, "gone")
    finally:
        ws.close()


def socket_rows(served) -> list[dict]:
    return db_rows(served.data_dir, "path LIKE ?", ("/upstream/%",))


def finished_row(served) -> dict:
    return wait_until(lambda: [r for r in socket_rows(served) if r["state"] not in ("queued", "dispatched")],
                      15, what="the socket's row to finish")[-1]


def test_a_socket_waits_out_a_load_longer_than_the_handshake_timeout(tmp_path):
    """A 7 s load: the handshake waits for it (daphne's own limit is 5 s) and the socket then works."""
    text = f"models:\n  slow:\n    cmd: {fake_cmd('slow', None, '--load-delay', '7')}\n    healthCheckTimeout: 30\n"
    with Served(tmp_path, text) as served:
        started = time.monotonic()
        ws = websocket.create_connection(ws_url(served, "/upstream/slow/ws"), timeout=30)
        try:
            assert time.monotonic() - started > 6
            ws.send("after the load")
            assert ws.recv() == "after the load"
        finally:
            ws.close()
        row = finished_row(served)
        assert (row["state"], row["status_code"]) == ("completed", 101), row


def test_a_socket_waits_its_queue_turn_past_the_handshake_timeout_unless_its_max_wait_runs_out(tmp_path):
    """One slot held by an open socket for 7 s: a second socket queues behind it and is then served; a third
    that allows only 1 s of waiting (X-LlamaSwap-Max-Wait) is closed with 4503 when that runs out."""
    text = """
        models:
          m: {cmd: "%s"}
        routing:
          scheduler:
            use: serial
            settings:
              serial:
                slots: {m: 1}
    """ % fake_cmd("m", None, "--tps", "0")
    with Served(tmp_path, text) as served:
        first = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30)
        try:
            first.send("x")
            assert first.recv() == "x"
            impatient = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30,
                                                    header=["X-LlamaSwap-Max-Wait: 1"])
            try:
                assert close_frame(impatient)[0] == 4503
            finally:
                impatient.close()
            opened = []

            def open_second():
                opened.append(websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30))

            waiter = threading.Thread(target=open_second)
            waiter.start()
            time.sleep(7)
            assert not opened, "the second socket was let in while the slot was held"
        finally:
            first.close()
        waiter.join(30)
        second = opened[0]
        try:
            second.send("my turn")
            assert second.recv() == "my turn"
        finally:
            second.close()


def test_messages_up_to_max_request_body_bytes_pass_and_a_larger_one_is_closed_with_1009(tmp_path):
    models = f"models:\n  m:\n    cmd: {fake_cmd('m', None, '--tps', '0')}\n"
    with Served(tmp_path, f"maxRequestBodyBytes: {3 * MIB}\n" + models) as served:
        ws = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30)
        try:
            big = os.urandom(2 * MIB)
            ws.send_binary(big)
            assert ws.recv() == big
            ws.send_binary(os.urandom(4 * MIB))
            assert close_frame(ws)[0] == 1009
        finally:
            ws.close()
        row = finished_row(served)
        assert (row["state"], row["status_code"]) == ("failed", 413), row
        assert "maxRequestBodyBytes" in row["error"], row["error"]

        # A reload that lowers the limit applies to the sockets opened after it; an open one keeps its own.
        kept = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30)
        try:
            start_port = served.config_path.read_text().split("\n", 1)[0]
            served.config_path.write_text(f"{start_port}\nmaxRequestBodyBytes: {MIB}\n{models}")
            served.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: "config reloaded" in served.log(), 15, what="the reload to be applied")
            ws = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30)
            try:
                ws.send_binary(big)
                assert close_frame(ws)[0] == 1009
            finally:
                ws.close()
            kept.send_binary(big)
            assert kept.recv() == big
        finally:
            kept.close()


@pytest.fixture
def events_served(tmp_path):
    events = tmp_path / "events.jsonl"
    text = f"models:\n  m:\n    cmd: {fake_cmd('m', events, '--tps', '0')}\n"
    with Served(tmp_path, text, extra_args=("--drain-seconds", "2")) as served:
        served.events = events
        yield served


def _model_pid(events) -> int:
    def is_model(pid: str) -> bool:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            return False
        return b"fakemodel" in cmd and str(events).encode() in cmd

    return int(next(p for p in os.listdir("/proc") if p.isdigit() and is_model(p)))


def _open_echoing(served) -> websocket.WebSocket:
    ws = websocket.create_connection(ws_url(served, "/upstream/m/ws"), timeout=30)
    ws.send("x")
    assert ws.recv() == "x"
    return ws


def test_a_socket_whose_model_is_killed_is_recorded_as_failed(events_served):
    ws = _open_echoing(events_served)
    try:
        os.kill(_model_pid(events_served.events), signal.SIGKILL)
        assert close_frame(ws)[0] == 4502
    finally:
        ws.close()
    row = finished_row(events_served)
    assert (row["state"], row["status_code"]) == ("failed", 502), row
    assert "'m'" in row["error"] and "WebSocket" in row["error"], row["error"]


def test_a_socket_cut_by_an_unload_is_recorded_as_cancelled_and_a_normal_close_as_completed(events_served):
    ws = _open_echoing(events_served)
    try:
        assert httpx.post(events_served.base + "/api/models/unload/m", timeout=30).status_code == 200
        assert close_frame(ws)[0] == 4503
    finally:
        ws.close()
    row = finished_row(events_served)
    assert (row["state"], row["status_code"]) == ("cancelled", 503), row
    assert "unloaded" in row["error"], row["error"]

    ws = _open_echoing(events_served)
    ws.close()
    row = wait_until(lambda: [r for r in socket_rows(events_served) if r["state"] == "completed"], 15,
                     what="the closed socket's row")[-1]
    assert (row["status_code"], row["error"]) == (101, None) or (row["status_code"], row["error"]) == (101, ""), row


def test_a_shutdown_closes_an_idle_socket_at_the_drain_deadline_and_exits_promptly(events_served):
    """--drain-seconds 2: the open socket is told 4503 when the drain ends, and the process is gone soon after.
    The model server, slow to answer the close, finishes its side of it before it is stopped."""
    ws = _open_echoing(events_served)
    ws.send("close-slowly")
    assert ws.recv() == "close-slowly"
    try:
        started = time.monotonic()
        events_served.proc.send_signal(signal.SIGTERM)
        code, reason = close_frame(ws)
        closed_after = time.monotonic() - started
        assert code == 4503 and 1.5 < closed_after < 4, (code, reason, closed_after)
        assert events_served.proc.wait(10) == 0
        assert time.monotonic() - started < 6, time.monotonic() - started
    finally:
        ws.close()
    assert [e for e in read_events(events_served.events) if e["event"] == "websocket" and e["state"] == "closed"], events_served.log()[-3000:]
