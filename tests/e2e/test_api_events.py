"""`GET /api/events`: llama-swap's Server-Sent Events, read from a real service as a dashboard would."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-events-1"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("events")
    text = f"""
        apiKeys: ["{KEY}"]
        models:
          alpha:
            cmd: {fake_cmd("alpha", None, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
            aliases: [a]
          beta:
            cmd: {fake_cmd("beta", None, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
            unlisted: true
        routing:
          scheduler:
            use: serial
    """
    with Served(tmp, text) as s:
        yield s


class EventReader:
    """Reads `/api/events` on a thread, keeping every event; `wait_for` finds one that matches."""

    def __init__(self, served) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(5, read=None))
        self._stream = self._client.stream("GET", served.base + "/api/events", headers=AUTH)
        self.response = self._stream.__enter__()
        self.events: list[dict] = []
        self._arrived = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        event = None
        try:
            for line in self.response.iter_lines():
                if line.startswith("event: "):
                    event = line[len("event: "):]
                elif line.startswith("data: "):
                    message = json.loads(line[len("data: "):])
                    with self._arrived:
                        self.events.append({"event": event, "type": message["type"], "data": json.loads(message["data"])})
                        self._arrived.notify_all()
        except httpx.HTTPError:
            pass  # closed by the test

    def wait_for(self, predicate, *, after: int = 0, timeout: float = 20.0, what: str = "an event") -> tuple[int, dict]:
        """The first event from index `after` on that matches, and its index."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for index in range(after, len(self.events)):
                    if predicate(self.events[index]):
                        return index, self.events[index]
                after = len(self.events)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self._arrived.wait(left)

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


@pytest.fixture
def reader(served):
    r = EventReader(served)
    yield r
    r.close()


def states(event) -> dict[str, str]:
    return {model["id"]: model["state"] for model in event["data"]}


def test_headers_and_first_payload_list_every_model(reader):
    assert reader.response.status_code == 200
    assert reader.response.headers["content-type"].startswith("text/event-stream")
    assert reader.response.headers["x-accel-buffering"] == "no"
    _, status = reader.wait_for(lambda e: e["type"] == "modelStatus", what="modelStatus")
    assert status["event"] == "message"
    models = {model["id"]: model for model in status["data"]}
    assert list(models) == ["alpha", "beta"]  # unlisted models too, as llama-swap sends them
    assert models["alpha"]["aliases"] == ["a"] and models["beta"]["unlisted"] is True
    assert set(models["alpha"]) == {"id", "name", "description", "state", "unlisted", "peerID", "aliases"}


def test_a_request_brings_model_status_changes_activity_and_its_log(served, reader):
    at, first = reader.wait_for(lambda e: e["type"] == "modelStatus", what="the first modelStatus")
    httpx.post(served.base + "/api/models/unload", headers=AUTH).raise_for_status()
    if states(first)["alpha"] != "stopped":  # an earlier test left it loaded
        at, _ = reader.wait_for(lambda e: e["type"] == "modelStatus" and states(e)["alpha"] == "stopped",
                                after=at + 1, what="alpha stopped")

    r = httpx.post(served.base + "/v1/chat/completions", headers=AUTH, json={"model": "a", "messages": []})
    assert r.status_code == 200
    ready_at, _ = reader.wait_for(lambda e: e["type"] == "modelStatus" and states(e)["alpha"] == "ready",
                                  after=at + 1, what="alpha ready")
    _, change = reader.wait_for(lambda e: e["type"] == "modelStatus", after=at + 1, what="alpha's first change")
    assert states(change)["alpha"] in ("starting", "ready")
    _, done = reader.wait_for(
        lambda e: e["type"] == "activity" and e["data"]["model"] == "alpha" and e["data"]["state"] == "completed",
        after=at + 1, what="the request's row completed",
    )
    assert isinstance(done["data"]["id"], int) and done["data"]["status_code"] == 200
    _, log = reader.wait_for(lambda e: e["type"] == "logData" and e["data"]["source"] == "alpha",
                             after=at + 1, what="alpha's log")
    assert log["data"]["data"]


def test_unauthorised_without_the_key(served):
    r = httpx.get(served.base + "/api/events")
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"


def test_a_client_leaving_ends_its_stream_and_the_service_keeps_serving(served):
    readers = [EventReader(served) for _ in range(3)]
    for r in readers:
        r.wait_for(lambda e: e["type"] == "modelStatus", what="modelStatus")
        r.close()
    r = httpx.post(served.base + "/v1/chat/completions", headers=AUTH, json={"model": "alpha", "messages": []})
    assert r.status_code == 200
    after = EventReader(served)
    try:
        after.wait_for(lambda e: e["type"] == "modelStatus", what="modelStatus on a new connection")
    finally:
        after.close()
