"""`GET /api/profiles` and `PUT /api/profiles/active`: llama-swap's profile switch."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.serving.active_profile import active_profile, set_active_profile
from proxy.serving.model_choice import models_led_to
from proxy.api.responses import allow_methods, json_error
from proxy.api.views import api_key_required, changes_state


@api_key_required
@allow_methods("GET")
async def profiles(request: HttpRequest, service) -> JsonResponse:
    """The configured profiles by name, each pin with its target ("" for a disabled ID), and the active one; a key
    that is not an operator's is shown the pins that lead to its models only (`models_led_to`)."""
    config, scope = service.config, request.caller.scope
    listed = [
        {"name": name, "description": profile.description,
         "pins": {pinned: target for pinned, target in profile.pins.items()
                  if all(map(scope.sees_model, models_led_to(config, target or pinned)))}}
        for name, profile in sorted(config.profiles.items())
    ]
    return JsonResponse({"active": await active_profile(config) or None, "profiles": listed})


@api_key_required
@changes_state("PUT")
@allow_methods("PUT")
async def activate_profile(request: HttpRequest, service) -> HttpResponse:
    """`{"name": "<profile>"}` switches that profile on for every front end; `{"name": null}` switches profiles off."""
    try:
        raw = request.body
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return json_error(413, f'the request body is over {limit} bytes; send {{"name": "<profile>"}}', "request_too_large")
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested too deeply to read
        body = None
    if not isinstance(body, dict) or "name" not in body or not isinstance(body["name"], (str, type(None))):
        return json_error(400, 'send a JSON body {"name": "<profile>"}, or {"name": null} for none', "invalid_request")
    name = body["name"] or ""
    if name and name not in service.config.profiles:
        known = ", ".join(sorted(service.config.profiles)) or "none are configured"
        return json_error(404, f"no profile is called '{name}' (profiles: {known})", "profile_not_found")
    await set_active_profile(name)
    return JsonResponse({"active": name or None})
