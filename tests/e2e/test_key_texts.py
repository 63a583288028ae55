"""What a key is told of its own requests names no model outside its scope, end to end against `llamaswap serve`:
a request of a key limited to `chat` that waits on, or stops, a model the key may not see — the 503 at its maximum
wait, its `/api/queue` outlook, `/api/events` queue entries and activity rows, its `/api/activity` row, and what
holds back a lease on its model — shows "another model" where an operator key reads that model's name, its lease id
and its eviction cost."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.test_api_keys import auth, chat, new_key
from tests.e2e.test_key_revocation import config_text
from tests.e2e.test_key_visibility import events_of
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

THEIRS = "theirmodel"  # a name found in no text of its own: any trace of it is the model's
MAX_WAIT = {"X-LlamaSwap-Max-Wait": "6"}


@pytest.fixture
def served(tmp_path):
    """`chat` and `theirmodel` of 20 GiB on one 24 GiB GPU: one stops for the other. A key limited to `chat`, and
    an operator key."""
    events = tmp_path / "events.jsonl"
    text = config_text({name: f'cmd: "{fake_cmd(name, events)}", memory: 20GiB' for name in ("chat", THEIRS)},
                       "hardware: {gpus: [{id: 0, memory: 24GiB}]}")
    with Served(tmp_path, text) as s:
        s.secrets = {name: new_key(s, name, *args) for name, args in (("tenant", ("--models", "chat")),
                                                                      ("ops", ("--operator",)))}
        yield s


def get(served: Served, path: str, key: str) -> httpx.Response:
    return httpx.get(served.base + path, headers=auth(served.secrets[key]), timeout=10)


def loaded(served: Served) -> set[str]:
    return {m["model"] for m in get(served, "/running", "ops").json()["running"] if m["state"] == "ready"}


def told_of_theirs(text: str) -> list[str]:
    """What `text` gives away of the other model: its name, a lease id, an eviction cost's figures."""
    return re.findall(rf"{THEIRS}|lease #\d+|cost \d|e\^−\d", text)


def row_of(served: Served, key: str, request_id: int) -> dict:
    return next(row for row in get(served, "/api/activity", key).json()["data"] if row["id"] == request_id)


def first_queue_payload(served: Served, key: str) -> list[dict]:
    with httpx.stream("GET", served.base + "/api/events", headers=auth(served.secrets[key]), timeout=10) as feed:
        return events_of(next(feed.iter_text()))["queue"][0]


def test_a_request_held_back_by_a_lease_on_a_model_outside_the_keys_scope_is_told_of_another_model(served):
    made = httpx.post(served.base + "/api/leases", headers=auth(served.secrets["ops"]), timeout=10,
                      json={"model": THEIRS, "seconds": 600})
    assert made.status_code == 201, made.text
    lease = f"{THEIRS} (lease #{made.json()['id']})"
    wait_until(lambda: loaded(served) == {THEIRS}, 20, 0.05, "the leased model loaded")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(chat, served, "chat", served.secrets["tenant"], **MAX_WAIT)

        def held_back() -> dict | None:  # the operator's view of the tenant's request, once it says why it waits
            entries = get(served, "/api/queue", "ops").json()["data"]
            return next((e for e in entries if e["model"] == "chat" and lease in e["outlook"]), None)

        entry = wait_until(held_back, 5, 0.05, "the waiting request's outlook to name the lease")
        mine = next(e for e in get(served, "/api/queue", "tenant").json()["data"] if e["id"] == entry["id"])
        assert "another model" in mine["outlook"] and not told_of_theirs(mine["outlook"]), mine["outlook"]
        queued = {key: next(e for e in first_queue_payload(served, key) if e["id"] == entry["id"])["outlook"]
                  for key in ("tenant", "ops")}
        assert lease in queued["ops"], queued
        assert "another model" in queued["tenant"] and not told_of_theirs(queued["tenant"]), queued
        refused = waiting.result()
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "max_wait_exceeded" and "another model" in error["message"], error
    assert not told_of_theirs(error["message"]), error
    request_id = int(refused.headers["x-llamaswap-request-id"])
    assert not told_of_theirs(json.dumps(row_of(served, "tenant", request_id))), row_of(served, "tenant", request_id)
    assert not told_of_theirs(json.dumps(get(served, "/api/metrics/activity", "tenant").json()))
    assert lease in row_of(served, "ops", request_id)["error"]
    by_operator = chat(served, "chat", served.secrets["ops"], **{"X-LlamaSwap-Max-Wait": "1"})
    assert by_operator.status_code == 503 and lease in by_operator.json()["error"]["message"], by_operator.text
    kept = httpx.post(served.base + "/api/leases", headers=auth(served.secrets["ops"]), timeout=10,
                      json={"model": "chat", "seconds": 600})  # a lease the key sees, waiting for the other's
    assert kept.status_code == 201 and kept.json()["blocked_by"] == [lease], kept.text
    assert [(shown["model"], shown["blocked_by"]) for shown in get(served, "/api/leases", "tenant").json()["leases"]] \
        == [("chat", ["another model"])]


def test_a_request_whose_start_stopped_a_model_outside_the_keys_scope_is_not_told_its_cost(served):
    assert chat(served, THEIRS, served.secrets["ops"]).status_code == 200
    with httpx.stream("GET", served.base + "/api/events", headers=auth(served.secrets["tenant"]), timeout=10) as feed:
        chunks = feed.iter_text()
        next(chunks)  # the first payload: from here on, only what changes
        answer = chat(served, "chat", served.secrets["tenant"])
        assert answer.status_code == 200, answer.text
        request_id = int(answer.headers["x-llamaswap-request-id"])
        streamed: list[dict] = []

        def ended() -> bool:
            streamed.extend(row for row in events_of(next(chunks)).get("activity", []) if row["id"] == request_id)
            return any(row["state"] == "completed" for row in streamed)

        wait_until(ended, 10, 0, "the request's end in the stream's activity")
    assert loaded(served) == {"chat"}
    explanation = row_of(served, "ops", request_id)["explanation"]
    assert re.search(rf"its start stopped {THEIRS} \(cost \d+\.\d\d = ", explanation), explanation
    mine = row_of(served, "tenant", request_id)
    assert "its start stopped another model: the idle models" in mine["explanation"], mine
    for row in (mine, *streamed):
        assert not told_of_theirs(json.dumps(row, ensure_ascii=False)), row
