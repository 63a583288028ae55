"""The rows of the requests a distributed front end refuses itself, no worker having heard of them."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone

from scheduling.door.ticket_ids import TicketBlocks, take_block
from scheduling.rows.recorder import Recorder
from scheduling.rows.columns import request_columns
from scheduling.tickets import Refused, RequestState, TicketRequest

# How long a request refused for want of Redis waits for a request id for its row.
ROW_WAIT_S = 2.0

log = logging.getLogger("llamaswap.frontend")


class RefusalRows:
    """The rows of the requests a front end refuses itself, having failed to reach the worker over Redis
    for `REDIS_WAIT_S`: no worker heard of them, so the front end writes them to the shared database,
    in the shape the runtime gives a request it refuses, with ids from the sequence the workers take
    theirs from, through a recorder of its own, which holds them while PostgreSQL is away too. The
    ids are taken when the front end first reaches Redis, so an outage of both finds them in hand; a
    request refused while none can be had (the database away since then) is refused without a row."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._opened: asyncio.Future | None = None  # (recorder, ticket ids), or None without a shared database

    def prepare(self) -> None:
        if self._opened is None or (self._opened.done() and self._opened.exception() is not None):
            self._opened = self._loop.run_in_executor(None, self._open)
            self._opened.add_done_callback(lambda opened: opened.exception())  # logged when a request needs it

    @staticmethod
    def _open() -> tuple[Recorder, TicketBlocks] | None:
        from django.db import connection

        if connection.vendor != "postgresql":  # a front end shares PostgreSQL with its workers; a test may have none
            return None
        ids = TicketBlocks(take_block)
        recorder = Recorder()
        recorder.start()
        return recorder, ids

    async def record(self, request: TicketRequest, arrived_at: float, refusal: Refused) -> int | None:
        """Write the refused request's row; returns its ticket id, or None when none could be had."""
        self.prepare()
        try:
            opened = await asyncio.wait_for(asyncio.shield(self._opened), ROW_WAIT_S)
            if opened is None:
                return None
            recorder, ids = opened
            ticket_id = ids()
        except (Exception, TimeoutError) as exc:
            log.warning("a request refused for want of Redis has no row: no request id could be had (%s)", exc)
            return None
        recorder.create(
            ticket_id, **request_columns(request), max_wait_s=request.max_wait_s, state=RequestState.REJECTED,
            status_code=refusal.status, error=refusal.message,
            arrived_at=datetime.fromtimestamp(arrived_at, timezone.utc), finished_at=datetime.now(timezone.utc),
        )
        return ticket_id

    async def close(self) -> None:
        if self._opened is not None and self._opened.done() and self._opened.exception() is None and self._opened.result():
            await self._loop.run_in_executor(None, self._opened.result()[0].close)
