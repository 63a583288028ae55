"""llama-swap's API for its web UI's activity page and about box: captures, activity, stats, version."""

from __future__ import annotations

from dataclasses import replace

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.upstream.captures import STORE
from proxy.api.responses import allow_methods, json_error
from proxy.version import build_info
from proxy.api.views import api_key_required, operator_only
from proxy.api.visibility import told_page
from scheduling.rows.llama_swap_activity import (
    LlamaSwapActivityQuery, LlamaSwapQueryError, llama_swap_activity_page, activity_stats, model_names,
)
from scheduling.whole_numbers import ROW_ID_MAX, as_typed, whole_number


@api_key_required
@operator_only
@allow_methods("GET")
async def capture(request: HttpRequest, service, capture_id: str) -> HttpResponse:
    """`GET /api/captures/<id>`: a request and its response as this process relayed them."""
    if not (capture_id.isascii() and capture_id.isdigit()):
        return json_error(400, f"capture id '{as_typed(capture_id)}' is not a request id (a whole number)",
                          "invalid_parameter")
    ticket_id = whole_number(capture_id)
    if ticket_id is None:
        return json_error(404, f"no request has id {as_typed(capture_id)}: ids stop at {ROW_ID_MAX}", "capture_not_found")
    found = STORE.get(ticket_id)
    if found is None:
        return json_error(404, STORE.why_missing(ticket_id), "capture_not_found")
    return JsonResponse(found.as_json())


@api_key_required
@allow_methods("GET")
async def metrics_activity(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/metrics/activity`: one page of ended requests, filtered and sorted as llama-swap's; a key that is
    not an operator's reads its own requests."""
    try:
        query = LlamaSwapActivityQuery.from_params(request.GET)
    except LlamaSwapQueryError as exc:
        return json_error(400, str(exc), "invalid_parameter")
    scope = request.caller.scope
    query = replace(query, owner=scope.owner_filter())
    return JsonResponse(told_page(scope, await sync_to_async(llama_swap_activity_page)(query, STORE.has)))


@api_key_required
@allow_methods("GET")
async def metrics_stats(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/metrics/stats[?model=]`: token totals and speed histograms over the ended requests (a key that is
    not an operator's: over its own)."""
    owner = request.caller.scope.owner_filter()
    return JsonResponse(await sync_to_async(activity_stats)(model_names(request.GET), owner))


@api_key_required
@allow_methods("GET")
async def version(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/version`: llama-swap's build fields for this llamaswap."""
    return JsonResponse(await sync_to_async(build_info)())
