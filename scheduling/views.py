"""`GET /api/activity`: the request history as JSON, protected by the configured apiKeys."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.responses import allow_methods, json_error
from proxy.views import api_key_required
from scheduling.activity import ActivityQuery, ActivityQueryError, activity_page


@allow_methods("GET")
@api_key_required
async def activity(request: HttpRequest, service) -> HttpResponse:
    try:
        query = ActivityQuery.from_params(request.GET)
    except ActivityQueryError as exc:
        return json_error(400, str(exc), "invalid_parameter")
    return JsonResponse(await sync_to_async(activity_page)(query))
