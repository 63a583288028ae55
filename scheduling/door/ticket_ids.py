"""Ticket ids for scheduler workers that share one database (one worker per GPU box).

A ticket id is its row's primary key, handed out on the event loop as a request arrives. Each
worker takes blocks of ids from a PostgreSQL sequence, so no two hand out the same one; the next
block is fetched in a thread while half of the current one is left, so the event loop only waits
on the database when a burst outruns that fetch.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from django.db import connection

from scheduling.tickets import Refused

log = logging.getLogger("llamaswap.tickets")

SEQUENCE = "llamaswap_ticket_blocks"
BLOCK = 100
# How long a request waits for a block the database is slow to give before it is refused.
WAIT_S = 1.0


def _unreachable(what: str) -> Refused:
    return Refused(503, "request_history_unreachable",
                    f"the request history database {what} when asked for request ids; retry later", 5)


class TicketBlocks:
    """Failure model: a block fetch that fails (the database away), the prefetch included, is tried
    afresh by the next request that needs it; one that takes longer than `wait_s` is left running for the next request to wait on.
    Either way this request is refused with a 503 rather than stall the event loop, and with it
    every stream and heartbeat this worker serves, for as long as the database is away."""

    def __init__(self, take_block: Callable[[], int], size: int = BLOCK, wait_s: float = WAIT_S) -> None:
        self._take = take_block
        self._size = size
        self._wait_s = wait_s
        self._fetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llamaswap-ticket-ids")
        self._next, self._end = self._ids(take_block())
        self._prefetch: concurrent.futures.Future | None = None

    def __call__(self) -> int:
        if self._next == self._end:  # a burst outran the prefetch: wait for it (Django's database calls need a thread)
            fetch = self._prefetch
            if fetch is None or (fetch.done() and fetch.exception() is not None):
                fetch = self._fetcher.submit(self._take)  # a prefetch that failed while the database was away
            try:
                block = fetch.result(timeout=self._wait_s)
            except concurrent.futures.TimeoutError:
                self._prefetch = fetch
                raise _unreachable("did not answer") from None
            except Exception as exc:
                self._prefetch = None
                log.warning("request ids could not be had from the database: %s", exc)
                raise _unreachable("failed") from None
            self._prefetch = None
            self._next, self._end = self._ids(block)
        if self._prefetch is None and self._end - self._next <= self._size // 2:
            self._prefetch = self._fetcher.submit(self._take)
        ticket_id = self._next
        self._next += 1
        return ticket_id

    def _ids(self, block: int) -> tuple[int, int]:
        return block * self._size, (block + 1) * self._size


def take_block() -> int:
    """The next block number of the shared sequence."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT nextval('{SEQUENCE}')")
            return cursor.fetchone()[0]
    except Exception:
        connection.close()  # a broken connection is not reused: the next block reconnects
        raise


def shared_ticket_ids(first_free: int, size: int = BLOCK) -> TicketBlocks:
    """Ids for this worker, past `first_free` (the ids the rows already use). The sequence only ever
    moves forward, even when several workers start at once."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
        cursor.execute(f"SELECT setval('{SEQUENCE}', GREATEST(%s, nextval('{SEQUENCE}')))", [-(-first_free // size)])
    return TicketBlocks(take_block, size)
