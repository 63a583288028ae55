"""Ticket id blocks while the database is away: the worker refuses a request it cannot number with
a 503 instead of stalling its event loop, and numbers requests again, without a duplicate, once
the database answers. The blocks come from a stand-in for the sequence that the test can fail or hold."""

from __future__ import annotations

import threading
import time

import pytest

from scheduling.tickets import Refused
from scheduling.door.ticket_ids import TicketBlocks


class Sequence:
    """The shared sequence's nextval, as a callable the test can break or hold up."""

    def __init__(self) -> None:
        self.value = 0
        self.failing = False
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> int:
        self.gate.wait()
        if self.failing:
            raise ConnectionError("connection refused")
        self.value += 1
        return self.value


def take(blocks: TicketBlocks, count: int) -> list[int]:
    return [blocks() for _ in range(count)]


def test_a_failed_fetch_refuses_that_request_and_the_next_one_fetches_afresh():
    sequence = Sequence()
    blocks = TicketBlocks(sequence, size=4, wait_s=5)
    first = take(blocks, 3)  # the prefetch of the next block starts here and succeeds
    sequence.failing = True
    second = take(blocks, 5)  # the rest of block 1 and all of block 2, whose prefetch of block 3 fails
    with pytest.raises(Refused) as refused:
        blocks()
    assert (refused.value.status, refused.value.code) == (503, "request_history_unreachable")
    assert refused.value.retry_after == 5
    with pytest.raises(Refused):
        blocks()  # still away: refused again, not stuck on the first failure
    sequence.failing = False
    third = take(blocks, 6)
    ids = first + second + third
    assert len(set(ids)) == len(ids) and ids == sorted(ids)


def test_a_database_that_does_not_answer_refuses_within_the_wait_instead_of_stalling():
    sequence = Sequence()
    blocks = TicketBlocks(sequence, size=4, wait_s=0.2)
    before = take(blocks, 2)
    sequence.gate.clear()  # the prefetch started now hangs, as a read on a stalled connection does
    before += take(blocks, 2)
    began = time.monotonic()
    with pytest.raises(Refused) as refused:
        blocks()
    assert time.monotonic() - began < 2  # the event loop waited about wait_s, not for the database
    assert "did not answer" in refused.value.message
    sequence.gate.set()
    after = take(blocks, 5)  # the fetch that hung is used, not doubled
    assert len(set(before + after)) == 9 and sequence.value == 3


def test_a_prefetch_that_failed_while_the_database_was_away_is_fetched_again_once_it_is_back():
    sequence = Sequence()
    blocks = TicketBlocks(sequence, size=4, wait_s=5)
    sequence.failing = True
    first = take(blocks, 3)  # the prefetch of the next block starts here and fails
    deadline = time.monotonic() + 5
    while not (blocks._prefetch.done() and blocks._prefetch.exception()) and time.monotonic() < deadline:
        time.sleep(0.01)
    sequence.failing = False  # the database is back before the block runs out
    second = take(blocks, 5)  # no request is refused for the failure of a fetch made while it was away
    ids = first + second
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
