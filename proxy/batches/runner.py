"""Runs the batches in the serving process: claims each unfinished batch, sends its lines through the
scheduler at most `lines_at_once` at a time, and ends it (completed, expired, cancelled) with its files.

Durable by rows: a line's result is written once, by the runner that claimed it; a line that was being sent
when its process died goes back to pending when its batch is claimed again (`reclaim_lines`), so it runs again,
once. With one serving process (it holds the instance lock) every unfinished batch is its own at start. With
several front ends (distributed mode) a batch is claimed for `CLAIM` and renewed each second: one front end
runs it, and another takes it over once a claim runs out unrenewed."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from proxy.batches import batch_rows, storage
from proxy.batches.line_request import Interrupted, ModelGone, send_line
from proxy.batches.lines import parse_line
from scheduling import batch_metrics
from scheduling.metrics import BATCH_LINES_ENDED
from scheduling.door.outage_log import OutageLog
from scheduling.operating.batch_progress import lines_at_once
from scheduling.rows.connections import on_fresh_connection

log = logging.getLogger("llamaswap.batches")
CLAIM = timedelta(seconds=30)
POLL_S = 1.0
# A line whose model stopped answering (it died, or a worker taking over stopped it) is sent at most this often.
MAX_SENDS = 3
EXPIRED = "This request could not be executed before the completion window expired."
CANCELLED = "This request was not executed because the batch was cancelled."


async def _db(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, on_fresh_connection, fn, *args)


class BatchRunner:
    def __init__(self, service, *, sole: bool) -> None:
        self.service = service
        self.sole = sole
        self.name = f"{socket.gethostname()}:{os.getpid()}:{storage.new_id('')[:8]}"
        self.wake = asyncio.Event()
        self._batches: dict[str, asyncio.Task] = {}
        self._outage = OutageLog(log, "running batches")

    async def run(self) -> None:
        """Claim and run batches until cancelled (the service stopping)."""
        outage = OutageLog(log, "claiming batches (those running go on)")
        try:
            while True:
                try:
                    held = await _db(batch_rows.claim_batches, self.name, self.sole, CLAIM)
                    outage.worked()
                except DatabaseError as exc:
                    outage.failed(exc)
                    held = set(self._batches)
                for batch_id, task in list(self._batches.items()):
                    if batch_id not in held:  # taken over: another runner has it now
                        task.cancel()
                for batch_id in held - set(self._batches):
                    task = asyncio.get_running_loop().create_task(self._run_batch(batch_id))
                    self._batches[batch_id] = task
                    task.add_done_callback(lambda _, b=batch_id: self._batches.pop(b, None))
                try:
                    await asyncio.wait_for(self.wake.wait(), POLL_S)
                except TimeoutError:
                    pass
                self.wake.clear()
        finally:
            for task in self._batches.values():
                task.cancel()

    async def _run_batch(self, batch_id: str) -> None:
        try:
            await self._run(batch_id)
            self._outage.worked()
        except asyncio.CancelledError:
            raise
        except DatabaseError as exc:  # taken up again at the next poll, from its rows
            self._outage.failed(exc)
        except Exception:
            log.exception("batch %s: unexpected failure; it is tried again", batch_id)

    async def _run(self, batch_id: str) -> None:
        status, *_ = await _db(batch_rows.batch_state, batch_id)
        if status == "validating":
            await _db(batch_rows.validate, batch_id, self.name)
        reclaimed = await _db(batch_rows.reclaim_lines, batch_id)
        if reclaimed:
            log.info("batch %s: %d line(s) cut short by a stop run again", batch_id, reclaimed)
        in_flight: set[asyncio.Task] = set()
        try:
            final = await self._send_lines(batch_id, in_flight, _AtModel())
        finally:
            for task in in_flight:
                task.cancel()
        if final is not None:
            await _db(batch_rows.finalize, batch_id, self.name, final)
            log.info("batch %s: %s", batch_id, final)

    async def _send_lines(self, batch_id: str, in_flight: set[asyncio.Task], at_model: _AtModel) -> str | None:
        """Send the lines until none is left; returns how the batch ends (None: not this runner's to end).

        A line counts against `lines_at_once` while it is at the model, not while its result is written: the next
        line is claimed and sent as soon as a slot frees, so the model does not idle through the database writes."""
        loop = asyncio.get_running_loop()
        checked = None
        while True:
            if checked is None or loop.time() - checked >= POLL_S or self.wake.is_set() or not in_flight:
                status, expires_at, model, priority, input_file, key = await _db(batch_rows.batch_state, batch_id)
                checked = loop.time()
                if status not in ("in_progress", "cancelling", "finalizing"):
                    return None
                ending = None
                if status == "cancelling":
                    ending = ("cancelled", "batch_cancelled", CANCELLED)
                elif status == "in_progress" and timezone.now() >= expires_at:
                    ending = ("expired", "batch_expired", EXPIRED)
            if ending is None and status == "in_progress":
                room = lines_at_once(self.service.config, model) - len(at_model.lines)
                for row in await _db(batch_rows.claim_lines, batch_id, self.name, room) if room > 0 else []:
                    at_model.lines.add(row[0])
                    in_flight.add(loop.create_task(self._send(input_file, row, priority, key, at_model)))
            if not in_flight:  # every line sent has ended
                if ending is None:
                    return "completed"
                never_sent = await _db(batch_rows.end_pending, batch_id, ending[1], ending[2])
                BATCH_LINES_ENDED.labels("failed").inc(never_sent)
                return ending[0]
            freed = loop.create_task(at_model.freed.wait())
            try:
                done, _ = await asyncio.wait({*in_flight, freed}, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                freed.cancel()
            at_model.freed.clear()
            done.discard(freed)
            in_flight -= done
            for task in done:
                failure = None if task.cancelled() else task.exception()
                if isinstance(failure, Interrupted):
                    return None  # the service is stopping: the rest runs after its restart
                if failure is not None:  # its result unwritten: the batch is taken up again from its rows
                    log.error("batch %s: a line failed: %r; taking the batch up again", batch_id, failure)
                    return None

    async def _send(self, input_file: str, row: tuple, priority: int, key, at_model: _AtModel) -> None:
        pk, number, custom_id, offset, length = row
        try:
            raw = await loop_read(input_file, offset, length)
            line = parse_line(number, raw.rstrip(b"\r\n"))
            succeeded, result = await send_line(self.service, custom_id, line.url, line.body, priority, key)
        except ModelGone as gone:
            at_model.left(pk)
            if await _db(batch_rows.send_again, pk, self.name, MAX_SENDS):
                log.warning("batch line %s: %s; it runs again", custom_id, gone)
                self.wake.set()
                return
            succeeded, result = False, gone.result
        finally:
            at_model.left(pk)
        if await _db(batch_rows.record_result, pk, self.name, succeeded, result):
            BATCH_LINES_ENDED.labels("succeeded" if succeeded else "failed").inc()


class _AtModel:
    """The lines of a batch sent and not yet answered, and an event set each time one is answered."""

    def __init__(self) -> None:
        self.lines: set[int] = set()
        self.freed = asyncio.Event()

    def left(self, pk: int) -> None:
        if pk in self.lines:
            self.lines.discard(pk)
            self.freed.set()


async def loop_read(file_id: str, offset: int, length: int) -> bytes:
    return await asyncio.get_running_loop().run_in_executor(None, storage.read_range, file_id, offset, length)


RUNNING: list[BatchRunner] = []  # this process's runner, once the serve command started it


def start(service) -> asyncio.Task:
    """Run this process's batches (`llamaswap serve`): the only runner when the scheduler runs here."""
    batch_runner = BatchRunner(service, sole=service.runtime is not None)
    batch_metrics.export()
    RUNNING[:] = [batch_runner]
    return asyncio.get_running_loop().create_task(batch_runner.run())


def wake() -> None:
    """Look at the batches now (one was created or cancelled here), not at the next poll."""
    for batch_runner in RUNNING:
        batch_runner.wake.set()
