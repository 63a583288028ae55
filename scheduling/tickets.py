"""The words the HTTP side and the scheduler share: a request asking for the GPU, the lease that
grants it, how it ended, and a refusal.

A leaf: front ends in other processes, the wire and the front doors import these without importing
the engine (`scheduling.runtime`) that acts on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models.enums import TextChoices

from scheduling.core import Decision


class RequestState(TextChoices):
    """Where a request's row stands; the last five are terminal."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    INTERRUPTED = "interrupted"


TERMINAL_STATES = (
    RequestState.COMPLETED,
    RequestState.FAILED,
    RequestState.CANCELLED,
    RequestState.REJECTED,
    RequestState.INTERRUPTED,
)


@dataclass(frozen=True)
class TicketRequest:
    """What a front end knows about a request when it asks for the GPU."""

    model: str
    path: str
    priority: int
    requested_model: str = ""
    method: str = "POST"
    stream: bool = False
    client: str = ""
    route: str = "other"  # the path as a bounded metrics label, which only the front end can tell
    origin: str = ""  # distributed mode: the front end's key for it (see QueuedRequest.origin)
    max_wait_s: float | None = None  # refused if not granted this long after it arrived (the caller's limit)
    selector: str = ""  # the selector (a virtual model ID) that picked `model`, if one did
    api_key: str = ""  # the API key row's name (never its secret); "" for a config file apiKey or none
    key_weight: int = 1  # that key's fair-share weight
    asked_priority: int | None = None  # the priority header before the key's clamp (None: no header)


@dataclass(frozen=True)
class Carried:
    """A request queued before this runtime started (a worker that took over): when it arrived, so
    aging carries on, and the row the previous worker wrote for it, if it wrote one."""

    request: TicketRequest
    arrived_at: datetime
    ticket_id: int | None = None


@dataclass(eq=False)
class Lease:
    """Permission to send one request upstream; give it back with `release()`.

    An operator who unloads the model takes the GPU back at once: the lease is then `cut`, with
    the reason to give the client, and the task that `held_by()` it is cancelled.
    """

    ticket_id: int
    model: str
    upstream: str
    decision: Decision
    cut: Refused | None = None
    _holder: asyncio.Task | None = field(default=None, repr=False)

    def held_by(self, task: asyncio.Task) -> None:
        """`task` sends the request; a cut cancels it (at once, if the cut came first)."""
        self._holder = task
        if self.cut is not None:
            task.cancel()

    def holder(self) -> asyncio.Task | None:
        """The task holding it, until that task ends (after a cut, it still closes its model server's side)."""
        return self._holder if self._holder is not None and not self._holder.done() else None

    def revoke(self, reason: Refused) -> None:
        self.cut = reason
        if self._holder is not None:
            self._holder.cancel()


@dataclass(eq=False)
class Refused(Exception):
    """The scheduler answered a request with an error instead of a grant, or took its grant back.

    A dataclass, so the wire carries it to a front end as it is."""

    status: int
    code: str
    message: str
    retry_after: float | None = None
    ticket_id: int | None = None  # the refused request's row, when it had one: its client can look it up

    def __post_init__(self) -> None:
        super().__init__(self.message)


@dataclass(frozen=True)
class Outcome:
    """How a granted request ended, for its row."""

    state: RequestState  # completed, failed or cancelled
    status_code: int | None = None
    error: str = ""
    usage: dict[str, Any] | None = None
    first_byte_monotonic: float | None = None
    response_bytes: int | None = None
    # Unix times, stamped where the request was relayed (see `stamped`): a worker that reads the outcome
    # later than it happened (one that took over from a dead one) still records when things happened.
    ended_at: float | None = None
    first_byte_at: float | None = None


def stamped(outcome: Outcome, now: float) -> Outcome:
    """`outcome` with its end (now) and first byte on the wall clock; `now` is the monotonic clock its
    `first_byte_monotonic` was read on."""
    wall = time.time()
    first_byte = outcome.first_byte_monotonic
    return dataclasses.replace(
        outcome, ended_at=wall, first_byte_at=None if first_byte is None else wall - max(0.0, now - first_byte)
    )


@dataclass(frozen=True)
class Interrupted:
    """A request a front end was relaying when its worker died: the row says `interrupted` until the
    front end's report of how it ended reaches the worker that took over (see `end_interrupted`)."""

    ticket_id: int
    origin: str
    dispatched_at: datetime
