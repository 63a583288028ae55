"""`GET /api/activity`: the request history as JSON, protected by the configured apiKeys."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_http_methods

from proxy.views import api_key_required, json_error
from scheduling.activity import ActivityQuery, ActivityQueryError, activity_page


@require_http_methods(["GET"])
@api_key_required
async def activity(request: HttpRequest, service) -> HttpResponse:
    try:
        query = ActivityQuery.from_params(request.GET)
    except ActivityQueryError as exc:
        return json_error(400, str(exc), "invalid_parameter")
    return JsonResponse(await sync_to_async(activity_page)(query))
