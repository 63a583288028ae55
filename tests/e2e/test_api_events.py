"""`GET /api/events`: llama-swap's Server-Sent Events, read from a real service as a dashboard would."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.e2e.test_distributed import config_text, distributed  # noqa: F401 - the fixture
from tests.e2e.test_distributed_logs import chat, front_end, wait_for_quiet_asks
from tests.served import Served, Worker, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-events-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
READ_S = 30  # a model start included


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
    """A client of `/api/events` that keeps every event it has read; `wait_for` reads on until one
    matches (each read waits at most READ_S for the next line: the stream is quiet when nothing changes)."""

    def __init__(self, served) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(5, read=READ_S))
        self._stream = self._client.stream("GET", served.base + "/api/events", headers=AUTH)
        self.response = self._stream.__enter__()
        self._lines = self.response.iter_lines()
        self.events: list[dict] = []

    def _read_event(self) -> None:
        event = None
        for line in self._lines:
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                message = json.loads(line[len("data: "):])
                self.events.append({"event": event, "type": message["type"], "data": json.loads(message["data"])})
                return

    def wait_for(self, predicate, *, after: int = 0, timeout: float = READ_S, what: str = "an event") -> tuple[int, dict]:
        """The first event from index `after` on that matches, and its index."""
        deadline = time.monotonic() + timeout
        while True:
            for index in range(after, len(self.events)):
                if predicate(self.events[index]):
                    return index, self.events[index]
            after = max(after, len(self.events))
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            self._read_event()

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


def test_a_waiting_request_is_in_the_inflight_table_and_the_queue_until_done(served, reader):
    at, _ = reader.wait_for(lambda e: e["type"] == "inflight" and e["data"]["op"] == "snapshot", what="the snapshot")
    reader.wait_for(lambda e: e["type"] == "queue", what="the first queue")
    with httpx.Client(timeout=60, headers=AUTH) as client:
        busy = client.stream("POST", served.base + "/v1/chat/completions", json={
            "model": "alpha", "stream": True, "messages": [], "fake": {"tokens": 10_000, "tps": 20}})
        response = busy.__enter__()
        assert response.status_code == 200
        _, running = reader.wait_for(
            lambda e: e["type"] == "inflight" and e["data"]["op"] == "upsert"
            and e["data"]["request"]["model"] == "alpha" and e["data"]["request"]["state"] == "running",
            after=at, what="alpha's request running",
        )
        # beta waits: the one model at a time is busy with alpha's long answer.
        waiting = threading.Thread(target=client.post, args=(served.base + "/v1/chat/completions",),
                                   kwargs={"json": {"model": "beta", "messages": []}}, daemon=True)
        waiting.start()
        _, upsert = reader.wait_for(
            lambda e: e["type"] == "inflight" and e["data"]["op"] == "upsert" and e["data"]["request"]["model"] == "beta",
            after=at, what="beta's request in the inflight table",
        )
        beta = upsert["data"]["request"]
        assert beta["state"] in ("waiting", "starting") and beta["arrived_at"].endswith("Z")
        queued_at, queued = reader.wait_for(
            lambda e: e["type"] == "queue" and any(q["id"] == beta["id"] and q["state"] == "waiting"
                                                   for q in e["data"]),
            after=at, what="beta waiting in the queue",
        )
        entry = next(q for q in queued["data"] if q["id"] == beta["id"])
        assert entry["position"] == 1 and entry["band"] == "normal" and "outlook" in entry
        busy.__exit__(None, None, None)  # alpha's client leaves; beta goes next
        waiting.join(60)

    gone = {running["data"]["request"]["id"], beta["id"]}
    for ticket_id in gone:
        reader.wait_for(lambda e: e["type"] == "inflight" and e["data"] == {"op": "remove", "id": ticket_id},
                        after=at, what=f"request {ticket_id} removed from the inflight table")
    reader.wait_for(lambda e: e["type"] == "queue" and e["data"] == [], after=queued_at, what="the queue empty again")
    reader.wait_for(lambda e: e["type"] == "activity" and e["data"]["id"] == beta["id"]
                    and e["data"]["state"] == "completed", after=at, what="beta's row completed")


def test_a_front_end_streams_the_workers_events_and_stops_asking_when_its_client_leaves(tmp_path, distributed):
    redis = pytest.importorskip("redis")
    env, _ = distributed
    text = config_text(tmp_path / "events.jsonl")
    with Worker(tmp_path / "worker", text, env), front_end(tmp_path, text, env) as served:
        reader = EventReader(served)
        at, first = reader.wait_for(lambda e: e["type"] == "modelStatus", what="modelStatus")
        assert list(states(first)) == ["chat", "coder"]
        chat(served, "chat")
        reader.wait_for(lambda e: e["type"] == "modelStatus" and states(e)["chat"] == "ready", after=at,
                        what="chat ready")
        reader.wait_for(lambda e: e["type"] == "logData" and e["data"]["source"] == "chat"
                        and "listening" in e["data"]["data"], after=at, what="chat's log, named by its model")
        reader.wait_for(lambda e: e["type"] == "activity" and e["data"]["model"] == "chat"
                        and e["data"]["state"] == "completed", after=at, what="the request's row completed")

        connection = redis.Redis.from_url(env["REDIS_URL"])
        db = connection.connection_pool.connection_kwargs["db"]
        with connection.monitor() as monitor:
            wait_until(lambda: (c := monitor.next_command())["db"] == db and "LogsSince" in c["command"],
                       10, 0, "the front end to ask the worker for logs")
            reader.close()
            wait_for_quiet_asks(monitor, db)
        chat(served, "coder")  # the service keeps serving
