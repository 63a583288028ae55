"""`/api/queue`: the waiting and running requests as the scheduler forecasts them, cancelling one (also as
llama-swap's `POST /api/inflight/<id>/cancel`) and changing a waiting one's priority, as the admin does."""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.api.responses import allow_methods, json_error
from proxy.api.views import api_key_required, changes_state
from proxy.api.visibility import own_entries, own_rows, told_in
from scheduling.rows.activity import activity_row
from scheduling.models import QueuedRequest
from scheduling.core.priority import PRIORITY_ALIASES
from scheduling.door.questions import Cancel, Progress, Queue, Reprioritize
from scheduling.admin.forms import PriorityField
from scheduling.whole_numbers import ROW_ID_MAX, as_typed

_ALIASES = ", ".join(f"'{name}'" for name in PRIORITY_ALIASES)


@api_key_required
@allow_methods("GET")
async def queue(request: HttpRequest, service) -> JsonResponse:
    """`GET /api/queue`: queued requests in predicted dispatch order, then starting, then running ones; a key that
    is not an operator's sees its own (with their places among all)."""
    scope = request.caller.scope
    entries = await own_entries(scope, await service.door.ask(Queue()))
    return JsonResponse({"data": [told_in(scope, entry.as_json()) for entry in entries]})


@api_key_required
@changes_state("DELETE", "PATCH")
@allow_methods("GET", "DELETE", "PATCH")
async def queue_entry(request: HttpRequest, service, ticket_id: int) -> HttpResponse:
    """`GET /api/queue/<id>`: the request live while it waits or runs, else its activity row;
    `DELETE`: cancel it; `PATCH {"priority": …}`: re-rank it while it waits (an operator's, as the admin's action).
    Another key's request is answered 404 to a key that is not an operator's, as if absent."""
    if ticket_id > ROW_ID_MAX:  # the distributed mode's messages carry 64-bit integers
        return json_error(404, f"no request {as_typed(str(ticket_id))}: ids stop at {ROW_ID_MAX}", "request_not_found")
    if request.method == "DELETE":
        return await _cancel(service, ticket_id)
    if request.method == "PATCH":
        return await _reprioritize(request, service, ticket_id)
    scope = request.caller.scope
    entry = await service.door.ask(Progress(ticket_id))
    if entry is not None and await own_entries(scope, [entry]):
        return JsonResponse(told_in(scope, entry.as_json()))
    row = await sync_to_async(_row)(ticket_id)
    if row is None or not own_rows(scope, [row]):
        return json_error(404, f"no request {ticket_id}", "request_not_found")
    return JsonResponse(told_in(scope, row))


@api_key_required
@changes_state("POST")
@allow_methods("POST")
async def cancel_inflight(request: HttpRequest, service, ticket_id: int) -> HttpResponse:
    """llama-swap's `POST /api/inflight/<id>/cancel`."""
    return await _cancel(service, ticket_id)


async def _cancel(service, ticket_id: int) -> HttpResponse:
    """A waiting request is refused, a running one cut; either client gets a 503 cancelled_by_operator."""
    if ticket_id > ROW_ID_MAX:  # llama-swap's route has no check of its own
        return json_error(404, f"no request {as_typed(str(ticket_id))}: ids stop at {ROW_ID_MAX}", "request_not_found")
    if not await service.door.ask(Cancel((ticket_id,), running=True)):
        return json_error(404, f"request {ticket_id} is not waiting or running", "request_not_found")
    return JsonResponse({"msg": "ok"})


async def _reprioritize(request: HttpRequest, service, ticket_id: int) -> HttpResponse:
    """The waiting request `ticket_id` at a new priority (a whole number or an alias, strictly read: a mistyped
    one is 400, not the header's 0), re-ranked keeping its arrival, so its aging carries on; its row says so."""
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None
    asked = body.get("priority") if isinstance(body, dict) else None
    try:
        if isinstance(asked, bool) or not isinstance(asked, (int, str)) or not str(asked).strip():
            raise ValidationError("")
        priority = PriorityField().clean(str(asked))
    except ValidationError as refused:
        why = " ".join(refused.messages).strip() or f"'priority' must be a whole number or one of {_ALIASES}"
        return json_error(400, f'{why}; send a JSON body {{"priority": <a whole number or {_ALIASES}>}}',
                          "invalid_request")
    if not await service.door.ask(Reprioritize((ticket_id,), priority)):
        return json_error(404, f"request {ticket_id} is not waiting: only a queued request's priority can change",
                          "request_not_found")
    return JsonResponse({"id": ticket_id, "priority": priority})


def _row(ticket_id: int) -> dict[str, Any] | None:
    row = QueuedRequest.objects.filter(id=ticket_id).first()
    return None if row is None else activity_row(row)
