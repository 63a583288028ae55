"""Every answer to a request that had a row names that row: refusals and cuts carry
X-LlamaSwap-Request-Id and X-LlamaSwap-Queue-Wait-Ms, so the client can look up why in /api/queue/<id>."""

from __future__ import annotations

import textwrap

import httpx
import pytest

from tests.e2e.test_api_queue import AUTH, KEY, LONG, Pending, chat, entries_in, running_one
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.e2e.test_distributed_logs import front_end
from tests.e2e.held import sighup_reload
from tests.served import Served, Worker, fake_cmd, model_ports

pytestmark = pytest.mark.e2e


def config(events) -> str:
    return f"""
        apiKeys: ["{KEY}"]
        healthCheckTimeout: 20
        models:
          m:
            cmd: {fake_cmd("m", events)}
          broken:
            cmd: {fake_cmd("broken", None, "--exit-at-start", "3")}
        routing:
          scheduler:
            use: serial
    """


def looked_up(served, response: httpx.Response, code: str) -> dict:
    """The refusal names its row, and the row says the same."""
    assert response.json()["error"]["code"] == code, response.text
    assert int(response.headers["X-LlamaSwap-Queue-Wait-Ms"]) >= 0
    ticket_id = int(response.headers["X-LlamaSwap-Request-Id"])
    entry = httpx.get(served.base + f"/api/queue/{ticket_id}", headers=AUTH, timeout=10).json()
    assert entry["id"] == ticket_id and entry["status_code"] == response.status_code, entry
    return entry


def test_refusals_and_cuts_name_the_request_row(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        failed = httpx.post(served.base + "/v1/chat/completions", headers=AUTH, timeout=60,
                            json={"model": "broken", "messages": []})
        assert failed.status_code == 503
        assert looked_up(served, failed, "model_start_failed")["model"] == "broken"

        held, running_id = running_one(served)
        too_long = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "0.2"})
        assert too_long.status_code == 503 and "Retry-After" in too_long.headers
        assert looked_up(served, too_long, "max_wait_exceeded")["state"] == "rejected"

        pending = Pending(served, {"tokens": 3})
        (waiting,) = entries_in(served, "waiting", 1)
        assert httpx.delete(served.base + f"/api/queue/{waiting['id']}", headers=AUTH).status_code == 200
        cancelled = pending.result()
        assert cancelled.status_code == 503
        assert looked_up(served, cancelled, "cancelled_by_operator")["id"] == waiting["id"]
        held.close()

        pending = Pending(served, LONG)
        (running,) = entries_in(served, "running", 1)
        assert httpx.delete(served.base + f"/api/queue/{running['id']}", headers=AUTH).status_code == 200
        cut = pending.result()
        assert cut.status_code == 503
        assert looked_up(served, cut, "cancelled_by_operator")["id"] == running["id"]

        unknown = httpx.post(served.base + "/v1/chat/completions", headers=AUTH, timeout=10,
                             json={"model": "nobody", "messages": []})
        assert unknown.status_code == 404 and "X-LlamaSwap-Request-Id" not in unknown.headers, "it had no row"


def test_a_request_queued_for_a_model_a_reload_removes_names_its_row(tmp_path):
    text = config(tmp_path / "events.jsonl")
    with Served(tmp_path, text) as served:
        held, _ = running_one(served)
        queued = Pending(served, {"tokens": 3}, model="broken")
        entries_in(served, "waiting", 1)
        sighup_reload(served, textwrap.dedent(text).replace("broken", "kept"))
        removed = queued.result()
        assert removed.status_code == 404
        assert looked_up(served, removed, "model_removed")["model"] == "broken"
        held.close()


def test_a_refusal_through_a_front_end_names_the_workers_row(tmp_path, distributed):
    env, _ = distributed
    text = f"startPort: {model_ports(2)}\n" + textwrap.dedent(config(tmp_path / "events.jsonl"))
    with Worker(tmp_path / "worker", text, env), front_end(tmp_path, text, env) as served:
        held, _ = running_one(served)
        too_long = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "0.2"})
        assert too_long.status_code == 503
        assert looked_up(served, too_long, "max_wait_exceeded")["state"] == "rejected"
        pending = Pending(served, LONG)
        (waiting,) = entries_in(served, "waiting", 1)
        held.close()
        (running,) = entries_in(served, "running", 1)
        assert running["id"] == waiting["id"]
        assert httpx.post(served.base + f"/api/inflight/{running['id']}/cancel", headers=AUTH).status_code == 200
        assert looked_up(served, pending.result(), "cancelled_by_operator")["id"] == running["id"]
