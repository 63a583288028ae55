"""`/api/queue` read and acted on in a real service: positions are the order requests go in, one
request live or from its row, cancels of waiting and running requests, a caller's maximum wait
(`X-LlamaSwap-Max-Wait`), and the Retry-After of a concurrencyLimit 429."""

from __future__ import annotations

import json
import textwrap
import threading

import httpx
import pytest

from tests.admin.session import AdminSession, create_superuser, queue_rows
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.e2e.test_distributed_logs import front_end
from tests.served import Served, Worker, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-queue-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"tokens": 10_000, "tps": 20}  # a job that runs until the test ends it
QUEUE_PAGE = "/admin/scheduling/waitingrequest/"


def config(events, scheduler: str = "serial", extra: str = "") -> str:
    return f"""
        apiKeys: ["{KEY}"]
        healthCheckTimeout: 20
        models:
          m:
            cmd: {fake_cmd("m", events)}
            {extra}
        routing:
          scheduler:
            use: {scheduler}
    """


@pytest.fixture
def served(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as s:
        yield s


@pytest.fixture(scope="module")
def unchanged(tmp_path_factory):
    """One instance for the tests that only read (requests refused for want of the key): nothing they
    do changes what the next one sees."""
    tmp = tmp_path_factory.mktemp("queue-keys")
    with Served(tmp, config(tmp / "events.jsonl")) as s:
        yield s


def chat(served, fake: dict, headers: dict | None = None, stream: bool = False, model: str = "m") -> httpx.Response:
    return httpx.post(
        served.base + "/v1/chat/completions", timeout=60, headers={**AUTH, **(headers or {})},
        json={"model": model, "messages": [], "stream": stream, "fake": fake},
    )


class Pending:
    """A chat request on a thread; `result()` waits for its answer."""

    def __init__(self, served, fake: dict, headers: dict | None = None, model: str = "m"):
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(
            target=lambda: setattr(self, "response", chat(served, fake, headers, model=model)), daemon=True
        )
        self._thread.start()

    def result(self) -> httpx.Response:
        self._thread.join(60)
        assert self.response is not None, "the request never returned"
        return self.response


class Streaming:
    """A streaming chat request the model is busy with; `read_to_end()` returns its `data:` payloads."""

    def __init__(self, served, fake: dict):
        self._client = httpx.Client(timeout=60)
        self._stream = self._client.stream(
            "POST", served.base + "/v1/chat/completions", headers=AUTH,
            json={"model": "m", "messages": [], "stream": True, "fake": fake},
        )
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()

    def read_to_end(self) -> list[str]:
        payloads = [line[len("data: "):] for line in self.response.iter_lines() if line.startswith("data: ")]
        self.close()
        return payloads

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


def queue(served) -> list[dict]:
    response = httpx.get(served.base + "/api/queue", headers=AUTH, timeout=10)
    assert response.status_code == 200
    return response.json()["data"]


def entries_in(served, state: str, count: int) -> list[dict]:
    return wait_until(lambda: (lambda e: e if len(e) == count else None)(
        [entry for entry in queue(served) if entry["state"] == state]), timeout=30, what=f"{count} {state} requests")


def running_one(served, fake: dict = LONG) -> tuple[Streaming, int]:
    held = Streaming(served, fake)
    (entry,) = entries_in(served, "running", 1)
    return held, entry["id"]


def row(served, rows, ticket_id: int, *, ended: bool = True) -> dict:
    def find():
        found = [r for r in rows(served.data_dir) if r["id"] == ticket_id]
        return found if found and (not ended or found[0]["state"] not in ("queued", "dispatched")) else None

    return wait_until(find, timeout=30, what=f"request {ticket_id}'s row")[0]


def test_positions_are_the_order_requests_go_in_and_the_admin_shows_them(served, rows):
    assert chat(served, {"tokens": 3}).status_code == 200  # a job that ends: the forecast has history
    held, _ = running_one(served)
    pending = [Pending(served, {"tokens": 3}, {"X-LlamaSwap-Priority": str(p)}) for p in (-100, 0, 100, 50)]
    waiting = entries_in(served, "waiting", 4)
    assert [e["position"] for e in waiting] == [1, 2, 3, 4]
    assert [e["priority"] for e in waiting] == [100, 50, 0, -100]
    assert all(e["eta_seconds"] is not None for e in waiting), [e["outlook"] for e in waiting]
    assert [e["eta_seconds"] for e in waiting] == sorted(e["eta_seconds"] for e in waiting)
    first = waiting[0]
    assert first["band"] == "interactive" and set(first["terms"]) == {"priority", "affinity", "aging"}
    assert first["outlook"].startswith("next in the queue")
    predicted = [e["id"] for e in waiting]

    create_superuser(served, "alice", "correct-horse-battery")
    admin = AdminSession(served, "alice", "correct-horse-battery")
    try:
        page = queue_rows(admin.get(QUEUE_PAGE))
    finally:
        admin.close()
    assert sorted(page, key=lambda r: int(r["predicted"])) == page  # ranked by score: the same order here
    assert [r["ticket"] for r in page] == predicted

    held.close()  # its client leaves: the queue moves
    assert [p.result().status_code for p in pending] == [200] * 4
    dispatched = sorted((row(served, rows, tid)["dispatched_at"], tid) for tid in predicted)
    assert [tid for _, tid in dispatched] == predicted


@pytest.mark.parametrize("waiting_by, running_by", [("DELETE", "POST"), ("POST", "DELETE")])
def test_an_operator_cancels_a_waiting_and_a_running_request(served, rows, waiting_by, running_by):
    def cancel(method: str, ticket_id: int) -> httpx.Response:
        path = f"/api/queue/{ticket_id}" if method == "DELETE" else f"/api/inflight/{ticket_id}/cancel"
        return httpx.request(method, served.base + path, headers=AUTH, timeout=10)

    held, running_id = running_one(served)
    pending = Pending(served, {"tokens": 3})
    (waiting,) = entries_in(served, "waiting", 1)
    live = httpx.get(served.base + f"/api/queue/{waiting['id']}", headers=AUTH).json()
    assert (live["state"], live["position"], live["model"]) == ("waiting", 1, "m")
    running = httpx.get(served.base + f"/api/queue/{running_id}", headers=AUTH).json()
    assert running["state"] == "running" and running["running_seconds"] >= 0

    assert cancel(waiting_by, waiting["id"]).json() == {"msg": "ok"}
    refused = pending.result()
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "cancelled_by_operator"
    assert (row(served, rows, waiting["id"])["state"], row(served, rows, waiting["id"])["status_code"]) == (
        "cancelled", 503)

    assert cancel(running_by, running_id).json() == {"msg": "ok"}
    payloads = held.read_to_end()
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert (error["code"], error["message"]) == ("cancelled_by_operator", "cancelled by an operator while running")
    assert row(served, rows, running_id)["state"] == "cancelled"

    ended = httpx.get(served.base + f"/api/queue/{running_id}", headers=AUTH).json()
    assert (ended["state"], ended["status_code"], ended["id"]) == ("cancelled", 503, running_id)
    for method in ("DELETE", "POST"):
        gone = cancel(method, running_id)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "request_not_found"
    unknown = httpx.get(served.base + "/api/queue/987654", headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "request_not_found"
    assert chat(served, {"tokens": 3}).status_code == 200


def test_an_operator_raises_a_waiting_requests_priority_and_it_goes_first(served, rows):
    held, running_id = running_one(served)
    first = Pending(served, {"tokens": 1}, {"X-LlamaSwap-Priority": "0"})
    entries_in(served, "waiting", 1)
    second = Pending(served, {"tokens": 1}, {"X-LlamaSwap-Priority": "0"})
    older, newer = (entry["id"] for entry in entries_in(served, "waiting", 2))

    def patch(ticket_id: int, body) -> httpx.Response:
        return httpx.patch(served.base + f"/api/queue/{ticket_id}", headers=AUTH, timeout=10, content=body)

    for bad in (b"", b"[]", b'{"priority": "urgent"}', b'{"priority": 1.5}', b'{"priority": true}',
                b'{"priority": ""}', b'{"priority": 9223372036854775808}', b'{"prio": 5}'):
        refused = patch(newer, bad)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request", bad
    assert "'urgent' is not a priority" in patch(newer, b'{"priority": "urgent"}').json()["error"]["message"]
    assert patch(newer, b'{"priority": "interactive"}').json() == {"id": newer, "priority": 100}
    assert [entry["id"] for entry in queue(served) if entry["state"] == "waiting"] == [newer, older]
    gone = patch(running_id, b'{"priority": 5}')
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "request_not_found"

    assert httpx.delete(served.base + f"/api/queue/{running_id}", headers=AUTH, timeout=10).status_code == 200
    held.read_to_end()
    assert [first.result().status_code, second.result().status_code] == [200, 200]
    assert row(served, rows, newer)["dispatched_at"] < row(served, rows, older)["dispatched_at"]
    assert (row(served, rows, newer)["priority"], row(served, rows, newer)["band"]) == (100, "interactive")


def test_a_running_non_streaming_request_cut_gets_a_503(served, rows):
    pending = Pending(served, LONG)
    (running,) = entries_in(served, "running", 1)
    assert httpx.delete(served.base + f"/api/queue/{running['id']}", headers=AUTH).status_code == 200
    response = pending.result()
    assert response.status_code == 503 and response.json()["error"]["code"] == "cancelled_by_operator"
    assert row(served, rows, running["id"])["state"] == "cancelled"


def test_the_queue_routes_want_the_api_key(unchanged):
    for method, path in [("GET", "/api/queue"), ("GET", "/api/queue/1"), ("DELETE", "/api/queue/1"),
                         ("POST", "/api/inflight/1/cancel")]:
        response = httpx.request(method, unchanged.base + path, timeout=10)
        assert response.status_code == 401, (method, path)
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(unchanged.base + "/api/queue", headers=AUTH).status_code == 405


@pytest.mark.parametrize("path", ["/api/queue", "/api/queue/1", "/api/inflight/1/cancel", "/v1/models", "/models",
                                  "/running", "/unload", "/api/models/unload", "/api/models/unload/m",
                                  "/api/activity", "/api/events", "/logs", "/logs/stream", "/logs/stream/m"])
def test_without_the_key_a_wrong_method_is_a_401_too_not_a_405_that_reveals_the_route(unchanged, path):
    wrong = "PUT"  # no API route takes it
    response = httpx.request(wrong, unchanged.base + path, timeout=10)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key", response.text
    assert httpx.request(wrong, unchanged.base + path, headers=AUTH, timeout=10).status_code == 405


def test_a_request_past_its_maximum_wait_gets_a_503_with_retry_after(served, rows):
    bad = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "soon"})
    assert bad.status_code == 400 and "X-LlamaSwap-Max-Wait" in bad.json()["error"]["message"]
    held, _ = running_one(served)
    refused = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "0.5"})
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "max_wait_exceeded" and "within its maximum wait of 0.5 s" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    (rejected,) = wait_until(lambda: [r for r in rows(served.data_dir) if r["state"] == "rejected"], timeout=30,
                             what="the refused request's row")
    assert (rejected["status_code"], rejected["error"]) == (503, error["message"])
    held.close()
    met = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "60"})
    assert met.status_code == 200, met.text
    assert chat(served, {"tokens": 3}).status_code == 200


def test_a_concurrency_limit_429_says_when_a_place_frees(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl", "fifo", "concurrencyLimit: 1")) as served:
        held, _ = running_one(served)
        first = chat(served, {"tokens": 3})
        assert first.status_code == 429 and first.headers["Retry-After"] == "1", "no history: the constant"
        assert first.extensions["reason_phrase"] == b"Too Many Requests", "the status line names the code"
        held.close()
        wait_until(lambda: not queue(served), timeout=30, what="the held request to end")
        assert chat(served, {"tokens": 60, "tps": 10}).status_code == 200  # a 6 s job: now there is history
        held, _ = running_one(served)
        predicted = chat(served, {"tokens": 3})
        assert predicted.status_code == 429
        assert int(predicted.headers["Retry-After"]) > 1, "the held job's predicted end, not the constant"
        held.close()


def test_a_front_end_reads_and_acts_on_the_workers_queue(tmp_path, distributed):
    env, _ = distributed
    text = f"startPort: {model_ports(2)}\n" + textwrap.dedent(config(tmp_path / "events.jsonl"))
    with Worker(tmp_path / "worker", text, env), front_end(tmp_path, text, env) as served:
        held, running_id = running_one(served)
        pending = Pending(served, {"tokens": 3})
        (waiting,) = entries_in(served, "waiting", 1)
        assert httpx.get(served.base + f"/api/queue/{waiting['id']}", headers=AUTH).json()["position"] == 1
        refused = chat(served, {"tokens": 3}, {"X-LlamaSwap-Max-Wait": "0.5"})  # the limit travels to the worker
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "max_wait_exceeded"
        assert "Retry-After" in refused.headers
        assert httpx.delete(served.base + f"/api/queue/{waiting['id']}", headers=AUTH).status_code == 200
        assert pending.result().json()["error"]["code"] == "cancelled_by_operator"
        assert httpx.post(served.base + f"/api/inflight/{running_id}/cancel", headers=AUTH).status_code == 200
        assert json.loads(held.read_to_end()[-2])["error"]["code"] == "cancelled_by_operator"
        assert httpx.get(served.base + f"/api/queue/{running_id}", headers=AUTH).json()["state"] == "cancelled"
