"""A key that stops counting (revoked, expired, deleted) while something it opened is still held, end to end
against `llamaswap serve`: an open WebSocket is closed with 4401 and its row says why (4403 once the key may no
longer use the socket's model), a request waiting for the
key's concurrency or in the scheduler's queue is refused with 401, and a request already streaming finishes. And `/upstream/<model>/…`
refuses a model outside the key's scope before telling anything of the model's state."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest
import websocket

from tests.e2e.conftest import close_frame
from tests.e2e.test_api_keys import auth, chat, keys, new_key
from tests.e2e.test_key_quotas import WAITS, Held, Later, started
from tests.e2e.test_distributed import config_text as distributed_config
from tests.e2e.test_distributed import distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

# A revoked key is refused within 2 s (docs/operating.md, API keys); what it holds ends within the same bound.
REVOKE_BOUND_S = 2.0


def config_text(models: dict[str, str], top: str = "") -> str:
    """`models` (each a YAML flow mapping's inside) under the serial scheduler, chat with four slots (a key's second
    request waits for its key, not for the GPU); `top`: more top-level settings."""
    lines = [f"startPort: {model_ports(len(models))}", top, "models:"]
    lines += [f"  {name}: {{{entry}}}" for name, entry in models.items()]
    return "\n".join(lines + ["routing: {scheduler: {use: serial, settings: {serial: {slots: {chat: 4}}}}}"])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("key-revocation")
    events = tmp / "events.jsonl"
    text = config_text({"chat": f'cmd: "{fake_cmd("chat", events)}"', "solo": f'cmd: "{fake_cmd("solo", events)}"',
                        "raw": f'cmd: "{fake_cmd("raw", events, "--tps", "0")}", compat: {{ignoreWebsockets: true}}'})
    with Served(tmp, text) as s:
        s.events = events
        yield s


def delete_key(served: Served, name: str) -> None:
    """Delete the key's row, as a database administrator may (the admin and the command only revoke)."""
    with contextlib.closing(sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=10)) as db:
        with db:
            assert db.execute("DELETE FROM scheduling_apikey WHERE name = ?", (name,)).rowcount == 1


def open_socket(served: Served, model: str, secret: str) -> websocket.WebSocket:
    url = served.base.replace("http://", "ws://") + f"/upstream/{model}/ws"
    return websocket.create_connection(url, header=[f"Authorization: Bearer {secret}"], timeout=15)


@pytest.mark.parametrize("model, how", [("chat", "revoked"), ("chat", "expired"), ("raw", "deleted")])
def test_an_open_websocket_is_closed_with_4401_once_its_key_stops_counting(served, model, how):
    name = f"socket-{model}-{how}"
    expires = datetime.now(timezone.utc) + timedelta(seconds=6)
    secret = new_key(served, name, *(("--expires", expires.isoformat()) if how == "expired" else ()))
    wait_until(lambda: chat(served, model, secret).status_code == 200, 5, 0.05, "the key to count, the model loaded")
    ws = open_socket(served, model, secret)
    try:
        ws.send("still here")
        assert ws.recv() == "still here"
        if how == "expired":
            assert datetime.now(timezone.utc) < expires, "the socket opened too late for the test"
            stopped_at = time.monotonic() + (expires - datetime.now(timezone.utc)).total_seconds()
        else:
            if how == "revoked":
                keys(served, "revoke", name)
            else:
                delete_key(served, name)
            stopped_at = time.monotonic()
        code, _ = close_frame(ws)  # daphne drops close reasons: the log and the row have it
        assert code == 4401
        assert time.monotonic() - stopped_at < REVOKE_BOUND_S
    finally:
        ws.close()
    reason = {"revoked": f"the API key '{name}' is revoked", "expired": f"the API key '{name}' expired",
              "deleted": f"the API key '{name}' no longer exists"}[how]
    wait_until(lambda: reason in served.log(), 5, 0.05, "the close's reason in the log")
    if model == "chat":  # a scheduled socket: its lease is released and its row says why it ended
        row = wait_until(lambda: next((r for r in served.rows() if r["api_key"] == name and r["method"] == "GET"
                                       and r["state"] not in ("queued", "dispatched")), None), 5, 0.05, "the row")
        assert (row["state"], row["status_code"]) == ("cancelled", 401) and reason in row["error"]


def edit_key(served: Served, name: str, **columns) -> None:
    """Change the key's row, as the admin's change form does."""
    with contextlib.closing(sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=10)) as db:
        with db:
            assignments = ", ".join(f"{column} = ?" for column in columns)
            assert db.execute(f"UPDATE scheduling_apikey SET {assignments} WHERE name = ?",
                              (*columns.values(), name)).rowcount == 1


@pytest.mark.parametrize("edit, reason", [
    ({"allowed_models": "solo"}, "the API key '{name}' may not use model 'chat'"),
    ({"read_only": 1}, "the API key '{name}' is read-only: it sends no requests to models"),
])
def test_an_open_websocket_is_closed_with_4403_once_its_key_may_no_longer_use_the_model(served, edit, reason):
    name = f"socket-narrowed-{next(iter(edit))}"
    secret = new_key(served, name, "--models", "chat", "--models", "solo")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 5, 0.05, "the key to count, the model loaded")
    ws = open_socket(served, "chat", secret)
    try:
        ws.send("still here")
        assert ws.recv() == "still here"
        edit_key(served, name, **edit)
        edited_at = time.monotonic()
        code, _ = close_frame(ws)
        assert code == 4403
        assert time.monotonic() - edited_at < REVOKE_BOUND_S
    finally:
        ws.close()
    reason = reason.format(name=name)
    row = wait_until(lambda: next((r for r in served.rows() if r["api_key"] == name and r["method"] == "GET"
                                   and r["state"] not in ("queued", "dispatched")), None), 5, 0.05, "the row")
    assert (row["state"], row["status_code"]) == ("cancelled", 403) and reason in row["error"], row
    assert chat(served, "chat", secret).status_code == 403


def test_a_request_waiting_for_its_keys_concurrency_is_refused_401_once_revoked_and_a_running_one_finishes(served):
    secret = new_key(served, "leaked", "--concurrency", "1")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 5, 0.05, "the key to count")
    running = Held(served, secret, "leaked-running", tokens=120, tps=30)  # four seconds of answer
    try:
        waiting = Later(served, secret, "leaked-waiting")
        wait_until(lambda: WAITS.format("leaked") in served.log(), 10, 0.05, "the second request to wait")
        keys(served, "revoke", "leaked")
        revoked_at = time.monotonic()
        wait_until(waiting.done, REVOKE_BOUND_S, 0.02, "the waiting request to be refused")
        answer = waiting.result()
        error = answer.json()["error"]
        assert answer.status_code == 401 and error["code"] == "invalid_api_key", answer.text
        assert "the API key 'leaked' is revoked" in error["message"]
        assert time.monotonic() - revoked_at < REVOKE_BOUND_S
        assert not started(served.events, "leaked-waiting")
        rest = running.rest()  # the request already streaming when its key was revoked finishes
    finally:
        running.close()
    assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
    assert chat(served, "chat", secret).status_code == 401


def test_a_request_queued_at_the_scheduler_is_refused_401_once_its_key_is_revoked(served):
    holder, secret = new_key(served, "holder"), new_key(served, "queued-leak")
    wait_until(lambda: chat(served, "raw", secret).status_code == 200, 5, 0.05, "the key to count")
    running = Held(served, holder, "raw-busy", tokens=400, tps=20, model="raw")  # raw's one slot, 20 s
    try:
        queued = Later(served, secret, "raw-queued", model="raw")
        wait_until(lambda: any(r["api_key"] == "queued-leak" and r["state"] == "queued" for r in served.rows()), 10,
                   0.05, "the request queued behind the other key's")
        keys(served, "revoke", "queued-leak")
        revoked_at = time.monotonic()
        wait_until(queued.done, REVOKE_BOUND_S, 0.02, "the queued request to be refused")
        answer = queued.result()
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.text
        assert "the API key 'queued-leak' is revoked" in answer.json()["error"]["message"]
        assert time.monotonic() - revoked_at < REVOKE_BOUND_S
        row_id = int(answer.headers["x-llamaswap-request-id"])
        row = wait_until(lambda: next((r for r in served.rows() if r["id"] == row_id and r["state"] != "queued"), None),
                         5, 0.05, "the row written")
        assert (row["state"], row["status_code"]) == ("cancelled", 401) and "revoked" in row["error"]
        assert not started(served.events, "raw-queued")
    finally:
        running.close()


def test_a_websocket_queued_for_its_model_is_closed_with_4401_once_its_key_is_revoked(served):
    holder, secret = new_key(served, "solo-holder"), new_key(served, "solo-socket")
    wait_until(lambda: chat(served, "solo", secret).status_code == 200, 5, 0.05, "the key to count")
    running = Held(served, holder, "solo-busy", tokens=400, tps=20, model="solo")  # solo's one slot, 20 s
    opened: dict[str, websocket.WebSocket] = {}
    try:
        waiting = threading.Thread(target=lambda: opened.update(ws=open_socket(served, "solo", secret)), daemon=True)
        waiting.start()  # its handshake waits for the model, as a request would
        wait_until(lambda: any(r["api_key"] == "solo-socket" and r["method"] == "GET" and r["state"] == "queued"
                               for r in served.rows()), 10, 0.05, "the socket queued behind the other key's request")
        keys(served, "revoke", "solo-socket")
        revoked_at = time.monotonic()
        wait_until(lambda: "ws" in opened, REVOKE_BOUND_S, 0.02, "the socket's refusal")
        assert close_frame(opened["ws"])[0] == 4401
        assert time.monotonic() - revoked_at < REVOKE_BOUND_S
        row = wait_until(lambda: next((r for r in served.rows() if r["api_key"] == "solo-socket" and r["method"] == "GET"
                                       and r["state"] != "queued"), None), 5, 0.05, "the row written")
        assert (row["state"], row["status_code"]) == ("cancelled", 401) and "revoked" in row["error"]
    finally:
        running.close()
        if "ws" in opened:
            opened["ws"].close()


def test_upstream_refuses_a_model_outside_the_keys_scope_before_telling_its_state_or_whether_it_exists(served):
    secret = new_key(served, "chat-only", "--models", "chat")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 5, 0.05, "the key to count")
    unloader = auth(new_key(served, "unloader", "--operator"))
    wait_until(lambda: httpx.post(served.base + "/api/models/unload", headers=unloader, timeout=30).status_code == 200,
               5, 0.05, "every model stopped")
    # 409, 308 and a load for a model outside the scope; a name configured nowhere answers the same (not 404)
    for path in ("/upstream/raw/logo.png", "/upstream/raw", "/upstream/raw/v1/models", "/upstream/nowhere/v1/models"):
        refused = httpx.get(served.base + path, headers=auth(secret), follow_redirects=False)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["error"] == {"message": f"the API key 'chat-only' may not use the model at {path}",
                                           "type": "permission_error", "param": None, "code": "model_not_allowed"}
        socket = websocket.create_connection(served.base.replace("http://", "ws://") + path + "/ws",
                                             header=[f"Authorization: Bearer {secret}"], timeout=15)
        try:
            assert close_frame(socket)[0] == 4403, path
        finally:
            socket.close()
    missing = httpx.get(served.base + "/upstream/chat-gone/v1/models", headers=auth(secret))  # not within its globs
    assert missing.status_code == 403
    within = new_key(served, "chat-star", "--models", "chat*")
    wait_until(lambda: chat(served, "chat", within).status_code == 200, 5, 0.05, "the key to count")
    missing = httpx.get(served.base + "/upstream/chat-gone/v1/models", headers=auth(within))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found", missing.text


def test_with_two_front_ends_a_revoked_keys_request_queued_at_the_worker_is_refused_401(tmp_path, distributed):  # noqa: F811
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = distributed_config(events)  # chat has one slot
    with two_front_ends(tmp_path, text, env) as (first, second):
        holder, secret = new_key(first, "fleet-holder"), new_key(first, "fleet-leak")
        for fe in (first, second):
            wait_until(lambda: chat(fe, "chat", secret).status_code == 200, 5, 0.05, f"{fe.base} to take the key")
        running = Held(first, holder, "fleet-busy", tokens=400, tps=20)
        try:
            queued = Later(second, secret, "fleet-queued")
            wait_until(lambda: any(r["api_key"] == "fleet-leak" and r["state"] == "queued" for r in second.rows()),
                       10, 0.05, "the request queued at the worker")
            keys(first, "revoke", "fleet-leak")
            revoked_at = time.monotonic()
            wait_until(queued.done, REVOKE_BOUND_S, 0.02, "the queued request to be refused")
            answer = queued.result()
            assert answer.status_code == 401 and "'fleet-leak' is revoked" in answer.json()["error"]["message"]
            assert time.monotonic() - revoked_at < REVOKE_BOUND_S
            assert not started(events, "fleet-queued")
        finally:
            running.close()
