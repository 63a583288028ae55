"""The fake model with one generation slot, serving requests in arrival order.

    python bench/single_slot_model.py --port 8081 --model demo [the fake model's other options]

A GPU model server with one slot (llama-server started with `--parallel 1`) queues the requests it
is sent and answers them one at a time, first come first served. llamaswap's fifo scheduler
relies on exactly that: it forwards every request for a ready model at once. The stock fake model
answers all requests concurrently, which would hide the queue that forms in the model server;
this one keeps it, so both schedulers face the same one-request-at-a-time upstream.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fakemodel import server as fakemodel


class ArrivalOrderSlot:
    """One holder at a time, granted strictly in the order `turn()` was entered.

    A plain lock does not promise first-come first-served among waiting threads; this does."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next_ticket = 0
        self._now_serving = 0

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._changed:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._changed.wait_for(lambda: self._now_serving == ticket)
        try:
            yield
        finally:
            with self._changed:
                self._now_serving += 1
                self._changed.notify_all()


class SingleSlotHandler(fakemodel.FakeModelHandler):
    """Generation requests (POST) take the slot in turn; health checks (GET) never wait."""

    slot = ArrivalOrderSlot()

    def do_POST(self) -> None:
        with self.slot.turn():
            super().do_POST()


if __name__ == "__main__":
    fakemodel.FakeModelHandler = SingleSlotHandler  # the server class builds its handler from this name
    sys.exit(fakemodel.main())
