"""Runs the batches in the serving process: claims each unfinished batch, sends its lines through the
scheduler at most `lines_at_once` at a time, and ends it (completed, expired, cancelled) with its files.

Durable by rows: a line's result is written once, by the runner that claimed it; a line that was being sent
when its process died goes back to pending when its batch is claimed again (`reclaim_lines`), so it runs again,
once, and so do the lines claimed ahead and not yet sent (a kill -9 leaves their claim counted as one send). With one serving process (it holds the instance lock) every unfinished batch is its own at start. With
several front ends (distributed mode) a batch is claimed for `CLAIM` and renewed each second: one front end
runs it, and another takes it over once a claim runs out unrenewed."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.db import DatabaseError
from django.utils import timezone

from proxy.batches import batch_rows, storage
from proxy.batches.line_quota import Stopped
from proxy.batches.line_request import Interrupted, ModelGone, send_line
from proxy.batches.lines import parse_line
from proxy.serving.disk_full import is_disk_full
from scheduling import batch_metrics
from scheduling.metrics import BATCH_LINES_ENDED
from scheduling.outage_log import OutageLog
from scheduling.operating.batch_progress import lines_at_once
from scheduling.rows.connections import on_kept_connection

log = logging.getLogger("llamaswap.batches")
CLAIM = timedelta(seconds=30)
POLL_S = 1.0
# A line whose model stopped answering (it died, or a worker taking over stopped it) is sent at most this often.
MAX_SENDS = 3
# Lines claimed and read ahead of those at the model, beyond one slot's worth: a claim is one transaction for them all.
AHEAD = 16
EXPIRED = "This request could not be executed before the completion window expired."
CANCELLED = "This request was not executed because the batch was cancelled."
FILE_GONE = "This request was not executed because the batch failed: its input file {} is gone."
# A batch whose run fails unexpectedly is taken up again after 1 s, then 2, 4… at most this far apart while it fails.
BACKOFF_MAX_S = 60.0


# The runner's own threads: each keeps its database connection between steps (`on_kept_connection`).
_ROWS = ThreadPoolExecutor(4, "batch-rows")


async def _db(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_ROWS, on_kept_connection, fn, *args)


class BatchRunner:
    def __init__(self, service, *, sole: bool) -> None:
        self.service = service
        self.sole = sole
        self.name = f"{socket.gethostname()}:{os.getpid()}:{storage.new_id('')[:8]}"
        self.wake = asyncio.Event()
        # Counts the wakes: a batch's lines are not sent past one until its status has been read since (`_Lines.seen`).
        self.woken = 0
        self._batches: dict[str, asyncio.Task] = {}
        self._failures: dict[str, tuple[int, str]] = {}  # batch: its unexpected failures in a row, and the last's cause
        self._outage = OutageLog(log, "running batches")

    async def run(self) -> None:
        """Claim and run batches until cancelled (the service stopping)."""
        outage = OutageLog(log, "claiming batches (those running go on)")
        try:
            if removed := await asyncio.get_running_loop().run_in_executor(None, storage.remove_stale_partials):
                log.info("removed %d file(s) left half-written over %d s ago", removed, storage.STALE_PARTIAL_S)
        except OSError as exc:
            log.warning("could not look for files left half-written: %s", exc)
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
            if self._failures.pop(batch_id, None):
                log.info("batch %s: runs again", batch_id)
        except asyncio.CancelledError:
            self._failures.pop(batch_id, None)
            raise
        except DatabaseError as exc:  # taken up again at the next poll, from its rows
            self._outage.failed(exc)
        except Exception as exc:  # the task stays (the batch is not taken up again) until its back-off has passed
            await self._back_off(batch_id, self._failed(batch_id, exc))

    async def _back_off(self, batch_id: str, delay: float) -> None:
        """Wait `delay` before running a failing batch again, but end it meanwhile once it is cancelled or past its
        window: its run may fail again before it reads either. Looked at each poll, and at once on a wake."""
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        while True:
            try:
                if await self._end_if_due(batch_id):
                    return
            except Exception as exc:  # noqa: BLE001 - the same failure, as likely as not: the back-off goes on
                log.debug("batch %s: could not end it yet (%s)", batch_id, exc)
            left, woken = until - loop.time(), self.woken
            if left <= 0:
                return
            deadline = loop.time() + min(left, POLL_S)
            while self.woken == woken and (rest := deadline - loop.time()) > 0:
                if self.wake.is_set():  # an earlier wake the main loop has not cleared yet: not this wait's
                    await asyncio.sleep(min(rest, 0.05))
                    continue
                try:
                    await asyncio.wait_for(self.wake.wait(), rest)
                except TimeoutError:
                    pass

    async def _end_if_due(self, batch_id: str) -> bool:
        """End a batch whose run failed, when it is cancelled or its window has passed: the lines it held, and
        those never sent, end failed; the results so far are kept. True when it ended."""
        status, expires_at, *_ = await _db(batch_rows.batch_state, batch_id)
        if status == "cancelling":
            final, code, message = "cancelled", "batch_cancelled", CANCELLED
        elif status in ("validating", "in_progress") and timezone.now() >= expires_at:
            final, code, message = "expired", "batch_expired", EXPIRED
        else:
            return False
        await _db(batch_rows.reclaim_lines, batch_id)
        BATCH_LINES_ENDED.labels("failed").inc(await _db(batch_rows.end_pending, batch_id, code, message))
        await _db(batch_rows.finalize, batch_id, self.name, final)
        self._failures.pop(batch_id, None)
        log.info("batch %s: %s while its run was failing", batch_id, final)
        return True

    def _failed(self, batch_id: str, exc: Exception) -> float:
        """How long to wait before taking the batch up again: doubling while it fails, logged once per cause."""
        count, last = self._failures.get(batch_id, (0, ""))
        cause = f"{type(exc).__name__}: {exc}"
        self._failures[batch_id] = (count + 1, cause)
        delay = min(2.0 ** count, BACKOFF_MAX_S)
        if cause != last and is_disk_full(exc):  # finalizing: the results are rows, only the files wait for room
            log.error("batch %s: the disk is full writing its output and error files (%s); its results are kept and "
                      "the files written once there is room, tried again in %g s, then less often (at most every "
                      "%g s)", batch_id, cause, delay, BACKOFF_MAX_S)
        elif cause != last:
            log.error("batch %s: unexpected failure (%s); taken up again in %g s, then less often (at most every "
                      "%g s) while it fails", batch_id, cause, delay, BACKOFF_MAX_S, exc_info=exc)
        return delay

    async def _run(self, batch_id: str) -> None:
        status, *_ = await _db(batch_rows.batch_state, batch_id)
        if status == "validating":
            await _db(batch_rows.validate, batch_id, self.name)
        reclaimed = await _db(batch_rows.reclaim_lines, batch_id)
        if reclaimed:
            log.info("batch %s: %d line(s) cut short by a stop run again", batch_id, reclaimed)
        lines = _Lines()
        try:
            final = await self._send_lines(batch_id, lines)
        except Exception:  # none more is sent; those at the model end and keep their results, not sent again later
            lines.stop.set()
            await _ended(lines.in_flight)
            raise
        finally:
            for task in lines.in_flight:
                task.cancel()
            if lines.ahead:  # claimed, never sent: pending again, for whoever runs the batch next
                await _db(batch_rows.give_back, [pk for (pk, *_), _ in lines.ahead], self.name)
                lines.ahead.clear()
        if final is not None:
            if final == "failed":
                await _db(batch_rows.note_errors, batch_id, self.name, lines.errors)
            await _db(batch_rows.finalize, batch_id, self.name, final)
            log.info("batch %s: %s", batch_id, final)

    async def _send_lines(self, batch_id: str, lines: _Lines) -> str | None:
        """Send the lines until none is left; returns how the batch ends (None: not this runner's to end).

        A line counts against `lines_at_once` while it is at the model, not while its result is written, and the
        next lines are claimed and read ahead (`AHEAD`) while those sent are at the model: as soon as a slot frees,
        a line is sent, so the model does not idle through the database's work."""
        loop = asyncio.get_running_loop()
        checked, drained, broken = None, False, None
        while True:
            if (checked is None or loop.time() - checked >= POLL_S or lines.seen != self.woken
                    or not (lines.in_flight or lines.ahead)):
                lines.seen = self.woken  # first: a wake while the status is read makes it read again
                status, expires_at, model, priority, input_file, key = await _db(batch_rows.batch_state, batch_id)
                checked = loop.time()
                ending = broken
                if status == "cancelling":
                    ending = ("cancelled", "batch_cancelled", CANCELLED)
                elif status == "in_progress" and timezone.now() >= expires_at:
                    ending = ("expired", "batch_expired", EXPIRED)
                if ending is not None or status != "in_progress":
                    lines.stop.set()  # lines waiting for their key's quota are not sent: pending again
                    if lines.ahead:
                        await _db(batch_rows.give_back, [pk for (pk, *_), _ in lines.ahead], self.name)
                        lines.ahead.clear()
                if status not in ("in_progress", "cancelling", "finalizing"):
                    return None
            if ending is None and status == "in_progress":
                at_once = lines_at_once(self.service.config, model)
                while lines.ahead and len(lines.at_model) < at_once:
                    row, raw = lines.ahead.popleft()
                    lines.at_model.add(row[0])
                    lines.in_flight.add(loop.create_task(self._send(row, raw, priority, key, lines)))
                if len(lines.ahead) <= at_once and not drained:
                    claimed = await _db(batch_rows.claim_lines, batch_id, self.name, at_once + AHEAD - len(lines.ahead))
                    try:
                        raws = claimed and await loop.run_in_executor(
                            None, storage.read_ranges, input_file, [(offset, length) for *_, offset, length in claimed])
                    except FileNotFoundError:  # deleted, or gone from the disk: the batch fails, what ran is kept
                        await _db(batch_rows.give_back, [pk for pk, *_ in claimed], self.name)
                        log.error("batch %s: its input file %s is gone; it fails once its lines at the model end",
                                  batch_id, input_file)
                        broken = ("failed", "batch_failed", FILE_GONE.format(input_file))
                        lines.errors = [{"code": "invalid_file", "message": f"input file {input_file} is gone: "
                                         "its lines not yet sent were not run", "param": "input_file_id", "line": None}]
                        checked = None  # ends it now
                        continue
                    lines.ahead.extend(zip(claimed, raws))
                    drained = not claimed
                    if lines.ahead and len(lines.at_model) < at_once:
                        continue  # send them now
            if not lines.in_flight:  # every line sent has ended
                if ending is None:
                    return "completed"
                never_sent = await _db(batch_rows.end_pending, batch_id, ending[1], ending[2])
                BATCH_LINES_ENDED.labels("failed").inc(never_sent)
                return ending[0]
            freed = loop.create_task(lines.freed.wait())
            try:
                done, _ = await asyncio.wait({*lines.in_flight, freed}, timeout=POLL_S,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                freed.cancel()
            lines.freed.clear()
            done.discard(freed)
            lines.in_flight -= done
            for task in done:
                failure = None if task.cancelled() else task.exception()
                if isinstance(failure, Interrupted):
                    return None  # the service is stopping: the rest runs after its restart
                if failure is not None:  # its result unwritten: the batch is taken up again from its rows
                    raise failure
                if not task.cancelled() and task.result():  # a line put back to pending: claim again
                    drained = False

    async def _send(self, row: tuple, raw: bytes, priority: int, key, lines: _Lines) -> bool:
        """Send one claimed line and write its result; True when it went back to pending to run again."""
        pk, number, custom_id, _, _ = row
        # Shown as running from here (it holds one of the batch's places); not waited for: the send goes on at once.
        asyncio.ensure_future(_db(batch_rows.mark_sent, pk, self.name)).add_done_callback(_shown_or_not)
        try:
            line = parse_line(number, raw.rstrip(b"\r\n"))
            succeeded, result = await send_line(self.service, custom_id, line.url, line.body, priority, key,
                                                lines.stop)
        except Stopped:
            await _db(batch_rows.give_back, [pk], self.name)
            return False
        except ModelGone as gone:
            lines.left(pk)
            if await _db(batch_rows.send_again, pk, self.name, MAX_SENDS):
                log.warning("batch line %s: %s; it runs again", custom_id, gone)
                return True
            succeeded, result = False, gone.result
        finally:
            lines.left(pk)
        if await _db(batch_rows.record_result, pk, self.name, succeeded, result):
            BATCH_LINES_ENDED.labels("succeeded" if succeeded else "failed").inc()
        return False


async def _ended(tasks: set[asyncio.Task]) -> None:
    """Wait for `tasks` to end, whatever each ends with (a line's failure is the batch's, already raised)."""
    while tasks:
        done, _ = await asyncio.wait(tasks)
        tasks -= done
        for task in done:
            if not task.cancelled():
                task.exception()


def _shown_or_not(marked: asyncio.Future) -> None:
    """A line's flip to running only shows progress: one lost to a database blink is left, not raised."""
    if not marked.cancelled():
        marked.exception()


class _Lines:
    """A batch's lines in this runner: claimed and read but not yet sent (`ahead`, in file order), sent and not yet
    answered (`at_model`, with `freed` set each time one is answered; a line waiting for its key's quota counts),
    and the tasks not yet ended (`in_flight`); `stop` is set once no more may be sent (the batch is ending)."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.ahead: deque[tuple[tuple, bytes]] = deque()
        self.at_model: set[int] = set()
        self.freed = asyncio.Event()
        self.in_flight: set[asyncio.Task] = set()
        self.seen = -1  # the runner's wake count when the batch's status was last read
        self.errors: list[dict] = []  # why the batch fails, when it does

    def left(self, pk: int) -> None:
        if pk in self.at_model:
            self.at_model.discard(pk)
            self.freed.set()


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
        batch_runner.woken += 1
        batch_runner.wake.set()
