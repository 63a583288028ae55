"""The key rows as this process last read them, read again when a request finds them older than
`REFRESH_S`: so a key made or revoked through any front end, the admin or `llamaswap keys` counts on
every front end within REFRESH_S plus one read (under 2 s), with no restart and no message between them.

The database may blink. A read that fails keeps the last good rows for `STALE_LIMIT_S` (a revoked key can
then still pass for that long, and the log says the rows are old); past that, or before any read worked, a
row key is refused with 503 (`proxy.serving.access`), never let through. A config file apiKey works throughout.
Meanwhile requests do not wait on the database: a failed read is tried again REFRESH_S later, and a read that
hangs is waited for READ_WAIT_S once, not again until it ends, and is never cut short: a read queued behind slow
work still runs, and its end lets requests wait for the next one. A read that fails on a connection an earlier blink
broke is tried again at once on a new one: an idle front end's first request after an outage finds the rows.
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

from proxy.serving.access import Caller, Denied, identify
from scheduling.outage_log import OutageLog
from scheduling.keys.refusals import RefusalCounts, write_refusals
from scheduling.keys.store import KeyRows, read_rows
from scheduling.metrics import key_refused

REFRESH_S = 0.5
STALE_LIMIT_S = 300.0
# A read slower than this is not waited for: the last good rows answer (and the read finishes behind).
READ_WAIT_S = 1.0

log = logging.getLogger("llamaswap.keys")


class KeyCache:
    """The rows last read, when, and the keys used and refused since (written as `last_used_at` and
    `KeyRefusals` by the next read)."""

    def __init__(self, read: Callable[[Iterable[str]], KeyRows] = read_rows,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._clock = read, clock
        self._refusals = RefusalCounts()
        self._write_due: asyncio.TimerHandle | None = None
        self._rows: KeyRows | None = None
        self._read_at = float("-inf")
        self._tried_at = float("-inf")
        self._failed = False  # the last read failed: the next waits REFRESH_S after it
        self._reading: asyncio.Task | None = None  # current_async's read under way, and when it began
        self._reading_since = 0.0
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
                rows = self._read_once_more_on_a_new_connection(used)
                if refused := self._refusals.take():
                    self._write_refused(refused)
            except Exception as exc:  # the database is away: the last good rows answer while they may
                self._used |= used
                self._failed = True
                self._outage.failed(exc)
                return self.usable()
            self._failed = False
            self._outage.worked()
            self._rows, self._read_at = rows, self._clock()
            return rows

    def _read_once_more_on_a_new_connection(self, used: set[str]) -> KeyRows:
        """The rows; a read that failed on a connection a past blink broke (unseen while no request read) is
        tried again at once on a new one, so a database that is back answers the first request after it."""
        was_open = connection_open()
        try:
            return self._read(used)
        except Exception:
            if not was_open:  # a new connection failed: the database is away
                raise
        drop_broken_connection()
        return self._read(used)

    async def current_async(self) -> KeyRows | None:
        """Fresh rows, waiting at most READ_WAIT_S from the start of the read under way for it. The read itself
        is never cancelled: one queued behind slow database work on Django's thread still runs, and its end lets
        requests wait again (a cancelled one never ran, and every request after it got older rows, then 503)."""
        if (rows := self.fresh()) is not None:
            return rows
        loop = asyncio.get_running_loop()
        reading = self._reading
        if reading is None or reading.done() or reading.get_loop() is not loop:
            # on the thread Django's other synchronous calls use: its connection, its transaction in tests
            reading = self._reading = loop.create_task(sync_to_async(self.current)())
            self._reading_since = loop.time()
        left = READ_WAIT_S - (loop.time() - self._reading_since)
        if left > 0 and (await asyncio.wait({reading}, timeout=left))[0]:
            return reading.result()
        return self.usable()  # the read goes on behind; until it ends nobody waits for it again

    def used(self, name: str) -> None:
        if name:
            self._used.add(name)

    def _write_refused(self, refused) -> None:
        try:
            write_refusals(refused)
        except Exception:
            self._refusals.put_back(refused)
            raise

    def refused(self, name: str, status: int) -> None:
        """Count a refusal at the door of the row key `name` (async callers), in /metrics at once and for its usage
        page by the next read, which is made within REFRESH_S twice over when no request makes one sooner."""
        key_refused(name, status)
        self._refusals.note(name, status, timezone.now())
        if self._write_due is None:
            loop = asyncio.get_running_loop()
            self._write_due = loop.call_later(2 * REFRESH_S, lambda: loop.create_task(self._write_noted()))

    async def _write_noted(self) -> None:
        self._write_due = None
        await self.current_async()
        if self._refusals and self._write_due is None:  # rows read just before took only the earlier ones
            loop = asyncio.get_running_loop()
            self._write_due = loop.call_later(2 * REFRESH_S, lambda: loop.create_task(self._write_noted()))


def connection_open() -> bool:
    return connection.connection is not None


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
