"""`GET /api/activity`: the request history as JSON for scripts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tests.admin.rows import dispatched

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def api_keys(monkeypatch):
    """The service's configured apiKeys, as the API sees them (none by default: open)."""
    keys: list[str] = []
    service = SimpleNamespace(config=SimpleNamespace(api_keys=keys))
    monkeypatch.setattr("proxy.api.views.get_service", lambda: service)
    return keys


@pytest.fixture
def history(make_request, api_keys):
    make_request(id=1, model="alpha", **dispatched(T0, score=(0, 10, 0.5), changed_by_affinity=True,
                                                    runner_up_id=2, runner_up_score=0.7,
                                                    explanation="dispatched at score 10.5", output_tokens=7,
                                                    slot=2, waited_because="model alpha was busy (2/2 slots)"))
    make_request(id=2, model="beta", arrived_at=T0 + timedelta(seconds=1), priority=-100, band="batch",
                 state="cancelled", error="cancelled by an operator while queued")
    make_request(id=3, model="gamma", scheduler="fifo", fifo_priority=-90, priority=-100, band="batch",
                 arrived_at=T0 + timedelta(hours=1), dispatched_at=T0 + timedelta(hours=1, seconds=2))
    make_request(id=4, model="alpha", state="queued", arrived_at=T0 + timedelta(hours=2))


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["data"]]


def test_rows_come_newest_first_with_the_decision_keys_of_the_spec(client, history):
    response = client.get("/api/activity")
    assert ids(response) == [4, 3, 2, 1]
    rows = {row["id"]: row for row in response.json()["data"]}
    first = rows[1]
    assert first["serial_priority"] == 0 and first["serial_band"] == "normal"
    assert first["serial_score"] == 10.5 and first["serial_queue_wait_ms"] == 4200
    assert first["score_terms"] == {"priority": 0, "affinity": 10, "aging": 0.5}
    assert first["runner_up"] == {"id": 2, "score": 0.7}
    assert first["changed_pick"] == ["swap_affinity"]
    assert first["explanation"] == "dispatched at score 10.5"
    assert first["slot"] == 2 and first["waited_because"] == "model alpha was busy (2/2 slots)"
    assert rows[4]["slot"] is None and rows[4]["waited_because"] is None
    assert first["arrived_at"] == "2025-03-01T12:00:00Z" and first["output_tokens"] == 7
    assert rows[3]["fifo_priority"] == -90 and "serial_score" not in rows[3]
    assert rows[2]["state"] == "cancelled" and rows[2]["score_terms"] is None and "operator" in rows[2]["error"]


def test_filters_by_model_band_state_and_time(client, history):
    assert ids(client.get("/api/activity?model=alpha&model=gamma")) == [4, 3, 1]
    assert ids(client.get("/api/activity", {"band": "batch"})) == [3, 2]
    assert ids(client.get("/api/activity", {"state": "queued"})) == [4]
    assert ids(client.get("/api/activity", {"since": "2025-03-01T12:30:00Z"})) == [4, 3]
    assert ids(client.get("/api/activity", {"until": "2025-03-01T13:00:00+00:00"})) == [2, 1]
    # A "+" the caller forgot to encode arrives as a space; the zone still counts.
    assert ids(client.get("/api/activity?until=2025-03-01T14:00:00 01:00")) == [2, 1]


def test_pages_follow_the_before_id_cursor_to_the_end(client, history):
    first = client.get("/api/activity", {"limit": 3}).json()
    assert [r["id"] for r in first["data"]] == [4, 3, 2] and first["next_before_id"] == 2
    second = client.get("/api/activity", {"limit": 3, "before_id": first["next_before_id"]}).json()
    assert [r["id"] for r in second["data"]] == [1] and second["next_before_id"] is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"limit": "0"}, "limit 0 is out of range; use a whole number from 1 to 1000"),
        ({"limit": "1001"}, "limit 1001 is out of range"),
        ({"limit": "ten"}, "limit 'ten' is not a whole number from 1 to 1000"),
        ({"before_id": "-3"}, "before_id '-3' is not a whole number from 1 to 9223372036854775807"),
        ({"before_id": "9223372036854775808"}, "before_id 9223372036854775808 is out of range"),
        ({"before_id": "9" * 5000}, "before_id 99999999999999999999… (5000 characters) is out of range"),
        ({"limit": "9" * 5000}, "limit 99999999999999999999… (5000 characters) is out of range"),
        ({"band": "urgent"}, "band 'urgent' is not one of interactive, normal, batch"),
        ({"state": "done"}, "state 'done' is not one of queued, dispatched"),
        ({"since": "yesterday"}, "since 'yesterday' is not an ISO 8601 time"),
        ({"since": "2025-03-02", "until": "2025-03-01"}, "'since' (2025-03-02) must be before 'until' (2025-03-01)"),
        ({"modle": "alpha"}, "unknown parameter 'modle'; use model, band, state"),
    ],
)
def test_bad_parameters_get_a_400_that_says_what_to_send(client, api_keys, query, message):
    response = client.get("/api/activity", query)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == "invalid_parameter"


def test_the_api_keys_protect_it_like_the_other_api_routes(client, history, api_keys):
    api_keys.append("sekrit")
    refused = client.get("/api/activity")
    assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
    assert ids(client.get("/api/activity", headers={"Authorization": "Bearer sekrit"})) == [4, 3, 2, 1]
    assert client.post("/api/activity", headers={"x-api-key": "sekrit"}).status_code == 405
