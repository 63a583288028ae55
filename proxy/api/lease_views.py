"""`/api/leases`: keep a model loaded for a while (`scheduling.rows.leases`), so a request from some other tool does
not stop the model a person is using and throw away its prompt cache. Needs `hardware:` (placement by memory).

A lease made or revoked here is handed to the scheduler before the answer (`KeepLeases`); where no scheduler
answers (a distributed front end whose worker is away), the worker's next read of the rows brings it within
`SYNC_S`. Each lease shown says what it is doing now (its `state`, see docs/configuration.md, Leases)."""

from __future__ import annotations

import json
import math

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.api.views import api_key_required, changes_state
from proxy.api.visibility import told_in
from proxy.api.responses import allow_methods, json_error
from scheduling.door.frontdoor import Unanswered
from scheduling.door.questions import KeepLeases, NeverFits
from scheduling.keys.scope import KeyScope
from scheduling.rows.leases import MAX_SECONDS, SYNC_S, leases_in_force, revoke_lease, take_lease

_SHAPE = f'send a JSON body {{"model": "<model>", "seconds": <how long, 1 to {MAX_SECONDS}>}}'
_UNANSWERED = {"state": "unknown", "why": f"no scheduler answered; the lease reaches it within {SYNC_S:g} s"}


@api_key_required
@changes_state("POST")
@allow_methods("GET", "POST")
async def leases(request: HttpRequest, service) -> HttpResponse:
    """GET: the leases in force on the models the key may see, each with its state. POST: a new one (201), in force
    before the answer, which loads its model when there is room; 409 when the model can never fit."""
    if request.method == "GET":
        states = await _kept(service)
        rows = await database_sync_to_async(leases_in_force)()
        scope = request.caller.scope  # a key that is not an operator's sees the leases on its models
        return JsonResponse({"leases": [_shown(service, scope, row, states) for row in rows if scope.sees_model(row[1])]})
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
    problem = _problem(body)
    if problem is not None:
        return json_error(400, f"{problem}; {_SHAPE}", "invalid_request")
    config = service.config.resolve(body["model"])
    if config is None:
        return json_error(404, f"model '{body['model']}' is not configured", "model_not_found")
    try:
        never = await service.door.ask(NeverFits(config.id))
    except Unanswered:
        never = None  # no worker answered: its keeper shows the lease `cannot_fit` once it reads it
    if never is not None:
        return json_error(409, f"{request.caller.scope.told(never)}: a lease for it would never be kept",
                          "lease_cannot_fit")
    lease = await database_sync_to_async(take_lease)(config.id, float(body["seconds"]))
    states = await _kept(service)
    return JsonResponse(_shown(service, request.caller.scope, (lease.pk, lease.model, lease.expires_at), states),
                        status=201)


@api_key_required
@changes_state("DELETE")
@allow_methods("DELETE")
async def lease(request: HttpRequest, service, lease_id: int) -> HttpResponse:
    """Revoke a lease: it stops protecting its model before the answer (`takes_effect_within_s` 0), or, where no
    scheduler answered, within `SYNC_S`."""
    if not await database_sync_to_async(revoke_lease)(lease_id):
        return json_error(404, f"no lease #{lease_id} is in force", "lease_not_found")
    applied = await _kept(service) is not None
    return JsonResponse({"id": lease_id, "revoked": True, "takes_effect_within_s": 0 if applied else SYNC_S})


async def _kept(service) -> dict[int, dict] | None:
    """Have the scheduler read the leases in force now; their states (None: no scheduler answered)."""
    try:
        return await service.door.ask(KeepLeases())
    except Unanswered:
        return None


def _problem(body: object) -> str | None:
    """What is wrong with a lease's body, naming the field (None: nothing)."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    if "model" not in body:
        return "model is missing"
    if not isinstance(body["model"], str):
        return "model is not a string"
    if "seconds" not in body:
        return "seconds is missing"
    seconds = body["seconds"]
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
        return "seconds is not a number"
    if not 1 <= seconds <= MAX_SECONDS:
        return f"seconds is {seconds}, out of range: 1 to {MAX_SECONDS} (longer is a pin, pinned: true)"
    return None


def _shown(service, scope: KeyScope, row: tuple, states: dict[int, dict] | None) -> dict:
    """A lease as `scope`'s key is told it: what holds it back names only models the key may see."""
    lease_id, model, expires_at = row
    if model not in service.config.models:
        state = {"state": "model_removed"}
    else:
        state = _UNANSWERED if states is None else states.get(lease_id, _UNANSWERED)
    return told_in(scope, {"id": lease_id, "model": model, "expires_at": expires_at.isoformat(), **state})
