"""A Redis blink in distributed mode: one `llamaswap serve` front end and one `llamaswap worker`, real processes, each
reaching Redis through a relay of its own that the test cuts. A route that asks the worker and cannot reach it
answers 503 `scheduler_unreachable` with `Retry-After` and says why, never a 500; a lease asked meanwhile is kept,
its state `unknown` until the worker reads it; a key revoked during the blink has each of its queued requests
refused 401 within the documented 2 s, by request id, and their rows say why."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from scheduling.door.remote import ANSWER_TIMEOUT_S, REDIS_WAIT_S
from scheduling.rows.leases import SYNC_S
from tests.e2e.test_api_keys import auth, new_key
from tests.e2e.test_distributed import distributed  # noqa: F401 (a fixture)
from tests.e2e.test_key_quotas import Held, Later, started
from tests.e2e.test_key_revocation import REVOKE_BOUND_S
from tests.faults.cluster import MODEL
from tests.faults.test_redis_outage import Pair, paired
from tests.served import fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

# How long a Redis blink lasts: shorter than a front end's wait for Redis, longer than the revoke bound.
BLINK_S = 3.0
ROUTES = [("GET", "/v1/models"), ("GET", "/running"), ("GET", "/api/queue"), ("GET", "/api/placement"),
          ("GET", f"/api/placement/can-load/{MODEL}"), ("POST", "/api/models/unload"),
          ("POST", f"/api/models/unload/{MODEL}"), ("GET", "/unload"), ("GET", "/logs")]


@pytest.fixture
def pair(tmp_path, distributed):  # noqa: F811
    """A front end and a worker, each reaching Redis through a relay of its own (`paired`); one model of one slot,
    placed by memory, so leases can be taken."""
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = textwrap.dedent(f"""
        startPort: {model_ports(1)}
        hardware: {{gpus: [{{id: 0, memory: 24GiB}}]}}
        models:
          {MODEL}: {{cmd: "{fake_cmd(MODEL, events)}", memory: 8GiB}}
        routing: {{scheduler: {{use: serial}}}}
    """)
    with paired(tmp_path, env, text, events) as started:
        yield started


def leases(pair: Pair) -> list[dict]:
    return httpx.get(pair.front_end.base + "/api/leases", timeout=30).json()["leases"]


class EventsRead:
    """An `/api/events` stream read on a thread of its own: each event's type, with when it came."""

    def __init__(self, base: str) -> None:
        self.events: list[tuple[float, str]] = []
        self.ended = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(30, read=None))
        threading.Thread(target=self._read, args=(base,), daemon=True).start()

    def _read(self, base: str) -> None:
        try:
            with self._client.stream("GET", base + "/api/events") as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: "):
                        self.events.append((time.monotonic(), json.loads(line[6:])["type"]))
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()

    def since(self, moment: float) -> list[str]:
        return [kind for at, kind in self.events if at > moment]

    def close(self) -> None:
        self._client.close()


def opened_events(base: str) -> httpx.Response:
    """The answer to a new `/api/events` request, its head only."""
    with httpx.stream("GET", base + "/api/events", timeout=30) as answer:
        return answer if answer.status_code == 200 else httpx.Response(answer.status_code, headers=answer.headers,
                                                                        content=answer.read())


def test_a_route_that_cannot_reach_the_worker_answers_503_with_retry_after_and_a_lease_asked_meanwhile_is_kept(pair):
    base = pair.front_end.base

    def asked(route):
        method, path = route
        return httpx.request(method, base + path, timeout=30)

    stream = EventsRead(base)
    try:
        wait_until(lambda: "modelStatus" in stream.since(0), 10, 0.05, "an /api/events stream's first payload")
        pair.relays["front end redis"].cut()
        try:
            with ThreadPoolExecutor(len(ROUTES) + 2) as pool:
                lease = pool.submit(httpx.post, base + "/api/leases", json={"model": MODEL, "seconds": 600}, timeout=30)
                opened = pool.submit(opened_events, base)
                answers = list(pool.map(asked, ROUTES)) + [opened.result()]
                lease = lease.result()
            shown = [(entry["id"], entry["state"]) for entry in leases(pair)]
        finally:
            pair.relays["front end redis"].restore()
        restored_at = time.monotonic()
        check_routes_and_lease(pair, answers, lease, shown)
        for route in ROUTES:
            assert asked(route).status_code == 200, route
        # the stream open through the outage goes on: the unloads just asked reach it
        wait_until(lambda: "modelStatus" in stream.since(restored_at), 10, 0.05, "the open stream telling the unload")
        assert not stream.ended.is_set(), "the open /api/events stream ended with the outage"
    finally:
        stream.close()

    pair.relays["front end redis"].cut()  # a blink shorter than a question's wait only delays it
    with ThreadPoolExecutor(1) as pool:
        models = pool.submit(asked, ("GET", "/v1/models"))
        time.sleep(BLINK_S)  # the fault itself
        pair.relays["front end redis"].restore()
        assert models.result().status_code == 200, models.result().text
    assert "Traceback" not in pair.front_end.log(), pair.front_end.log()


def check_routes_and_lease(pair: Pair, answers: list[httpx.Response], lease: httpx.Response, shown: list) -> None:
    """Each route asked while Redis was away answered 503 saying why; the lease asked meanwhile was kept, `unknown`
    until the worker read it, which it does within SYNC_S of Redis's return."""
    for (method, path), answer in zip(ROUTES + [("GET", "/api/events")], answers, strict=True):
        assert answer.status_code == 503, (method, path, answer.status_code, answer.text)
        assert answer.headers.get("retry-after") == "1", (method, path, answer.headers)
        error = answer.json()["error"]
        assert error["code"] == "scheduler_unreachable" and "over Redis" in error["message"], (method, path, error)
    # docs/configuration.md, Leases: a lease no scheduler answered for is kept, `unknown` until the worker reads it
    assert lease.status_code == 201, lease.text
    assert lease.json()["state"] == "unknown" and f"within {SYNC_S:g} s" in lease.json()["why"], lease.json()
    made = lease.json()["id"]
    assert shown == [(made, "unknown")], shown
    wait_until(lambda: [(entry["id"], entry["state"]) for entry in leases(pair)] == [(made, "loaded")],
               SYNC_S + ANSWER_TIMEOUT_S, 0.1, "the worker keeping the lease asked while Redis was away")


def test_a_key_revoked_during_a_redis_blink_has_each_queued_request_refused_401_within_2_s(pair):
    """docs/operating.md, API keys: a revoked key's requests still queued at the scheduler get 401 `invalid_api_key`
    within 2 s, their rows `cancelled` with 401 and why. The worker cannot be told while Redis is away: the front
    end refuses them itself, naming each one's row, and the worker lets them go once Redis is back."""
    front_end = pair.front_end
    holder, secret = new_key(front_end, "holder"), new_key(front_end, "leak")
    wait_until(lambda: httpx.get(front_end.base + "/v1/models", headers=auth(secret)).status_code == 200, 5, 0.05,
               "the keys to count")
    running = Held(front_end, holder, "busy", tokens=400, tps=20, model=MODEL)  # the model's one slot, 20 s
    try:
        queued = [Later(front_end, secret, f"leak-{index}", model=MODEL) for index in range(3)]
        rows = wait_until(lambda: leaked_rows(pair) if len(leaked_rows(pair)) == 3 else None, 10, 0.05,
                          "the key's three requests queued at the worker")
        assert {row[1] for row in rows} == {"queued"}, rows
        redis = [pair.relays["front end redis"], pair.relays["worker redis"]]
        for relay in redis:  # Redis drops every connection
            relay.cut()
        cut_at = time.monotonic()
        revoke(pair, "leak")
        revoked_at = time.monotonic()
        answers = {}
        for later in queued:
            wait_until(later.done, revoked_at + REVOKE_BOUND_S - time.monotonic(), 0.02,
                       f"each queued request refused within {REVOKE_BOUND_S:g} s of the revoke")
            answer = later.result()
            assert "x-llamaswap-request-id" in answer.headers, (answer.status_code, answer.headers, answer.text)
            answers[int(answer.headers["x-llamaswap-request-id"])] = answer
        assert time.monotonic() - cut_at < REDIS_WAIT_S, "the requests were refused while Redis was still away"
        time.sleep(max(0.0, cut_at + BLINK_S - time.monotonic()))  # the rest of the blink
        for relay in redis:
            relay.restore()
        assert set(answers) == {row[0] for row in rows}, "each answer names its own request's row"
        for answer in answers.values():
            error = answer.json()["error"]
            assert answer.status_code == 401 and error["code"] == "invalid_api_key", answer.text
            assert "the API key 'leak' is revoked" in error["message"], error
        def ended_rows():
            found = leaked_rows(pair)
            return found if all(row[1] != "queued" for row in found) else None

        ended = wait_until(ended_rows, 10, 0.1, "the worker ending the key's rows once Redis is back")
        assert [(row[0], row[1], row[2]) for row in ended] == [(row[0], "cancelled", 401) for row in rows], ended
        assert all("revoked" in row[3] for row in ended), ended
        rest = running.rest()
    finally:
        running.close()
    assert rest[-1] == "data: [DONE]", "the other key's stream went on through the blink"
    assert not any(started(pair.events, f"leak-{index}") for index in range(3)), "no refused request reached the model"


def test_a_key_revoked_while_its_requests_wait_to_reach_the_worker_has_them_refused_once_redis_is_back(pair):
    """A request admitted while Redis is away waits up to REDIS_WAIT_S for its submit to go through. Its key revoked
    meanwhile, the submit goes through seconds after the front end saw the revoke; the request is refused 401 within
    2 s of Redis's return all the same, never served once the slot frees."""
    front_end = pair.front_end
    holder, secret = new_key(front_end, "holder"), new_key(front_end, "late")
    wait_until(lambda: httpx.get(front_end.base + "/v1/models", headers=auth(secret)).status_code == 200, 5, 0.05,
               "the keys to count")
    running = Held(front_end, holder, "busy", tokens=400, tps=20, model=MODEL)  # the model's one slot, 20 s
    try:
        relay = pair.relays["front end redis"]
        relay.cut()
        cut_at = time.monotonic()
        waiting = [Later(front_end, secret, f"late-{index}", model=MODEL) for index in range(3)]
        time.sleep(0.5)  # admitted while the key counts: their submits wait for Redis
        revoke(pair, "late")
        # Redis back past the 2 s the front end looks for the key's requests once it sees the revoke, within the wait
        time.sleep(max(0.0, cut_at + REDIS_WAIT_S - 1.0 - time.monotonic()))
        assert not any(later.done() for later in waiting), [later.result().text for later in waiting if later.done()]
        relay.restore()
        restored_at = time.monotonic()
        for later in waiting:
            wait_until(later.done, restored_at + REVOKE_BOUND_S - time.monotonic(), 0.02,
                       f"each request refused within {REVOKE_BOUND_S:g} s of Redis's return")
            answer = later.result()
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", answer.text
    finally:
        running.close()
    assert not any(started(pair.events, f"late-{index}") for index in range(3)), "a refused request reached the model"


def revoke(pair: Pair, name: str) -> None:
    """Revoke the key as `llamaswap keys revoke` does (its row disabled), at a known instant: the command's own start
    takes seconds on a loaded machine, longer than the blink."""
    import psycopg

    with psycopg.connect(pair.database_url, connect_timeout=5) as connection:
        assert connection.execute("UPDATE scheduling_apikey SET enabled = false WHERE name = %s", (name,)).rowcount == 1


def leaked_rows(pair: Pair) -> list[tuple[int, str, int | None, str]]:
    """(id, state, status, error) of the `leak` key's requests."""
    import psycopg

    with psycopg.connect(pair.database_url, connect_timeout=5) as connection:
        return connection.execute("SELECT id, state, status_code, error FROM scheduling_queuedrequest "
                                  "WHERE api_key = 'leak' ORDER BY id").fetchall()
