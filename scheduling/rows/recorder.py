"""Write-behind persistence of request rows.

The event loop must never wait for the database while tokens stream, so it only
hands row changes to this recorder; one thread owns a long-lived connection and
writes them in batches, one transaction per batch. Ordering is kept: changes are
applied in the order they were recorded, so a row always ends in the last state
it was given.

No row is lost because of another: every value is made to fit its column before it
is written (a request controls its path, method and priority; a model server its
token counts), and a batch the database refuses is written again row by row, so
only a change that really cannot be stored is lost, and logged.

A database that is unreachable (or locked) loses nothing: the batch is held, later changes
queue behind it in order, and it is written again, with backoff and a fresh connection, until
the database answers. The outage is logged once when it starts and once when it ends. Memory
is bounded by `backlog_limit` waiting changes (LLAMASWAP_RECORDER_BACKLOG, default 50 000:
about a minute of a few hundred requests a second, tens of MB); at the bound the runtime
refuses new requests with 503 rather than serve them unrecorded, while running ones go on.
Changes held in memory die with the process if it is killed during an outage.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("llamaswap.recorder")

_BATCH_LIMIT = 1000
_RETRIES = 5
_LINGER_S = 0.02
_BACKLOG_LIMIT = 50_000
_OUTAGE_BACKOFF_MAX_S = 2.0


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
    start_ticks: int | None
    marker: str


@dataclass
class _ProcessStopped:
    marker: str


@dataclass
class _Barrier:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class Recorder:
    """Queues row changes from the event loop; a daemon thread writes them."""

    def __init__(self, backlog_limit: int | None = None) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.backlog_limit = backlog_limit or int(os.environ.get("LLAMASWAP_RECORDER_BACKLOG") or _BACKLOG_LIMIT)
        self._thread = threading.Thread(target=self._run, name="llamaswap-recorder", daemon=True)
        self._started = False
        self._urgent = threading.Event()  # set when a change must not wait for the linger

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    # -- producers (cheap, non-blocking, safe from any thread) --------------------------------
    def create(self, ticket_id: int, **fields: Any) -> None:
        self._queue.put(_Create(ticket_id, fields))

    def update(self, ticket_id: int, **fields: Any) -> None:
        self._queue.put(_Update(ticket_id, fields))

    def process_started(
        self, model: str, pid: int, pgid: int, cmdline: list[str], *, start_ticks: int | None, marker: str
    ) -> None:
        """A model process group now exists; `marker` names it until `process_stopped(marker)`.

        Written ahead of row changes and without the batching linger: the service may be
        killed right after the spawn, and only the record lets the next run stop the group.
        """
        self._queue.put(_ProcessStarted(model, pid, pgid, list(cmdline), start_ticks, marker))
        self._urgent.set()

    def process_stopped(self, marker: str) -> None:
        self._queue.put(_ProcessStopped(marker))

    def backlogged(self) -> bool:
        """Whether as many changes wait as memory may hold (the database has been away a while)."""
        return self._queue.qsize() >= self.backlog_limit

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
                # holding the GIL against the event loop that streams tokens. A process record
                # cuts it short.
                self._urgent.wait(_LINGER_S)
                self._urgent.clear()
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
        error = _attempt(batch)
        if error is not None and _transient(error):
            error = self._outlast_outage(batch, error)
        if error is None:
            return
        # The database refused something in the batch: write each row on its own, so only the
        # change it cannot take is lost.
        for label, part in _separately(batch):
            error = _attempt(part)
            if error is not None:
                log.error("could not record %s (%s); that change is lost", label, _reason(error))


    def _outlast_outage(self, batch: list, error: Exception) -> Exception | None:
        """Write `batch` again until the database is back; later changes wait behind it, in order.
        Returns None, or an error the database gave for a value (not for being away)."""
        started = time.monotonic()
        log.error("the request history database is unreachable (%s); holding changes in order until it is "
                  "back (at most %d waiting, then new requests are refused with 503)", _reason(error),
                  self.backlog_limit)
        delay = 0.1
        while error is not None and _transient(error):
            time.sleep(delay)
            delay = min(delay * 2, _OUTAGE_BACKOFF_MAX_S)
            error = _attempt(batch)
        late = sum(1 for item in batch if not isinstance(item, _Barrier) and item is not _STOP)
        log.warning("the request history database is back after %.1f s; %d changes written late",
                    time.monotonic() - started, late + self._queue.qsize())
        return error


def _attempt(batch: list) -> Exception | None:
    """Write `batch` in one transaction, retrying while the database is unavailable; the final error, or None."""
    from django.db import connection

    attempts = 0
    while True:
        try:
            _write_batch(batch)
            return None
        except Exception as exc:  # a write failure must not kill the recorder
            connection.close()  # the next write reconnects, in case the connection itself broke
            attempts += 1
            if not _transient(exc) or attempts == _RETRIES:
                return exc
            time.sleep(0.05 * 2 ** (attempts - 1))


def _transient(error: Exception) -> bool:
    """Whether a write may succeed when tried again (locked, disconnected), unlike a value the database refuses."""
    from django.db import InterfaceError, OperationalError

    return isinstance(error, (OperationalError, InterfaceError))


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _separately(batch: list) -> list[tuple[str, list]]:
    """The batch as parts that can be written alone, in order: one per request row (its creation and
    updates together), one per other change."""
    parts: dict[object, tuple[str, list]] = {}
    for index, item in enumerate(batch):
        if isinstance(item, (_Create, _Update)):
            parts.setdefault(item.ticket_id, (f"request #{item.ticket_id}", []))[1].append(item)
        elif not isinstance(item, _Barrier) and item is not _STOP:
            parts[("change", index)] = (repr(item), [item])
    return list(parts.values())


def _write_batch(batch: list) -> None:
    from django.db import transaction

    from scheduling.models import QueuedRequest

    creates: dict[int, dict[str, Any]] = {}
    updates: dict[int, dict[str, Any]] = {}
    for item in batch:
        if isinstance(item, _Create):
            creates[item.ticket_id] = dict(item.fields)
        elif isinstance(item, _Update):
            target = creates if item.ticket_id in creates else updates
            target.setdefault(item.ticket_id, {}).update(item.fields)
    if any(isinstance(item, (_ProcessStarted, _ProcessStopped)) for item in batch):
        with transaction.atomic():  # committed first: a row the database refuses cannot take them along
            _write_process_records(batch)
    if not (creates or updates):
        return
    with transaction.atomic():
        if creates:
            _insert_new_rows(QueuedRequest, creates)
        _update_rows(QueuedRequest, updates)


def _write_process_records(batch: list) -> None:
    """The batch's process records, in order. Idempotent (keyed by marker), as a retry may write them again."""
    from scheduling.models import ModelProcessRecord

    for item in batch:
        if isinstance(item, _ProcessStarted):
            # Fitted like request rows: a record refused for a 300-character model id would leave an orphan.
            ModelProcessRecord.objects.update_or_create(marker=item.marker, defaults=storable(ModelProcessRecord, {
                "model": item.model, "pid": item.pid, "pgid": item.pgid, "cmdline": item.cmdline,
                "start_ticks": item.start_ticks,
            }))
        elif isinstance(item, _ProcessStopped):
            ModelProcessRecord.objects.filter(marker=item.marker).delete()


def _insert_rows(model, rows: list) -> None:
    """The rows as `bulk_create` inserts them (every column, each value as the field prepares it for saving), with
    one prepared INSERT for the batch: the ORM would compile each of a row's fifty-odd values into SQL again."""
    from django.db import connection

    columns = model._meta.concrete_fields
    _execute_insert(model, [[column.get_db_prep_save(column.pre_save(row, True), connection) for column in columns]
                            for row in rows])


def _execute_insert(model, values: list[list[Any]]) -> None:
    """One prepared INSERT of every column of `model`, run for each row of `values` (in column order)."""
    from django.db import connection

    columns = model._meta.concrete_fields
    quote = connection.ops.quote_name
    names = ", ".join(quote(column.column) for column in columns)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {quote(model._meta.db_table)} ({names}) VALUES ({', '.join(['%s'] * len(columns))})",
            values,
        )


def _insert_new_rows(model, creates: dict[int, dict[str, Any]]) -> None:
    """New rows by id, their fields fitted (`storable`), each value prepared for saving as `_insert_rows` prepares
    a model instance's, but read straight from the fields (or the column's default) where every column of `model`
    allows it (`_plain_columns`): building an instance of fifty-odd fields a row was most of this thread's work."""
    rows = [(tid, storable(model, fields)) for tid, fields in creates.items()]
    plain = _plain_columns(model)
    if plain is None or not all(plain.names.issuperset(fields) for _, fields in rows):
        # A name the model lacks (or the id among the fields): the model instance refuses it, as it always did.
        _insert_rows(model, [model(id=tid, **fields) for tid, fields in rows])
        return
    values = []
    for tid, fields in rows:
        row = []
        for name, default, prepare in plain.columns:
            if name == plain.pk:
                value = tid
            else:
                value = fields[name] if name in fields else default()
            row.append(None if value is None else prepare(value))
        values.append(row)
    _execute_insert(model, values)


@dataclass(frozen=True)
class _PlainColumns:
    """`_plain_columns`: each column's field name, default and preparation for saving, in table order; the field
    names a row's fields may have (the primary key's not among them: it is the row's id)."""

    columns: tuple[tuple[str, Any, Any], ...]
    names: frozenset[str]
    pk: str


# Field classes whose pre_save reads the attribute as it is and whose preparation for saving leaves None as None
# (NULL): a row of these can be written from its values without a model instance.
_PLAIN_FIELDS = ("AutoField", "BigAutoField", "BigIntegerField", "BooleanField", "CharField", "FloatField",
                 "IntegerField", "PositiveIntegerField", "SmallIntegerField", "TextField")


@functools.cache
def _plain_columns(model) -> _PlainColumns | None:
    """How `_insert_new_rows` writes rows of `model` without an instance: None when a column is of a class not
    known to need none (`_PLAIN_FIELDS`; a date column counts only without auto_now and auto_now_add)."""
    from django.db import connection, models

    columns = []
    for column in model._meta.concrete_fields:
        kind = type(column)
        plain = kind.__module__ == models.Field.__module__ and kind.__name__ in _PLAIN_FIELDS
        dated = kind in (models.DateTimeField, models.DateField) and not (column.auto_now or column.auto_now_add)
        if not (plain or dated) or column.name != column.attname:
            return None
        prepare = functools.partial(column.get_db_prep_save, connection=connection)
        columns.append((column.name, column.get_default, prepare))
    pk = model._meta.pk.name
    return _PlainColumns(tuple(columns), frozenset(name for name, _, _ in columns) - {pk}, pk)


def _update_rows(model, updates: dict[int, dict[str, Any]]) -> None:
    """One prepared UPDATE per set of changed columns, run for every row that changes those columns.

    Rows change in a few recurring shapes (dispatched, finished, ...), so a batch needs a handful of
    statements instead of one ORM query build per row — the ORM's SQL compilation is what this
    thread would otherwise spend its time (and the event loop's GIL) on.
    """
    from django.db import connection

    shapes: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
    for tid, fields in updates.items():
        shapes.setdefault(tuple(sorted(fields)), []).append((tid, storable(model, fields)))
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


def storable(model, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with each value made to fit its column of `model`.

    Text loses what no database column can hold (NUL, unpaired surrogates) and is cut to the
    column's max_length; integers are clamped to the column's range; a float that is not finite
    (or too large to be one) is stored as unknown (null). The scheduler keeps the exact values.
    """
    fitters = _fitters(model)
    return {
        name: value if value is None or name not in fitters else fitters[name](value)
        for name, value in fields.items()
    }


@functools.cache
def _fitters(model) -> dict[str, Any]:
    """For each column of `model` that can refuse a value, a function that makes a value fit it."""
    from django.db import connection, models

    fitters: dict[str, Any] = {}
    for column in model._meta.concrete_fields:
        if column.primary_key:
            continue  # a clamped id would write over another row
        if isinstance(column, (models.CharField, models.TextField)):
            fitters[column.name] = functools.partial(_fit_text, limit=column.max_length)
        elif isinstance(column, models.IntegerField):
            low, high = connection.ops.integer_field_range(column.get_internal_type())
            fitters[column.name] = functools.partial(_fit_integer, low=low, high=high)
        elif isinstance(column, models.FloatField):
            fitters[column.name] = _fit_float
    return fitters


def _fit_text(value: Any, limit: int | None) -> Any:
    if not isinstance(value, str):
        return value
    if not value.isascii():
        value = value.encode("utf-8", "replace").decode("utf-8")  # an unpaired surrogate has no encoding
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL
    return value[:limit] if limit is not None and len(value) > limit else value


def _fit_integer(value: Any, low: int | None, high: int | None) -> Any:
    if not isinstance(value, int):
        return value
    if low is not None and value < low:
        return low
    if high is not None and value > high:
        return high
    return value


def _fit_float(value: Any) -> Any:
    if not isinstance(value, (int, float)):
        return value
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the largest float
        return None
    return value if math.isfinite(value) else None
