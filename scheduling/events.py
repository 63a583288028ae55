"""What the runtime reports as it works, one typed message per happening.

The runtime hands each to its observer (the metrics, in this process); they are plain frozen
values so they can also travel between processes as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scheduling.core import Band, Decision, band_of

if TYPE_CHECKING:
    from scheduling.tickets import Outcome, TicketRequest


@dataclass(frozen=True)
class Queued:
    """A request joined the queue."""

    model: str
    band: Band


@dataclass(frozen=True)
class Dispatched:
    """A request got the GPU (or its model's start began for it)."""

    decision: Decision


@dataclass(frozen=True)
class Finished:
    """A granted request ended; `state` is completed, failed or cancelled, `status` the HTTP status
    sent (None when the client left before one was), `ttfb_s` None when no byte came."""

    model: str
    route: str
    band: Band
    state: str
    status: int | None
    seconds: float
    ttfb_s: float | None
    usage: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # the API key row's name ("" for a config file apiKey or none)
    queue_wait_s: float | None = None  # from arrival to dispatch (None: relayed to a peer, never queued)

    @classmethod
    def of_granted(cls, model: str, route: str, decision: Decision, outcome: Outcome, granted_at: float, now: float,
                   key: str) -> Finished:
        """A request the scheduler granted at `granted_at` ended at `now` (both on the event loop's clock, as
        the outcome's first byte) as `outcome` says."""
        first_byte = outcome.first_byte_monotonic
        return cls(model=model, route=route, band=decision.band, state=outcome.state, status=outcome.status_code,
                   seconds=now - granted_at, ttfb_s=None if first_byte is None else first_byte - granted_at,
                   usage=outcome.usage or {}, key=key, queue_wait_s=decision.queue_wait_s)

    @classmethod
    def of_relayed(cls, request: TicketRequest, outcome: Outcome, seconds: float,
                   first_byte_s: float | None) -> Finished:
        """A request relayed to a peer, never queued, ended `seconds` after it began."""
        return cls(model=request.model, route=request.route, band=band_of(request.priority), state=outcome.state,
                   status=outcome.status_code, seconds=seconds, ttfb_s=first_byte_s, usage=outcome.usage or {},
                   key=request.api_key)


@dataclass(frozen=True)
class Unserved:
    """A request that never reached a model: the scheduler answered it with an error, or it was
    cancelled while queued (`cancelled`). `model` is empty when the request was already gone."""

    model: str
    route: str
    status: int
    cancelled: bool = False
    key: str = ""  # the API key row's name ("" for a config file apiKey or none)


@dataclass(frozen=True)
class ModelLoaded:
    """A model start succeeded after `seconds`."""

    model: str
    seconds: float


@dataclass(frozen=True)
class ModelStateChanged:
    """A model process is now stopped, starting, ready or stopping."""

    model: str
    state: str


@dataclass(frozen=True)
class Evicted:
    """A model stopped so that another could start: `reason` "memory" (placement) or "swap" (groups, matrix)."""

    model: str
    reason: str


RuntimeEvent = Queued | Dispatched | Finished | Unserved | ModelLoaded | ModelStateChanged | Evicted
