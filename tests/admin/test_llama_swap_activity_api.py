"""llama-swap's `/api/metrics/activity`, `/api/metrics/stats`, `/api/captures/<id>` and `/api/version`
read through Django against a real test database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from proxy.upstream.captures import STORE, Capture
from scheduling.rows.llama_swap_activity import histogram, percentile
from tests.admin.rows import dispatched

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def config(monkeypatch):
    """The service config as the views see it: no apiKeys, captures off, unless a test sets them."""
    config = SimpleNamespace(api_keys=[], capture_buffer_mb=0)
    monkeypatch.setattr("proxy.api.views.get_service", lambda: SimpleNamespace(config=config))
    STORE.configure(config.capture_buffer_mb)  # as a service does when it starts
    yield config
    STORE.configure(0)


@pytest.fixture
def history(make_request, config):
    make_request(id=1, model="alpha", stream=True, status_code=200, input_tokens=100, output_tokens=20,
                 cache_tokens=40, prompt_per_second=500.0, tokens_per_second=50.0, **dispatched(T0))
    make_request(id=2, model="beta", arrived_at=T0 + timedelta(minutes=1), status_code=200, input_tokens=10,
                 output_tokens=5, prompt_per_second=300.0, tokens_per_second=30.0, duration_ms=900,
                 scheduler="fifo", fifo_priority=7, selector="fast")
    make_request(id=3, model="alpha", arrived_at=T0 + timedelta(minutes=2), state="failed", status_code=502,
                 error="model 'alpha' could not be reached")
    make_request(id=4, model="gamma", arrived_at=T0 + timedelta(minutes=3), status_code=200, input_tokens=1,
                 output_tokens=1, cache_tokens=0, tokens_per_second=10.0)
    make_request(id=5, model="alpha", arrived_at=T0 + timedelta(minutes=4), state="queued")


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["data"]]


def test_a_page_has_llama_swaps_shape_and_lists_only_ended_requests(client, history):
    page = client.get("/api/metrics/activity").json()
    assert {k: page[k] for k in ("page", "limit", "total", "total_pages")} == {
        "page": 1, "limit": 25, "total": 4, "total_pages": 1,
    }
    rows = {row["id"]: row for row in page["data"]}
    assert list(rows) == [4, 3, 2, 1]
    assert rows[1] == {
        "id": 1, "timestamp": "2025-03-01T12:00:00Z", "model": "alpha", "req_path": "/v1/chat/completions",
        "resp_content_type": "text/event-stream", "resp_status_code": 200,
        "tokens": {"cache_tokens": 40, "draft_tokens": -1, "draft_acc_tokens": -1, "input_tokens": 100,
                   "output_tokens": 20, "prompt_per_second": 500.0, "tokens_per_second": 50.0},
        "duration_ms": 2000, "has_capture": False,
        "metadata": {"serial_priority": "100", "serial_band": "interactive", "serial_score": "104.2",
                     "serial_queue_wait_ms": "4200"},
    }
    assert rows[2]["metadata"] == {"fifo_priority": "7", "selector": "fast"}
    assert rows[3]["error_msg"] == "model 'alpha' could not be reached" and rows[3]["resp_status_code"] == 502
    assert rows[3]["tokens"]["prompt_per_second"] == -1 and rows[3]["tokens"]["cache_tokens"] == -1
    assert "error_msg" not in rows[1] and rows[4]["resp_content_type"] == "application/json"


def test_filters_by_model_time_and_id(client, history):
    assert ids(client.get("/api/metrics/activity?model=alpha&model=gamma")) == [4, 3, 1]
    assert ids(client.get("/api/metrics/activity", {"start": "2025-03-01T12:01:00Z"})) == [4, 3, 2]
    assert ids(client.get("/api/metrics/activity", {"end": "2025-03-01T13:01:00+01:00"})) == [2, 1]
    assert ids(client.get("/api/metrics/activity", {"min_id": 2, "max_id": 3})) == [3, 2]
    assert ids(client.get("/api/metrics/activity", {"model": ["alpha", " "], "min_id": 2})) == [3]


def test_sorts_by_a_column_with_unknown_values_lowest_and_ties_by_id(client, history):
    assert ids(client.get("/api/metrics/activity", {"sort": "prompt_speed"})) == [1, 2, 4, 3]
    assert ids(client.get("/api/metrics/activity", {"sort": "prompt_speed", "order": "ASC"})) == [3, 4, 2, 1]
    assert ids(client.get("/api/metrics/activity", {"sort": "model", "order": "asc"})) == [1, 3, 2, 4]
    assert ids(client.get("/api/metrics/activity", {"sort": "resp_status_code"})) == [3, 4, 2, 1]
    assert ids(client.get("/api/metrics/activity", {"sort": "id", "order": "asc"})) == [1, 2, 3, 4]


def test_pages_split_the_rows_and_count_them(client, history):
    first = client.get("/api/metrics/activity", {"limit": 3}).json()
    assert [r["id"] for r in first["data"]] == [4, 3, 2] and first["total"] == 4 and first["total_pages"] == 2
    second = client.get("/api/metrics/activity", {"limit": 3, "page": 2}).json()
    assert [r["id"] for r in second["data"]] == [1] and second["page"] == 2
    assert client.get("/api/metrics/activity", {"limit": 3, "page": 9}).json()["data"] == []


def test_the_last_page_the_database_can_reach_is_empty_not_an_error(client, history):
    assert ids(client.get("/api/metrics/activity", {"limit": 999, "page": 9232604641496272})) == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"limit": "0"}, "limit '0' is not a whole number from 1 to 999"),
        ({"limit": "1000"}, "limit '1000' is not a whole number from 1 to 999"),
        ({"page": "0"}, "page '0' is not a whole number from 1 to 9232604641496272"),
        # page × limit would pass the database's 64-bit integers; past 4300 digits int() itself refuses.
        ({"page": "9999999999999999999"}, "page '9999999999999999999' is not a whole number from 1 to"),
        ({"page": "9" * 30}, "page '" + "9" * 30 + "' is not a whole number"),
        ({"page": "9" * 5000}, "page '99999999999999999999… (5000 characters)' is not a whole number"),
        ({"limit": "9" * 5000}, "limit '99999999999999999999… (5000 characters)' is not a whole number"),
        ({"min_id": "9" * 5000}, "min_id '99999999999999999999… (5000 characters)' is not a whole number"),
        ({"max_id": "9223372036854775808"}, "max_id '9223372036854775808' is not a whole number from 1 to"),
        ({"min_id": "x"}, "min_id 'x' is not a whole number"),
        ({"max_id": "-2"}, "max_id '-2' is not a whole number"),
        ({"sort": "speed"}, "sort 'speed' is not a column; use one of id, time, model"),
        ({"order": "up"}, "order 'up' must be asc or desc"),
        ({"start": "yesterday"}, "start 'yesterday' is not an RFC 3339 time"),
        ({"end": "2025-03-01T12:00:00"}, "end '2025-03-01T12:00:00' is not an RFC 3339 time"),
        ({"start": "2025-03-02T00:00:00Z", "end": "2025-03-01T00:00:00Z"}, "start (2025-03-02T00:00:00Z) is after end"),
    ],
)
def test_bad_parameters_get_a_400_naming_the_parameter(client, config, query, message):
    response = client.get("/api/metrics/activity", query)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == "invalid_parameter"


def test_stats_total_the_ended_requests_and_bin_their_speeds(client, history):
    stats = client.get("/api/metrics/stats").json()
    assert {k: stats[k] for k in ("total_requests", "total_input_tokens", "total_output_tokens", "total_cache_tokens")} == {
        "total_requests": 4, "total_input_tokens": 111, "total_output_tokens": 26, "total_cache_tokens": 40,
    }
    assert stats["prompt_histogram"] == {"bins": [1, 0, 0, 0, 1], "min": 300.0, "max": 500.0, "binSize": 40.0,
                                         "p50": 400.0, "p95": 490.0, "p99": 498.0}
    assert stats["gen_histogram"]["min"] == 10.0 and stats["gen_histogram"]["p50"] == 30.0
    alpha = client.get("/api/metrics/stats", {"model": "alpha"}).json()
    assert alpha["total_requests"] == 2 and alpha["total_input_tokens"] == 100
    assert alpha["prompt_histogram"]["bins"] == [1] and alpha["prompt_histogram"]["binSize"] == 0
    empty = client.get("/api/metrics/stats", {"model": "nobody"}).json()
    assert empty == {"total_requests": 0, "total_input_tokens": 0, "total_output_tokens": 0, "total_cache_tokens": 0,
                     "prompt_histogram": None, "gen_histogram": None}


def test_histogram_uses_sturges_bins_between_5_and_20_and_interpolated_percentiles():
    values = [float(v) for v in range(1, 101)]
    data = histogram(list(values))
    assert len(data["bins"]) == 8 and sum(data["bins"]) == 100  # ceil(log2(100)) + 1
    assert data["bins"][-1] >= 1 and data["min"] == 1.0 and data["max"] == 100.0
    assert percentile(values, 50) == 50.5 and percentile(values, 99) == pytest.approx(99.01)
    assert len(histogram([float(v) for v in range(2 ** 22)])["bins"]) == 20
    assert histogram([]) is None


def test_captures_answer_with_llama_swaps_shape_and_say_why_one_is_missing(client, history, config):
    assert "captures are off" in client.get("/api/captures/1").json()["error"]["message"]
    config.capture_buffer_mb = 1
    STORE.configure(1)
    STORE.add(Capture(id=2, req_path="/v1/chat/completions", req_headers={"authorization": "[REDACTED]"},
                      req_body=b'{"model":"beta"}', resp_headers={"content-type": "application/json"}, resp_body=None))
    found = client.get("/api/captures/2")
    assert found.status_code == 200
    assert found.json() == {"id": 2, "req_path": "/v1/chat/completions", "req_headers": {"authorization": "[REDACTED]"},
                            "req_body": "eyJtb2RlbCI6ImJldGEifQ==", "resp_headers": {"content-type": "application/json"},
                            "resp_body": None}
    bad = client.get("/api/captures/abc")
    assert bad.status_code == 400 and "capture id 'abc' is not a request id" in bad.json()["error"]["message"]
    missing = client.get("/api/captures/3")
    assert missing.status_code == 404 and "did not relay it" in missing.json()["error"]["message"]
    rows = {row["id"]: row for row in client.get("/api/metrics/activity").json()["data"]}
    assert rows[2]["has_capture"] is True and rows[1]["has_capture"] is False


def test_version_has_llama_swaps_fields(client, config):
    from proxy.version import llamaswap_version

    version = client.get("/api/version").json()
    assert set(version) == {"version", "commit", "build_date"} and version["version"] == llamaswap_version()
    assert version["version"] != "unknown"


def test_the_api_keys_protect_every_route(client, history, config):
    config.api_keys.append("sekrit")
    for path in ("/api/metrics/activity", "/api/metrics/stats", "/api/captures/1", "/api/version"):
        assert client.get(path).status_code == 401, path
        assert client.post(path, headers={"x-api-key": "sekrit"}).status_code == 405, path
    assert ids(client.get("/api/metrics/activity", headers={"Authorization": "Bearer sekrit"})) == [4, 3, 2, 1]
