"""Unloading a model is immediate, as in llama-swap: the request it serves is cut, and its client is
told an operator unloaded the model (never a bare "stopped answering")."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.admin.session import AdminSession, create_superuser
from tests.e2e.held import HeldRequest, HeldStream, wait_for_model_to_start
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

MODELS = "/admin/scheduling/configuredmodel/"


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          m:
            cmd: {fake_cmd("m", events)}
          other:
            cmd: {fake_cmd("other", events)}
        routing:
          scheduler:
            use: serial
    """


@pytest.fixture
def served(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as s:
        s.events = events
        yield s


def unload_row(served, rows) -> dict:
    (row,) = wait_until(lambda: [r for r in rows(served.data_dir) if r["state"] not in ("queued", "dispatched")],
                        what="the cut request's row")
    return row


def assert_cut_row(row) -> None:
    assert (row["state"], row["status_code"]) == ("cancelled", 503)
    assert row["error"] == "model 'm' was unloaded by an operator while this request was running"


@pytest.mark.parametrize("route", ["POST /api/models/unload/m", "POST /api/models/unload", "GET /unload"])
def test_unloading_cuts_a_running_stream_with_an_error_event_saying_so(served, rows, route):
    held = HeldStream(served, "m", tokens=10_000, tps=20, request_id="held")
    method, path = route.split()
    assert httpx.request(method, served.base + path, timeout=60).status_code == 200
    # The unload returns once the process is gone: nothing is running and the model saw the hang-up.
    assert httpx.get(served.base + "/running").json() == {"running": []}
    payloads = held.read_to_end()
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert (error["code"], error["type"]) == ("model_unloaded", "server_error")
    assert error["message"] == "model 'm' was unloaded by an operator while this request was running"
    assert "stopped answering" not in " ".join(payloads)
    assert_cut_row(unload_row(served, rows))
    served.check_settled("m")


def test_unloading_answers_a_running_non_streaming_request_with_a_503(served, rows):
    held = HeldRequest(served, "m", tokens=10_000, tps=20, request_id="held")
    wait_for_model_to_start(served.events, "held")
    assert httpx.post(served.base + "/api/models/unload/m", timeout=60).text == "OK"
    response = held.result()
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_unloaded"
    assert "unloaded by an operator" in response.json()["error"]["message"]
    assert_cut_row(unload_row(served, rows))
    served.check_settled("m")


def test_the_admin_says_running_requests_are_cut_and_cuts_them(served, rows):
    create_superuser(served, "alice", "correct-horse-battery")
    admin = AdminSession(served, "alice", "correct-horse-battery")
    try:
        assert "running requests on it are cut" in admin.get(MODELS)
        held = HeldStream(served, "m", tokens=10_000, tps=20, request_id="held")
        response = admin.post(MODELS, {"model": "m"})
        assert response.status_code == 302
        assert "Unloading m now; running requests on it are cut" in admin.get(MODELS)
        payloads = held.read_to_end()
        assert json.loads(payloads[-2])["error"]["code"] == "model_unloaded" and payloads[-1] == "[DONE]"
        assert_cut_row(unload_row(served, rows))
    finally:
        admin.close()
    served.check_settled("m")
