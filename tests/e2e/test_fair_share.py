"""Fair share between API keys end to end: keys made by `llamaswap keys create --weight`, `fairness: keys`,
and a model server with one slot; the order its event log shows the requests start in is the keys' turns."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.test_api_keys import auth, chat, new_key
from tests.e2e.test_key_quotas import Held, Later, config_text
from tests.e2e.test_key_visibility import events_of
from tests.served import Served, read_events, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fair-share")
    events = tmp / "events.jsonl"
    with Served(tmp, config_text(events, serial="{fairness: keys}")) as s:
        s.events = events
        yield s


def queued(served: Served, secret: str) -> int:
    response = httpx.get(served.base + "/api/queue", headers=auth(secret), timeout=10)
    assert response.status_code == 200, response.text
    return sum(entry["state"] == "waiting" for entry in response.json()["data"])


def activity(served: Served, secret: str) -> list[dict]:
    response = httpx.get(served.base + "/api/activity", headers=auth(secret), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def started_ids(served: Served, prefix: str) -> list[str]:
    return [e["id"] for e in read_events(served.events) if e.get("event") == "start" and e["id"].startswith(prefix)]


def serve_in_turn(served: Served, holder: str, sent: list[tuple[str, str]]) -> list[str]:
    """Hold the model with `holder`'s request, queue `sent` ((secret, id) in order, each queued before the
    next is sent), let the model go: the ids in the order the model server started them."""
    prefix = sent[0][1].split("-")[0]
    held = Held(served, holder, f"{prefix}-held")
    try:
        later = []
        for count, (secret, request_id) in enumerate(sent, start=1):
            later.append(Later(served, secret, request_id))
            wait_until(lambda: queued(served, holder) == count, 10, 0.02, f"{request_id} to queue")
    finally:
        held.close()
    for request in later:
        assert request.result().status_code == 200
    return started_ids(served, prefix)[1:]


def test_four_of_key_a_then_two_of_key_b_run_in_turns_a_b_a_b_a_a(served):
    holder = new_key(served, "holder", "--operator")
    a, b = new_key(served, "a"), new_key(served, "b")
    wait_until(lambda: chat(served, "chat", None).status_code == 401, 2.0, 0.05, "the keys to count")
    sent = [(a, f"even-a{n}") for n in range(4)] + [(b, f"even-b{n}") for n in range(2)]
    assert serve_in_turn(served, holder, sent) == ["even-a0", "even-b0", "even-a1", "even-b1", "even-a2", "even-a3"]
    fair = wait_until(lambda: [entry for entry in activity(served, holder) if "fair_share" in entry["changed_pick"]],
                      10, 0.05, "the fair picks' rows")
    assert len(fair) == 2 and {entry["api_key"] for entry in fair} == {"b"}
    assert all("fair share between API keys" in entry["explanation"] for entry in fair)


def test_a_key_of_weight_two_gets_two_turns_to_one(served):
    holder = new_key(served, "holder2", "--operator")
    light, heavy = new_key(served, "light"), new_key(served, "heavy", "--weight", "2")
    wait_until(lambda: chat(served, "chat", heavy).status_code == 200, 2.0, 0.05, "the keys to count")
    sent = [(light, f"weighted-l{n}") for n in range(3)] + [(heavy, f"weighted-h{n}") for n in range(4)]
    assert serve_in_turn(served, holder, sent) == [
        "weighted-l0", "weighted-h0", "weighted-h1", "weighted-l1", "weighted-h2", "weighted-h3", "weighted-l2"]


def test_a_key_is_told_its_fair_turn_naming_its_own_key_and_the_other_as_another_key(served):
    """The decision text of a request fair share sent ahead names both keys; the key that sent it reads its own
    name and "another key" for the other — in `/api/activity`, `/api/queue/<id>` and `/api/events` — while an
    operator reads both names."""
    holder = new_key(served, "holder3", "--operator")
    alpha, beta = new_key(served, "tenant-alpha"), new_key(served, "tenant-beta")
    wait_until(lambda: chat(served, "chat", beta).status_code == 200, 2.0, 0.05, "the keys to count")
    with httpx.stream("GET", served.base + "/api/events", headers=auth(beta), timeout=30) as feed:
        chunks = feed.iter_text()
        next(chunks)  # the first payload: from here on, only what changes
        sent = [(alpha, "told-a0"), (alpha, "told-a1"), (beta, "told-b0")]
        assert serve_in_turn(served, holder, sent) == ["told-a0", "told-b0", "told-a1"]
        turn = wait_until(lambda: next((row for row in activity(served, holder) if row["api_key"] == "tenant-beta"
                                        and "fair_share" in row["changed_pick"]), None), 10, 0.05, "the fair pick's row")
        streamed: list[dict] = []

        def ended() -> bool:
            streamed.extend(row for row in events_of(next(chunks)).get("activity", []) if row["id"] == turn["id"])
            return any(row["state"] == "completed" for row in streamed)

        wait_until(ended, 10, 0, "the fair pick's end in the key's stream")
    assert "(of key 'tenant-beta') had its turn before #" in turn["explanation"]
    assert "(of key 'tenant-alpha'), which arrived earlier" in turn["explanation"], turn["explanation"]
    mine = next(row for row in activity(served, beta) if row["id"] == turn["id"])
    assert mine["explanation"] == turn["explanation"].replace("(of key 'tenant-alpha')", "(of another key)")
    entry = httpx.get(served.base + f"/api/queue/{turn['id']}", headers=auth(beta), timeout=10).json()
    assert entry["explanation"] == mine["explanation"], entry
    for shown in (mine, entry, *streamed):
        assert "tenant-alpha" not in json.dumps(shown), shown
