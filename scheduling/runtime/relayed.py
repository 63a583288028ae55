"""The engine's rows for requests served without the scheduler (relayed to a peer): one row each, as
dispatched at once, ended as the relay ended, with the same metrics as a scheduled request."""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduling.events import Finished
from scheduling.rows.columns import outcome_columns, request_columns
from scheduling.tickets import Outcome, RequestState, TicketRequest


class RelayedRows:
    """Part of `SchedulerRuntime`."""

    def begin_relayed(self, request: TicketRequest, peer: str, started_at: datetime, explanation: str) -> int:
        """A request served without the scheduler (relayed to `peer`) began at `started_at`: its row, as
        dispatched at once. Returns its ticket id; end it with `end_relayed`."""
        self._refuse_if_unrecordable()
        ticket_id = self._ticket_id()
        self._relayed[ticket_id] = (request, started_at)
        self.recorder.create(
            ticket_id,
            **request_columns(request),
            peer=peer,
            state=RequestState.DISPATCHED,
            arrived_at=started_at,
            dispatched_at=started_at,
            explanation=explanation,
        )
        return ticket_id

    def end_relayed(self, ticket_id: int, outcome: Outcome, seconds: float, first_byte_s: float | None) -> None:
        """A relayed request ended, `seconds` after it began (its first byte `first_byte_s` after).
        Idempotent, as `release`."""
        relayed = self._relayed.pop(ticket_id, None)
        if relayed is None:
            return
        request, started_at = relayed
        first_byte_at = None if first_byte_s is None else started_at + timedelta(seconds=first_byte_s)
        self.recorder.update(ticket_id, **outcome_columns(
            outcome, started_at + timedelta(seconds=seconds), seconds, first_byte_at
        ))
        self._observer(Finished.of_relayed(request, outcome, seconds, first_byte_s))
