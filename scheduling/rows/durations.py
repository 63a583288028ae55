"""Typical job and load times after a restart: read back from the request rows.

A restarted service predicts waits from its first request on, instead of starting cold. A job's
time is its row's `duration_ms` (completed requests only). A load is not a row of its own: for a
request whose dispatch started its model, the time from arrival to being sent to the model, less
its wait in the queue, is the load (with the stops it needed first).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from scheduling.core.durations import WINDOW, DurationHistory, JobKind


def durations_from_rows(models: Iterable[str]) -> DurationHistory:
    """The most recent `WINDOW` jobs of each kind and loads of each of `models`, oldest first."""
    from scheduling.models import QueuedRequest
    from scheduling.tickets import RequestState

    history = DurationHistory()
    for model in models:
        rows = QueuedRequest.objects.filter(model=model, state=RequestState.COMPLETED)
        jobs = rows.exclude(method="LOAD").filter(duration_ms__isnull=False).order_by("-id")
        recent = list(jobs.values_list("route", "stream", "band", "duration_ms")[: WINDOW * 12])
        for route, stream, band, duration_ms in reversed(recent):
            history.add_job(JobKind(model, route or "other", stream, band), duration_ms / 1000)
        loads = (
            QueuedRequest.objects.filter(model=model, needed_swap=True, dispatched_at__isnull=False,
                                         serial_queue_wait_ms__isnull=False)
            .order_by("-id")
            .values_list("arrived_at", "dispatched_at", "serial_queue_wait_ms")[:WINDOW]
        )
        for arrived_at, dispatched_at, queue_wait_ms in reversed(list(loads)):
            seconds = load_time(arrived_at, dispatched_at, queue_wait_ms)
            if seconds >= 0:
                history.add_load(model, seconds)
    return history


def load_time(arrived_at: datetime, dispatched_at: datetime, queue_wait_ms: int) -> float:
    """The load a row whose dispatch started its model waited for: from arrival to being sent to the
    model, less its wait in the queue (a few milliseconds below 0 when the clocks round apart)."""
    return (dispatched_at - arrived_at).total_seconds() - queue_wait_ms / 1000
