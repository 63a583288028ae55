"""`/api/leases`: keep a model loaded for a while (`scheduling.rows.leases`), so a request from some other tool does
not stop the model a person is using and throw away its prompt cache. Needs `hardware:` (placement by memory)."""

from __future__ import annotations

import json
import math

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.api.views import api_key_required, changes_state
from proxy.http.responses import allow_methods, json_error
from scheduling.rows.leases import MAX_SECONDS, SYNC_S, leases_in_force, revoke_lease, take_lease

_SHAPE = 'send a JSON body {"model": "<model>", "seconds": <how long, 1 to 2592000>}'


@api_key_required
@changes_state("POST")
@allow_methods("GET", "POST")
async def leases(request: HttpRequest, service) -> HttpResponse:
    """GET: the leases in force. POST: a new one (201), which loads its model if needed."""
    if request.method == "GET":
        return JsonResponse({"leases": [_shown(*row) for row in await database_sync_to_async(leases_in_force)()]})
    if service.config.hardware is None:
        return json_error(400, "leases keep models placed by memory: describe the GPUs under a top-level hardware: "
                               "section (see docs/configuration.md, Hardware and memory placement)", "placement_off")
    try:
        raw = request.body
    except RequestDataTooBig:
        return json_error(413, f"the request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; {_SHAPE}",
                          "request_too_large")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not _seconds(body.get("seconds")):
        return json_error(400, _SHAPE, "invalid_request")
    config = service.config.resolve(body["model"])
    if config is None:
        return json_error(404, f"model '{body['model']}' is not configured", "model_not_found")
    lease = await database_sync_to_async(take_lease)(config.id, float(body["seconds"]))
    service.start_loading(config.id, "lease")
    return JsonResponse(_shown(lease.pk, lease.model, lease.expires_at), status=201)


@api_key_required
@changes_state("DELETE")
@allow_methods("DELETE")
async def lease(request: HttpRequest, service, lease_id: int) -> HttpResponse:
    """Revoke a lease (it stops protecting its model within about a second)."""
    if not await database_sync_to_async(revoke_lease)(lease_id):
        return json_error(404, f"no lease #{lease_id} is in force", "lease_not_found")
    return JsonResponse({"id": lease_id, "revoked": True, "takes_effect_within_s": SYNC_S})


def _seconds(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 1 <= value <= MAX_SECONDS)


def _shown(lease_id: int, model: str, expires_at) -> dict:
    return {"id": lease_id, "model": model, "expires_at": expires_at.isoformat()}

