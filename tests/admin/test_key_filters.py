"""A key's requests picked out of the history: the admin's API key filter and `GET /api/activity?key=`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from proxy.serving.key_cache import KeyCache
from scheduling.keys.store import make_key
from scheduling.models import ApiKey

pytestmark = pytest.mark.django_db

LIST_URL = reverse("admin:scheduling_queuedrequest_changelist")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def open_api(monkeypatch):
    """The API with no configured apiKeys and no key rows, read afresh."""
    monkeypatch.setattr("proxy.api.views.get_service", lambda: SimpleNamespace(config=SimpleNamespace(api_keys=[])))
    monkeypatch.setattr("proxy.serving.key_cache.KEYS", KeyCache())


@pytest.fixture
def keyed_history(make_request):
    """Rows sent with two row keys and with none; the rows keep only the names, so no key row is needed."""
    make_request(id=1, api_key="chat-app")
    make_request(id=2, api_key="batch-jobs", arrived_at=T0 + timedelta(minutes=5))
    make_request(id=3, api_key="")  # a config file key's, or an open server's
    make_request(id=4, api_key="chat-app", arrived_at=T0 + timedelta(hours=1))


def listed_ids(response) -> list[int]:
    return [row.id for row in response.context["cl"].result_list]


def test_the_history_filters_by_key_name_and_by_no_row_key(admin_client, keyed_history, config_file):
    for name in ("chat-app", "batch-jobs"):
        make_key(ApiKey(name=name))
    assert listed_ids(admin_client.get(LIST_URL, {"api_key": "chat-app"})) == [4, 1]
    assert listed_ids(admin_client.get(LIST_URL, {"api_key": "batch-jobs"})) == [2]
    assert listed_ids(admin_client.get(LIST_URL, {"api_key": "(none)"})) == [3]
    page = admin_client.get(LIST_URL).content.decode()
    assert "By API key" in page and "?api_key=batch-jobs" in page and "no row key" in page


def test_the_key_filter_reads_the_key_table_not_the_history_for_its_choices(admin_client, keyed_history, config_file):
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(LIST_URL)
    distinct = [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper() and "api_key" in q["sql"]]
    assert distinct == []


def test_the_activity_api_filters_by_key(client, keyed_history, open_api):
    def ids(query):
        response = client.get("/api/activity" + query)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["data"]]

    assert ids("?key=chat-app") == [4, 1]
    assert ids("?key=chat-app&key=batch-jobs") == [4, 2, 1]
    assert ids("?key=") == [3]
    assert ids("?key=nobody") == []
    assert ids("?key=chat-app&since=2025-03-01T12:30:00Z") == [4]
