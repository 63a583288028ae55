"""Write-behind persistence of request rows.

The event loop must never wait for the database while tokens stream, so it only
hands row changes to this recorder; one thread owns a long-lived connection and
writes them in batches, one transaction per batch. Ordering is kept: changes are
applied in the order they were recorded, so a row always ends in the last state
it was given.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("llamaswap.recorder")

_BATCH_LIMIT = 1000
_RETRIES = 5
_LINGER_S = 0.02


@dataclass
class _Create:
    ticket_id: int
    fields: dict[str, Any]


@dataclass
class _Update:
    ticket_id: int
    fields: dict[str, Any]


@dataclass
class _ProcessStarted:
    model: str
    pid: int
    pgid: int
    cmdline: list[str]


@dataclass
class _ProcessStopped:
    pid: int


@dataclass
class _Barrier:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class Recorder:
    """Queues row changes from the event loop; a daemon thread writes them."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llamaswap-recorder", daemon=True)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    # -- producers (cheap, non-blocking, safe from any thread) --------------------------------
    def create(self, ticket_id: int, **fields: Any) -> None:
        self._queue.put(_Create(ticket_id, fields))

    def update(self, ticket_id: int, **fields: Any) -> None:
        self._queue.put(_Update(ticket_id, fields))

    def process_started(self, model: str, pid: int, pgid: int, cmdline: list[str]) -> None:
        self._queue.put(_ProcessStarted(model, pid, pgid, list(cmdline)))

    def process_stopped(self, pid: int) -> None:
        self._queue.put(_ProcessStopped(pid))

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything recorded before this call is written (tests, shutdown)."""
        if not self._started:
            return True
        barrier = _Barrier()
        self._queue.put(barrier)
        return barrier.done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        if self._started and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    # -- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        from django.db import connection

        try:
            while True:
                batch = [self._queue.get()]
                # Linger briefly so a burst becomes one transaction: fewer commits, and less time
                # holding the GIL against the event loop that streams tokens.
                time.sleep(_LINGER_S)
                while len(batch) < _BATCH_LIMIT:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(item is _STOP for item in batch)
                self._write(batch)
                for item in batch:
                    if isinstance(item, _Barrier):
                        item.done.set()
                if stop:
                    return
        finally:
            connection.close()

    def _write(self, batch: list) -> None:
        for attempt in range(_RETRIES):
            try:
                _write_batch(batch)
                return
            except Exception:  # a write failure must not kill the recorder; retry, then report
                from django.db import connection

                connection.close()  # the next attempt reconnects, in case the connection itself broke
                if attempt == _RETRIES - 1:
                    log.exception("could not record %d row changes; they are lost", len(batch))
                    return
                time.sleep(0.05 * 2**attempt)


def _write_batch(batch: list) -> None:
    from django.db import transaction

    from scheduling.models import ModelProcessRecord, QueuedRequest

    creates: dict[int, dict[str, Any]] = {}
    updates: dict[int, dict[str, Any]] = {}
    for item in batch:
        if isinstance(item, _Create):
            creates[item.ticket_id] = dict(item.fields)
        elif isinstance(item, _Update):
            target = creates if item.ticket_id in creates else updates
            target.setdefault(item.ticket_id, {}).update(item.fields)
    with transaction.atomic():
        if creates:
            QueuedRequest.objects.bulk_create(
                [QueuedRequest(id=tid, **fields) for tid, fields in creates.items()]
            )
        _update_rows(QueuedRequest, updates)
        for item in batch:
            if isinstance(item, _ProcessStarted):
                ModelProcessRecord.objects.create(
                    model=item.model, pid=item.pid, pgid=item.pgid, cmdline=item.cmdline
                )
            elif isinstance(item, _ProcessStopped):
                ModelProcessRecord.objects.filter(pid=item.pid).delete()


def _update_rows(model, updates: dict[int, dict[str, Any]]) -> None:
    """One prepared UPDATE per set of changed columns, run for every row that changes those columns.

    Rows change in a few recurring shapes (dispatched, finished, ...), so a batch needs a handful of
    statements instead of one ORM query build per row — the ORM's SQL compilation is what this
    thread would otherwise spend its time (and the event loop's GIL) on.
    """
    from django.db import connection

    shapes: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    for tid, fields in updates.items():
        shapes.setdefault(tuple(sorted(fields)), []).append((tid, fields))
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    pk = quote(model._meta.pk.column)
    with connection.cursor() as cursor:
        for names, rows in shapes.items():
            columns = [model._meta.get_field(name) for name in names]
            assignments = ", ".join(f"{quote(column.column)} = %s" for column in columns)
            cursor.executemany(
                f"UPDATE {table} SET {assignments} WHERE {pk} = %s",
                [[column.get_db_prep_save(fields[column.name], connection) for column in columns] + [tid]
                 for tid, fields in rows],
            )
