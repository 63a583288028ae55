"""Start-up recovery: a run that ended abruptly (SIGKILL, power loss) leaves unfinished rows behind.

The model processes it left are stopped by `proxy.orphans` first (the proxy layer owns processes).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from scheduling.models import TERMINAL_STATES, QueuedRequest, RequestState
from scheduling.runtime import Carried, TicketRequest

log = logging.getLogger("llamaswap.recovery")


def recover_previous_run(*, worker_models: list[str] | None = None) -> int:
    """Close unfinished rows as `interrupted`; return the next ticket id.

    A worker in distributed mode recovers the rows of its own models (`worker_models`; other boxes'
    workers serve the rest) and keeps the queued ones of front ends (`origin` set): their clients
    still wait, and `carried_requests()` queues them again.
    """
    now = timezone.now()
    with transaction.atomic():
        unfinished = QueuedRequest.objects.exclude(state__in=TERMINAL_STATES)
        if worker_models is not None:
            unfinished = unfinished.filter(model__in=worker_models).exclude(state=RequestState.QUEUED, origin__gt="")
        for state in (RequestState.QUEUED, RequestState.DISPATCHED):
            count = unfinished.filter(state=state).update(
                state=RequestState.INTERRUPTED,
                finished_at=now,
                error=f"llamaswap stopped (killed or crashed) while this request was {state.label.lower()}",
            )
            if count:
                log.warning("marked %d requests left %s by a previous run as interrupted", count, state.value)
        last = QueuedRequest.objects.aggregate(last=Max("id"))["last"] or 0
    return last + 1


def carried_requests(models: list[str]) -> list[Carried]:
    """The requests for `models` front ends queued with a worker that is gone, oldest first, as their
    rows say (an operator's re-prioritisation included)."""
    rows = QueuedRequest.objects.filter(state=RequestState.QUEUED, origin__gt="", model__in=models).order_by(
        "arrived_at", "id"
    )
    return [
        Carried(
            TicketRequest(
                model=row.model, path=row.path, priority=row.priority, requested_model=row.requested_model,
                method=row.method, stream=row.stream, client=row.client, route=row.route or "other", origin=row.origin,
                max_wait_s=row.max_wait_s, selector=row.selector,
            ),
            row.arrived_at,
            row.id,
        )
        for row in rows
    ]
