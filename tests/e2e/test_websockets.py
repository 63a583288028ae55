"""WebSockets through `llamaswap serve`: /upstream/<model>/... and /comfyui/..., with and without
compat.ignoreWebsockets, against the fake model's echo socket."""

from __future__ import annotations

import json
import os
import textwrap
import time

import httpx
import pytest
import websocket  # websocket-client: a client that shares no code with the passthrough

from tests.conftest import REDIS_URL, fresh_redis_db
from tests.e2e.conftest import close_frame, db_rows
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-ws-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("websockets")
    events = tmp / "events.jsonl"
    text = f"""
        apiKeys: ["{KEY}"]
        models:
          counted:
            cmd: {fake_cmd("counted", events, "--tps", "0")}
            concurrencyLimit: 1
          ignoring:
            cmd: {fake_cmd("ignoring", events, "--tps", "0")}
            ttl: 1
            concurrencyLimit: 1
            compat:
              ignoreWebsockets: true
          comfyui_auto:
            cmd: {fake_cmd("comfy", events, "--tps", "0")}
            checkEndpoint: /health
    """
    with Served(tmp, text) as s:
        s.events = events
        yield s


def ws_url(served, path: str) -> str:
    return served.base.replace("http://", "ws://") + path


def open_socket(served, path: str, headers=AUTH, **kwargs) -> websocket.WebSocket:
    return websocket.create_connection(
        ws_url(served, path), header=[f"{k}: {v}" for k, v in headers.items()], timeout=15, **kwargs
    )


def state(served, model: str) -> str:
    running = httpx.get(served.base + "/running", headers=AUTH).json()["running"]
    return next((m["state"] for m in running if m["model"] == model), "stopped")


def unload(served, model: str) -> None:
    assert httpx.post(f"{served.base}/api/models/unload/{model}", headers=AUTH, timeout=30).status_code == 200
    wait_until(lambda: state(served, model) == "stopped", 30, what=f"{model} to stop")


def ws_events(served, **match) -> list[dict]:
    return [e for e in read_events(served.events) if e["event"] == "websocket" and match.items() <= e.items()]


def test_a_counted_websocket_starts_its_model_and_echoes_text_and_binary(served):
    unload(served, "counted")
    ws = open_socket(served, "/upstream/counted/ws?client=1")
    try:
        assert state(served, "counted") == "ready"
        ws.send("hello")
        assert ws.recv() == "hello"
        ws.send_binary(b"\x00\x01\xff")
        assert ws.recv() == b"\x00\x01\xff"
        ws.send("whoami")
        assert json.loads(ws.recv()) == {"path": "/ws?client=1", "served_by": "counted"}
    finally:
        ws.close()
    wait_until(lambda: ws_events(served, state="closed", path="/ws?client=1"), what="the model's side to close")
    assert ws_events(served, state="closed", path="/ws?client=1")[-1]["code"] == 1000
    row = wait_until(lambda: [r for r in db_rows(served.data_dir, "path = ?", ("/upstream/counted/ws",))
                              if r["state"] == "completed"], what="the socket's row")[-1]
    assert (row["model"], row["method"], row["status_code"]) == ("counted", "GET", 101)


def test_a_counted_websocket_holds_its_place_while_open(served):
    """concurrencyLimit 1: while the socket is open a request is refused; once it closes, served."""
    ws = open_socket(served, "/upstream/counted/ws")
    try:
        ws.send("ping?")
        assert ws.recv() == "ping?"
        busy = httpx.post(served.base + "/v1/chat/completions", json={"model": "counted", "messages": []}, headers=AUTH)
        assert busy.status_code == 429
        second = open_socket(served, "/upstream/counted/ws")
        try:
            assert close_frame(second)[0] == 4429
        finally:
            second.close()
    finally:
        ws.close()

    def served_again():
        r = httpx.post(served.base + "/v1/chat/completions", json={"model": "counted", "messages": []}, headers=AUTH)
        return r.status_code == 200

    wait_until(served_again, 10, what="the socket's place to be given back")


def test_the_model_servers_close_reaches_the_client(served):
    ws = open_socket(served, "/upstream/counted/ws")
    try:
        ws.send("close-me")
        assert close_frame(ws)[0] == 4321
    finally:
        ws.close()


def test_an_ignored_websocket_never_starts_its_model(served):
    unload(served, "ignoring")
    ws = open_socket(served, "/upstream/ignoring/ws")
    try:
        assert close_frame(ws)[0] == 4409
    finally:
        ws.close()
    assert state(served, "ignoring") == "stopped"


def test_an_ignored_websocket_passes_when_ready_and_does_not_keep_the_model_loaded(served):
    """ttl 1, concurrencyLimit 1: a request loads the model; an open ignored socket takes no place from the
    next request and does not hold off the idle unload."""
    r = httpx.post(served.base + "/v1/chat/completions", json={"model": "ignoring", "messages": []}, headers=AUTH)
    assert r.status_code == 200
    ws = open_socket(served, "/upstream/ignoring/live")
    try:
        ws.send("still here")
        assert ws.recv() == "still here"
        r = httpx.post(served.base + "/v1/chat/completions", json={"model": "ignoring", "messages": []}, headers=AUTH)
        assert r.status_code == 200
        wait_until(lambda: state(served, "ignoring") == "stopped", 15, what="the TTL to unload the model under the socket")
    finally:
        ws.close()


def test_the_api_key_is_checked_on_the_handshake(served):
    ws = open_socket(served, "/upstream/counted/ws", headers={"Authorization": "Bearer wrong"})
    try:
        assert close_frame(ws)[0] == 4401
    finally:
        ws.close()


@pytest.mark.parametrize("path", ["/upstream/nope/ws", "/v1/realtime"])
def test_an_unknown_model_or_path_is_refused(served, path):
    ws = open_socket(served, path)
    try:
        assert close_frame(ws)[0] == 4404
    finally:
        ws.close()


def test_comfyui_websocket_needs_the_model_ready_and_drops_the_prefix(served):
    unload(served, "comfyui_auto")
    ws = open_socket(served, "/comfyui/ws?clientId=7")
    try:
        assert close_frame(ws)[0] == 4409
    finally:
        ws.close()
    assert state(served, "comfyui_auto") == "stopped"
    assert httpx.get(served.base + "/comfyui/", headers=AUTH, timeout=30).status_code == 200
    ws = open_socket(served, "/comfyui/ws?clientId=7")
    try:
        ws.send("whoami")
        assert json.loads(ws.recv()) == {"path": "/ws?clientId=7", "served_by": "comfy"}
    finally:
        ws.close()


def test_an_unload_cuts_a_counted_websocket_with_the_reason(served):
    ws = open_socket(served, "/upstream/counted/ws")
    try:
        ws.send("x")
        assert ws.recv() == "x"
        assert httpx.post(served.base + "/api/models/unload/counted", headers=AUTH, timeout=30).status_code == 200
        assert close_frame(ws)[0] == 4503
    finally:
        ws.close()


def test_the_subprotocol_the_model_server_picks_reaches_the_client(served):
    ws = open_socket(served, "/upstream/counted/ws", subprotocols=["v2.chat", "v1.chat"])
    try:
        assert ws.getsubprotocol() == "v2.chat"
    finally:
        ws.close()


def test_a_socket_outlives_the_client_timeout_while_its_model_loads_and_while_idle(tmp_path):
    """--client-timeout bounds a request's head, not a socket: the handshake waits out a 3 s load and the
    open socket stays up through 3 s of silence, with a 1 s client timeout."""
    text = f"models:\n  slow:\n    cmd: {fake_cmd('slow', None, '--load-delay', '3')}\n"
    with Served(tmp_path, text, extra_args=("--client-timeout", "1")) as slow:
        ws = websocket.create_connection(ws_url(slow, "/upstream/slow/ws"), timeout=30)
        try:
            time.sleep(3)
            ws.send("still open")
            assert ws.recv() == "still open"
        finally:
            ws.close()


def test_the_fake_models_echo_socket_speaks_plain_rfc6455(served):
    """The passthrough's tests lean on the fake model's socket: a standard client accepts it directly."""
    httpx.post(served.base + "/v1/chat/completions", json={"model": "counted", "messages": []}, headers=AUTH, timeout=30)
    proxy = next(m["proxy"] for m in httpx.get(served.base + "/running", headers=AUTH).json()["running"] if m["model"] == "counted")
    ws = websocket.create_connection(proxy.replace("http://", "ws://") + "/direct", timeout=15)
    try:
        ws.send("hi")
        assert ws.recv() == "hi"
    finally:
        ws.close()


def test_websockets_through_a_front_end_in_distributed_mode(tmp_path, postgres):
    """A counted socket on a front end starts its model at the worker; an ignored one passes once it is ready."""
    redis = pytest.importorskip("redis")
    try:
        redis_url = fresh_redis_db(REDIS_URL)
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    env = {**os.environ, "DATABASE_URL": postgres[0], "REDIS_URL": redis_url, "PYTHONPATH": str(REPO),
           "LLAMASWAP_DATA_DIR": str(tmp_path / "worker-data")}
    text = textwrap.dedent(f"""
        startPort: {model_ports(2)}
        models:
          counted: {{cmd: "{fake_cmd('counted')}"}}
          ignoring: {{cmd: "{fake_cmd('ignoring')}", compat: {{ignoreWebsockets: true}}}}
    """)
    try:
        with Worker(tmp_path / "worker", text, env), Served(tmp_path, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe")}) as front:
            ws = websocket.create_connection(ws_url(front, "/upstream/counted/ws"), timeout=30)
            try:
                ws.send("whoami")
                assert json.loads(ws.recv()) == {"path": "/ws", "served_by": "counted"}
            finally:
                ws.close()
            ws = websocket.create_connection(ws_url(front, "/upstream/ignoring/ws"), timeout=30)
            try:
                assert close_frame(ws)[0] == 4409
            finally:
                ws.close()
            httpx.post(front.base + "/v1/chat/completions", json={"model": "ignoring", "messages": []}, timeout=30)
            ws = websocket.create_connection(ws_url(front, "/upstream/ignoring/ws"), timeout=30)
            try:
                ws.send("hi")
                assert ws.recv() == "hi"
            finally:
                ws.close()
    finally:
        redis.Redis.from_url(redis_url).flushdb()
