"""The key rows as this process last read them, read again when a request finds them older than
`REFRESH_S`: so a key made or revoked through any front end, the admin or `llamaswap keys` counts on
every front end within REFRESH_S plus one read (under 2 s), with no restart and no message between them.

The database may blink. A read that fails keeps the last good rows for `STALE_LIMIT_S` (a revoked key can
then still pass for that long, and the log says the rows are old); past that, or before any read worked, a
row key is refused with 503 (`proxy.http.access`), never let through. A config file apiKey works throughout.
Meanwhile requests do not wait on the database: a failed read is tried again REFRESH_S later, and a read that
hangs is waited for READ_WAIT_S once, not again until it ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from proxy.http.access import Caller, Denied, identify
from scheduling.door.outage_log import OutageLog
from scheduling.keys.store import KeyRows, read_rows

REFRESH_S = 0.5
STALE_LIMIT_S = 300.0
# A read slower than this is not waited for: the last good rows answer (and the read finishes behind).
READ_WAIT_S = 1.0

log = logging.getLogger("llamaswap.keys")


class KeyCache:
    """The rows last read, when, and the keys used since (written as `last_used_at` by the next read)."""

    def __init__(self, read: Callable[[Iterable[str]], KeyRows] = read_rows,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._clock = read, clock
        self._rows: KeyRows | None = None
        self._read_at = float("-inf")
        self._tried_at = float("-inf")
        self._failed = False  # the last read failed: the next waits REFRESH_S after it
        self._stalled = False  # a read outlasted READ_WAIT_S and has not ended: nobody waits for it again
        self._outage = OutageLog(log, f"reading the API key table (meanwhile the rows last read answer, "
                                      f"{STALE_LIMIT_S:.0f} s at most)")
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def fresh(self) -> KeyRows | None:
        """The rows, when read less than REFRESH_S ago."""
        return self._rows if self._clock() - self._read_at < REFRESH_S else None

    def usable(self) -> KeyRows | None:
        """The last good rows unless they are older than STALE_LIMIT_S (None: refuse row keys)."""
        return self._rows if self._clock() - self._read_at <= STALE_LIMIT_S else None

    def current(self) -> KeyRows | None:
        """Fresh rows, read now when they are not (blocking: call from a thread that may use the database)."""
        with self._lock:
            if (rows := self.fresh()) is not None:
                return rows
            if self._failed and self._clock() - self._tried_at < REFRESH_S:
                return self.usable()  # a request during an outage does not wait for a read bound to fail
            self._tried_at = self._clock()
            used, self._used = self._used, set()
            try:
                if self._failed:
                    drop_broken_connection()
                rows = self._read(used)
            except Exception as exc:  # the database is away: the last good rows answer while they may
                self._used |= used
                self._failed, self._stalled = True, False
                self._outage.failed(exc)
                return self.usable()
            self._failed, self._stalled = False, False
            self._outage.worked()
            self._rows, self._read_at = rows, self._clock()
            return rows

    async def current_async(self) -> KeyRows | None:
        if (rows := self.fresh()) is not None:
            return rows
        if self._stalled:
            return self.usable()
        try:  # on the thread Django's other synchronous calls use: its connection, its transaction in tests
            return await asyncio.wait_for(sync_to_async(self.current)(), READ_WAIT_S)
        except asyncio.TimeoutError:
            self._stalled = True
            return self.usable()

    def used(self, name: str) -> None:
        if name:
            self._used.add(name)


def drop_broken_connection() -> None:
    """Close this thread's connection if a database blink broke it, so the next read opens a new one. Only
    then: Django's `close_old_connections` would also close a healthy one inside a transaction."""
    if connection.connection is not None and not connection.is_usable():
        connection.close()


KEYS = KeyCache()


def admitted(headers: Mapping[str, str], config_keys: Sequence[str], rows: KeyRows | None) -> Caller | Denied:
    """`identify` now, noting the row key it admits as used."""
    found = identify(headers, config_keys, rows, timezone.now())
    if isinstance(found, Caller):
        KEYS.used(found.scope.name)
    return found


async def caller_of(headers: Mapping[str, str], config_keys: Sequence[str]) -> Caller | Denied:
    """Who sent a request (lower-case header names), against the config's keys and the rows."""
    return admitted(headers, config_keys, await KEYS.current_async())


def caller_of_now(headers: Mapping[str, str], config_keys: Sequence[str]) -> Caller | Denied:
    """`caller_of` for synchronous code (it may read the rows)."""
    return admitted(headers, config_keys, KEYS.current())
