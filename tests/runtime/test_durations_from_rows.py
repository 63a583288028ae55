"""A restarted service's typical job and load times, read back from the rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from scheduling.core.durations import JobKind
from scheduling.models import QueuedRequest
from scheduling.rows.durations import durations_from_rows

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)


def row(ticket_id: int, **fields) -> None:
    defaults = dict(model="m", path=CHAT, route=CHAT, state="completed", arrived_at=T0, band="normal")
    QueuedRequest.objects.create(id=ticket_id, **{**defaults, **fields})


def test_jobs_by_kind_and_loads_come_back_from_the_rows():
    row(1, duration_ms=4000)
    row(2, duration_ms=6000)
    row(3, duration_ms=60000, band="batch")
    row(4, duration_ms=1, method="LOAD")  # a preload is no job
    row(5, state="failed", duration_ms=999000)  # only completed jobs say how long a job takes
    # Dispatched 7.5 s after arrival, 1.5 s of it in the queue: a 6 s load.
    row(6, duration_ms=5000, needed_swap=True, serial_queue_wait_ms=1500, dispatched_at=T0 + timedelta(seconds=7.5))
    history = durations_from_rows(["m", "other"])
    assert history.job_s(JobKind("m", CHAT, False, "normal")) == 5.0
    assert history.job_s(JobKind("m", CHAT, False, "batch")) == 60.0
    assert history.load_s("m") == pytest.approx(6.0)
    assert history.load_s("other") is None and history.job_s(JobKind("other", CHAT, False, "normal")) is None
