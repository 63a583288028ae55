"""A request's row columns: as it arrived, as it was dispatched and as it ended, written alike for a
scheduled request, one relayed to a peer and one refused by a front end."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from scheduling.core import Decision, band_of
from scheduling.tickets import Outcome, TicketRequest

# How a request's row ends when the worker takes its front end for dead (followed by for how long it was silent);
# a worker taking over finds the requests let go so by it (`recovery.let_go_requests`).
FRONT_END_SILENT = "its front end was not heard from"


def request_columns(request: TicketRequest) -> dict[str, Any]:
    """A request's row columns as it arrived, alike for a queued request and one relayed to a peer."""
    return {
        "model": request.model,
        "requested_model": request.requested_model,
        "method": request.method,
        "path": request.path,
        "stream": request.stream,
        "client": request.client,
        "origin": request.origin,
        "route": request.route,
        "selector": request.selector,
        "priority": request.priority,
        "api_key": request.api_key,
        "asked_priority": request.asked_priority,
        "band": band_of(request.priority).value,
    }


def outcome_columns(outcome: Outcome, finished_at: datetime, seconds: float,
                     first_byte_at: datetime | None) -> dict[str, Any]:
    """A request's row columns as it ended, alike for a scheduled request and one relayed to a peer."""
    columns: dict[str, Any] = {
        "state": outcome.state,
        "status_code": outcome.status_code,
        "error": outcome.error,
        "finished_at": finished_at,
        "duration_ms": int(seconds * 1000),
    }
    if first_byte_at is not None:
        columns["first_byte_at"] = first_byte_at
    if outcome.response_bytes is not None:
        columns["response_bytes"] = outcome.response_bytes
    if outcome.usage:
        columns.update(outcome.usage)
    return columns


def decision_fields(decision: Decision) -> dict[str, Any]:
    """The activity-log columns of a dispatch decision."""
    fields: dict[str, Any] = {
        "score_priority": decision.terms.priority,
        "score_affinity": decision.terms.affinity,
        "score_aging": decision.terms.aging,
        "runner_up_id": decision.runner_up_id,
        "runner_up_score": decision.runner_up_score,
        "changed_by_aging": decision.changed_by_aging,
        "changed_by_affinity": decision.changed_by_affinity,
        "changed_by_fairness": decision.changed_by_fairness,
        "needed_swap": decision.needs_swap,
        "explanation": decision.explain(),
        "slot": decision.slot,
        "waited_because": decision.waited_because,
    }
    if decision.scheduler == "serial":
        fields.update(
            serial_priority=decision.priority,
            serial_band=str(decision.band),
            serial_score=decision.score,
            serial_queue_wait_ms=int(decision.queue_wait_s * 1000),
        )
    else:
        fields.update(fifo_priority=decision.fifo_priority)
    return fields
