"""The history's index-friendly queries give the same answers as Django's generic ones."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db.models import QuerySet
from django.utils import timezone as django_timezone

from scheduling.rows.history import HistoryQuerySet, search_requests
from scheduling.models import QueuedRequest

pytestmark = pytest.mark.django_db

# Around midnight, month and year ends, and a DST change in New York.
ARRIVALS = [
    datetime(2024, 12, 31, 23, 59, tzinfo=timezone.utc),
    datetime(2025, 1, 1, 0, 0, tzinfo=timezone.utc),
    datetime(2025, 1, 1, 4, 59, tzinfo=timezone.utc),
    datetime(2025, 1, 1, 5, 0, tzinfo=timezone.utc),
    datetime(2025, 1, 31, 23, 0, tzinfo=timezone.utc),
    datetime(2025, 3, 9, 6, 30, tzinfo=timezone.utc),
    datetime(2025, 3, 9, 7, 30, tzinfo=timezone.utc),
    datetime(2025, 3, 10, 3, 59, tzinfo=timezone.utc),
    datetime(2025, 12, 1, 0, 0, tzinfo=timezone.utc),
    datetime(2026, 2, 28, 12, 0, tzinfo=timezone.utc),
]


@pytest.fixture
def rows(make_request):
    for n, at in enumerate(ARRIVALS, start=1):
        model = "alpha" if n % 3 else "Beta-7b"
        make_request(id=n, arrived_at=at, model=model, state="failed" if n % 2 else "completed")


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize("kind", ["year", "month", "day"])
@pytest.mark.parametrize("state", [None, "failed"])
def test_the_date_drill_down_lists_the_same_periods_as_django(rows, zone, kind, state):
    generic = QueuedRequest.objects.all()
    if state:
        generic = generic.filter(state=state)
    indexed = HistoryQuerySet(QueuedRequest, generic.query)
    with django_timezone.override(zone):
        assert list(indexed.datetimes("arrived_at", kind)) == list(QuerySet.datetimes(generic, "arrived_at", kind))


def test_search_matches_an_id_or_a_model_prefix_in_any_case(rows):
    def found(term):
        return sorted(search_requests(QueuedRequest.objects.all(), term).values_list("id", flat=True))

    assert found("beta") == [3, 6, 9]
    assert found("ALP") == [1, 2, 4, 5, 7, 8, 10]
    assert found("7") == [7]
    assert found("99999999999999999999") == []
    assert found("9" * 5000) == []  # past the 4300 digits int() reads
    assert found("gamma") == []
    assert found("  ") == list(range(1, 11))


def test_an_empty_history_has_no_periods():
    assert HistoryQuerySet(QueuedRequest).datetimes("arrived_at", "day") == []


def test_periods_step_past_long_gaps(make_request):
    start = datetime(2020, 5, 17, 8, 0, tzinfo=timezone.utc)
    for n, days in enumerate([0, 1, 400, 401, 2000], start=1):
        make_request(id=n, arrived_at=start + timedelta(days=days))
    generic = QuerySet.datetimes(QueuedRequest.objects.all(), "arrived_at", "day")
    assert list(HistoryQuerySet(QueuedRequest).datetimes("arrived_at", "day")) == list(generic)
