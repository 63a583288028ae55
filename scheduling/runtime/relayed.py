"""The engine's rows for requests served without the scheduler (relayed to a peer): one row each, as
dispatched at once, ended as the relay ended, with the same metrics as a scheduled request."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from scheduling.events import Finished, RuntimeEvent
from scheduling.rows.columns import outcome_columns, request_columns
from scheduling.tickets import Outcome, RequestState, TicketRequest


class RelayedRows:
    """The requests relayed to a peer and not yet ended, owned here, each with its row: begun (`begin`) and ended
    (`end`, once) only here. `SchedulerRuntime` makes one (`runtime.relayed`)."""

    def __init__(self, recorder, ticket_id: Callable[[], int], observer: Callable[[RuntimeEvent], None]) -> None:
        self._recorder = recorder
        self._ticket_id = ticket_id
        self._observer = observer
        self._relayed: dict[int, tuple[TicketRequest, datetime]] = {}  # until they end

    def underway(self) -> bool:
        return bool(self._relayed)

    def begin(self, request: TicketRequest, peer: str, started_at: datetime, explanation: str) -> int:
        """A request served without the scheduler (relayed to `peer`) began at `started_at`: its row, as
        dispatched at once. Returns its ticket id; end it with `end`."""
        ticket_id = self._ticket_id()
        self._relayed[ticket_id] = (request, started_at)
        self._recorder.create(
            ticket_id,
            **request_columns(request),
            peer=peer,
            state=RequestState.DISPATCHED,
            arrived_at=started_at,
            dispatched_at=started_at,
            explanation=explanation,
        )
        return ticket_id

    def end(self, ticket_id: int, outcome: Outcome, seconds: float, first_byte_s: float | None) -> None:
        """A relayed request ended, `seconds` after it began (its first byte `first_byte_s` after).
        Idempotent, as `SchedulerRuntime.release`."""
        relayed = self._relayed.pop(ticket_id, None)
        if relayed is None:
            return
        request, started_at = relayed
        first_byte_at = None if first_byte_s is None else started_at + timedelta(seconds=first_byte_s)
        self._recorder.update(ticket_id, **outcome_columns(
            outcome, started_at + timedelta(seconds=seconds), seconds, first_byte_at
        ))
        self._observer(Finished.of_relayed(request, outcome, seconds, first_byte_s))
