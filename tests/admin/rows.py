"""Request rows as the recorder leaves them, for admin and API tests."""

from __future__ import annotations

from datetime import timedelta

from scheduling.core import band_of


def dispatched(at, wait_s=4.2, score=(100, 0, 4.2), **fields):
    """The decision columns of a request the serial scheduler dispatched after `wait_s` seconds."""
    priority, affinity, aging = score
    return {
        "arrived_at": at,
        "dispatched_at": at + timedelta(seconds=wait_s),
        "finished_at": at + timedelta(seconds=wait_s + 2),
        "priority": priority,
        "band": band_of(priority).value,
        "serial_priority": priority,
        "serial_band": band_of(priority).value,
        "serial_score": priority + affinity + aging,
        "serial_queue_wait_ms": int(wait_s * 1000),
        "score_priority": priority,
        "score_affinity": affinity,
        "score_aging": aging,
        "duration_ms": 2000,
        **fields,
    }
