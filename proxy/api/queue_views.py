"""`/api/queue`: the waiting and running requests as the scheduler forecasts them, and cancelling one
(also as llama-swap's `POST /api/inflight/<id>/cancel`)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.http.responses import allow_methods, json_error
from proxy.api.views import api_key_required, changes_state
from scheduling.rows.activity import activity_row
from scheduling.models import QueuedRequest
from scheduling.door.questions import CancelRequest, Queue, QueueEntryOf
from scheduling.operating.whole_numbers import ROW_ID_MAX, as_typed


@api_key_required
@allow_methods("GET")
async def queue(request: HttpRequest, service) -> JsonResponse:
    """`GET /api/queue`: queued requests in predicted dispatch order, then starting, then running ones."""
    return JsonResponse({"data": [entry.as_json() for entry in await service.door.ask(Queue())]})


@api_key_required
@changes_state("DELETE")
@allow_methods("GET", "DELETE")
async def queue_entry(request: HttpRequest, service, ticket_id: int) -> HttpResponse:
    """`GET /api/queue/<id>`: the request live while it waits or runs, else its activity row;
    `DELETE`: cancel it."""
    if request.method == "DELETE":
        return await _cancel(service, ticket_id)
    if ticket_id > ROW_ID_MAX:  # the distributed mode's messages carry 64-bit integers
        return json_error(404, f"no request {as_typed(str(ticket_id))}: ids stop at {ROW_ID_MAX}", "request_not_found")
    entry = await service.door.ask(QueueEntryOf(ticket_id))
    if entry is not None:
        return JsonResponse(entry.as_json())
    row = await sync_to_async(_row)(ticket_id)
    if row is None:
        return json_error(404, f"no request {ticket_id}", "request_not_found")
    return JsonResponse(row)


@api_key_required
@changes_state("POST")
@allow_methods("POST")
async def cancel_inflight(request: HttpRequest, service, ticket_id: int) -> HttpResponse:
    """llama-swap's `POST /api/inflight/<id>/cancel`."""
    return await _cancel(service, ticket_id)


async def _cancel(service, ticket_id: int) -> HttpResponse:
    """A waiting request is refused, a running one cut; either client gets a 503 cancelled_by_operator."""
    if ticket_id > ROW_ID_MAX:
        return json_error(404, f"no request {as_typed(str(ticket_id))}: ids stop at {ROW_ID_MAX}", "request_not_found")
    if not await service.door.ask(CancelRequest(ticket_id)):
        return json_error(404, f"request {ticket_id} is not waiting or running", "request_not_found")
    return JsonResponse({"msg": "ok"})


def _row(ticket_id: int) -> dict[str, Any] | None:
    row = QueuedRequest.objects.filter(id=ticket_id).first()
    return None if row is None else activity_row(row)
