"""Start-up recovery: a run that ended abruptly (SIGKILL, power loss) leaves unfinished rows behind.

The model processes it left are stopped by `proxy.orphans` first (the proxy layer owns processes).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from scheduling.models import TERMINAL_STATES, QueuedRequest, RequestState

log = logging.getLogger("llamaswap.recovery")


def recover_previous_run() -> int:
    """Close unfinished rows as `interrupted`; return the next ticket id."""
    now = timezone.now()
    with transaction.atomic():
        unfinished = QueuedRequest.objects.exclude(state__in=TERMINAL_STATES)
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
