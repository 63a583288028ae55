"""A part the service leans on is away — the scheduler (its worker out of reach over Redis, or not answering) or the
database — and a route needs it: one place answers that with 503, `Retry-After` and why, OpenAI-shaped, never a 500
with a traceback. Django's views reach it as a middleware (`UnavailableMiddleware`), the model consumers through
`as_unavailable`; the reason the database gave stays in the log, with its addresses. A database whose disk is full
is not away but keeps nothing: 507 `disk_full` (`proxy.serving.disk_full`)."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.utils.deprecation import MiddlewareMixin

from proxy.serving.disk_full import disk_full, is_disk_full
from proxy.serving.errors import ProxyError
from proxy.api.responses import json_error
from scheduling.door.frontdoor import DatabaseAway, Unanswered

# A route reconnects to the database on its next request; the request history is written within about 2 s of its
# return (docs/distributed.md, The database away for a while).
DATABASE_RETRY_AFTER_S = 2

log = logging.getLogger("llamaswap.proxy")


def as_unavailable(exc: BaseException) -> ProxyError | None:
    """The 503 for `exc` when it says the scheduler or the database is away (507 when the database's disk is full:
    it answers, but keeps nothing); None for anything else."""
    if is_disk_full(exc):
        return disk_full("what the request changes")
    if isinstance(exc, DatabaseAway):  # the worker's database, not the scheduler, is what is away
        return _database_unreachable(exc.kind)
    if isinstance(exc, Unanswered):
        return ProxyError(503, f"{exc.why}; retry later", "scheduler_unreachable",
                          headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, (OperationalError, InterfaceError)):  # the server away, or a connection it dropped
        return _database_unreachable(type(exc).__name__)
    return None


def _database_unreachable(kind: str) -> ProxyError:
    return ProxyError(503, f"the database is unreachable ({kind}); retry later", "database_unreachable",
                      headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})


class UnavailableMiddleware(MiddlewareMixin):
    """Django's views: a view that raised because the scheduler or the database is away answers 503 (507: a disk
    full)."""

    def process_exception(self, request, exception):
        refusal = as_unavailable(exception)
        if refusal is None:
            return None
        log.warning("%s %s answered %d: %s", request.method, request.path, refusal.status, exception)
        return json_error(refusal.status, refusal.message, refusal.code,
                          **{name.replace("-", "_"): value for name, value in refusal.headers.items()})
