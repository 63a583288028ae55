"""One way a request is held, whichever way it is served (a model's HTTP route, a WebSocket, a peer).

A request is built from its scope once (`ticket_request`), and from its grant, or its relayed row's
start, to its row's end it is held by `holding()`, which turns each way a request can end into one
`Outcome`, recorded once: the relay's end, a `ProxyError`, an operator's cut (a shutdown, an unload)
or the client leaving. The caller tells its client about a cut after the block, in its own protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from proxy.serving.errors import ProxyError
from proxy.serving.inbound import max_wait_seconds, route_label
from scheduling.core import PRIORITY_HEADER, parse_priority, readable_priority
from scheduling.keys.scope import UNRESTRICTED, KeyScope
from scheduling.tickets import Outcome, Refused, RequestState, TicketRequest

CLIENT_LEFT = Outcome(state=RequestState.CANCELLED, error="client disconnected mid-response")


def ticket_request(scope: dict, headers: dict[str, str], *, model: str, requested: str, method: str,
                   stream: bool = False, selector: str = "", key: KeyScope = UNRESTRICTED) -> TicketRequest:
    """What the scheduler is told of a request: its headers (lower-cased, first value wins) give its
    priority and maximum wait, refused with 400 when malformed; its API key caps the priority, or gives it
    when the header is missing. The scheduler gets the priority applied; the row keeps the one asked for too."""
    client = scope.get("client") or ("", 0)
    asked = asked_priority(headers)
    return TicketRequest(
        model=model,
        path=scope["path"],
        priority=key.applied_priority(asked),
        asked_priority=asked,
        api_key=key.name,
        key_weight=key.weight,
        requested_model=requested,
        method=method,
        stream=stream,
        client=str(client[0] or ""),
        route=route_label(scope["path"]),
        max_wait_s=max_wait_seconds(headers),
        selector=selector,
    )


def unreadable_priority(headers: dict[str, str]) -> str | None:
    """The priority header's value when it is there, not blank and no priority (read as 0); else None."""
    value = headers.get(PRIORITY_HEADER.lower())
    return value if value is not None and value.strip() and not readable_priority(value) else None


def asked_priority(headers: dict[str, str]) -> int | None:
    """The priority header's value (0 when unparseable), or None when it is missing or blank."""
    value = headers.get(PRIORITY_HEADER.lower())
    return None if value is None or not value.strip() else parse_priority(value)


class Held:
    """A request being served: `end(outcome)` records how it ended, and only the first call counts (the
    relay ends it as soon as the model has answered, before the last write to the client). `cut` is the
    operator's reason when one took it back."""

    def __init__(self, record: Callable[[Outcome], None]) -> None:
        self._record = record
        self.open = True
        self.cut: Refused | None = None

    def end(self, outcome: Outcome) -> None:
        if self.open:
            self.open = False
            self._record(outcome)


@contextlib.asynccontextmanager
async def holding(record: Callable[[Outcome], None], cut_by: Callable[[], Refused | None], *,
                  failures: tuple[type[BaseException], ...] = (),
                  left: Callable[[], Outcome] = lambda: CLIENT_LEFT) -> AsyncIterator[Held]:
    """Hold one request while the block serves it; `record` is called once with how it ended.

    A `ProxyError` ends it failed with its status, one of `failures` failed with 502; a cancellation is
    an operator's cut when `cut_by()` names one (then swallowed: `held.cut` says why, for the caller to
    tell its client), else the client leaving (`left()`, re-raised)."""
    held = Held(record)
    try:
        yield held
    except ProxyError as exc:
        held.end(Outcome(state=RequestState.FAILED, status_code=exc.status, error=exc.message))
        raise
    except failures as exc:
        held.end(Outcome(state=RequestState.FAILED, status_code=502, error=str(exc)))
        raise
    except asyncio.CancelledError:
        cut = cut_by()
        if cut is None or asyncio.current_task().uncancel():
            raise  # the client left: ended below
        held.cut = cut
        held.end(Outcome(state=RequestState.CANCELLED, status_code=cut.status, error=cut.message))
    finally:
        if held.open:  # nothing above ended it: its client left, or an error none of them names
            held.end(left())
