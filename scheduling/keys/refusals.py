"""Refusals at the door, counted per key, minute and status, for the key's usage page.

A request refused before it reaches the scheduler (403 outside the key's scope, 429 over its quota) leaves no
request row. Counting each in memory and adding the counts to one row per key, minute and status every second
or so keeps an abusive client (the likeliest to be refused, and fast) from costing a write per request. A
kill -9 loses the counts not yet written (at most about a second's); a database blink keeps them in memory
for the next write.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F

from scheduling.models import KeyRefusals

Slot = tuple[str, datetime, int]  # key name, minute, status


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


class RefusalCounts:
    """The counts noted since the last write (noted on the event loop, taken by the thread that writes)."""

    def __init__(self) -> None:
        self._counts: Counter[Slot] = Counter()
        self._lock = threading.Lock()

    def note(self, key: str, status: int, at: datetime) -> None:
        with self._lock:
            self._counts[(key, minute_of(at), status)] += 1

    def take(self) -> Counter[Slot]:
        with self._lock:
            taken, self._counts = self._counts, Counter()
        return taken

    def put_back(self, counts: Counter[Slot]) -> None:
        """Counts a write could not store, kept for the next."""
        with self._lock:
            self._counts.update(counts)

    def __bool__(self) -> bool:
        return bool(self._counts)


def write_refusals(counts: Counter[Slot]) -> None:
    """Add `counts` to their rows, making the rows that do not exist yet (another front end may make one at the
    same moment: then it is added to)."""
    with transaction.atomic():
        for (key, minute, status), count in sorted(counts.items()):
            slot = KeyRefusals.objects.filter(api_key=key, minute=minute, status=status)
            if slot.update(count=F("count") + count):
                continue
            try:
                with transaction.atomic():
                    KeyRefusals.objects.create(api_key=key, minute=minute, status=status, count=count)
            except IntegrityError:
                slot.update(count=F("count") + count)
