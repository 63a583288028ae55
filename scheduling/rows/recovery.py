"""Start-up recovery: a run that ended abruptly (SIGKILL, power loss) leaves unfinished rows behind.

The model processes it left are stopped by `proxy.model_processes.orphans` first (the proxy layer owns processes).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from scheduling.models import ApiKey, QueuedRequest
from scheduling.rows.columns import FRONT_END_SILENT
from scheduling.tickets import TERMINAL_STATES, RequestState
from scheduling.tickets import Carried, Interrupted, TicketRequest

log = logging.getLogger("llamaswap.recovery")


def recover_previous_run(*, worker_models: list[str] | None = None) -> int:
    """Close unfinished rows as `interrupted`; return the next ticket id.

    A worker in distributed mode recovers the rows of its own models (`worker_models`; other boxes'
    workers serve the rest) and leaves those of front ends (`origin` set) to `carried_requests()` (the
    queued ones: their clients still wait) and `interrupted_requests()` (the dispatched ones).
    """
    with transaction.atomic():
        unfinished = QueuedRequest.objects.exclude(state__in=TERMINAL_STATES)
        if worker_models is not None:
            unfinished = unfinished.filter(model__in=worker_models).exclude(origin__gt="")
        for state in (RequestState.QUEUED, RequestState.DISPATCHED):
            _interrupt(unfinished.filter(state=state), state)
        last = QueuedRequest.objects.aggregate(last=Max("id"))["last"] or 0
    return last + 1


def _interrupt(rows, state: RequestState) -> None:
    count = rows.update(
        state=RequestState.INTERRUPTED,
        finished_at=timezone.now(),
        error=f"llamaswap stopped (killed or crashed) while this request was {state.label.lower()}",
    )
    if count:
        log.warning("marked %d requests left %s by a previous run as interrupted", count, state.value)


def interrupted_requests(models: list[str]) -> list[Interrupted]:
    """The requests for `models` front ends were relaying under a worker that is gone: their rows become
    `interrupted` (nobody may report their end), and the worker that takes over records the end a front
    end reports after all (their streams run from the model to the front end, not through a worker)."""
    rows = QueuedRequest.objects.filter(state=RequestState.DISPATCHED, origin__gt="", model__in=models)
    interrupted = [Interrupted(row.id, row.origin, row.dispatched_at or row.arrived_at) for row in rows]
    _interrupt(QueuedRequest.objects.filter(id__in=[i.ticket_id for i in interrupted]), RequestState.DISPATCHED)
    return interrupted


def let_go_requests(models: list[str], limit: int) -> tuple[dict[str, int], list[Interrupted]]:
    """The latest `limit` requests for `models` a worker let go with a front end it took for dead (their rows
    `cancelled` for its silence), oldest first: the waiting ones by front end key -> row, and the running
    ones. That front end may have been cut off rather than dead, and come back to the worker taking over."""
    rows = list(QueuedRequest.objects.filter(
        state=RequestState.CANCELLED, origin__gt="", model__in=models, error__startswith=FRONT_END_SILENT,
    ).order_by("-finished_at", "-id")[:limit])[::-1]
    waiting = {row.origin: row.id for row in rows if row.dispatched_at is None}
    running = [Interrupted(row.id, row.origin, row.dispatched_at) for row in rows if row.dispatched_at is not None]
    return waiting, running


def carried_requests(models: list[str]) -> list[Carried]:
    """The requests for `models` front ends queued with a worker that is gone, oldest first, as their
    rows say (an operator's re-prioritisation included)."""
    rows = list(QueuedRequest.objects.filter(state=RequestState.QUEUED, origin__gt="", model__in=models).order_by(
        "arrived_at", "id"
    ))
    # A row keeps its key's name, not its fair-share weight: that is the key's as it stands.
    weights = dict(ApiKey.objects.filter(name__in={row.api_key for row in rows if row.api_key})
                   .values_list("name", "weight"))
    return [
        Carried(
            TicketRequest(
                model=row.model, path=row.path, priority=row.priority, requested_model=row.requested_model,
                method=row.method, stream=row.stream, client=row.client, route=row.route or "other", origin=row.origin,
                max_wait_s=row.max_wait_s, selector=row.selector, api_key=row.api_key,
                key_weight=weights.get(row.api_key, 1), asked_priority=row.asked_priority,
            ),
            row.arrived_at,
            row.id,
        )
        for row in rows
    ]
