"""`GET /v1/models` and `GET /v1/models/<id>` (the openai SDK's `models.list` and `models.retrieve`): the models a
key may use, each as llama-swap's list renders it."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.api.views import api_key_required, refused_for
from proxy.serving.active_profile import active_profile
from proxy.serving.model_choice import listed_choices, models_led_to
from proxy.api.model_listing import add_capabilities, alias_entries
from proxy.serving.access import model_refusal
from proxy.api.responses import allow_methods, json_error
from proxy.upstream.peer_relay import listed_peer_models
from scheduling.core import ModelState
from scheduling.door.questions import Processes


@api_key_required
@allow_methods("GET")
async def list_models(request: HttpRequest, service) -> JsonResponse:
    scope = request.caller.scope
    config = service.config
    data = [entry for entry in await _entries(service, every_name=False)
            if all(map(scope.allows_model, _reached(config, entry)))]
    response = JsonResponse({"object": "list", "data": data})
    if "Origin" in request.headers:  # a web page on another origin may read the list, as with llama-swap
        response["Access-Control-Allow-Origin"] = request.headers["Origin"]
    return response


@api_key_required
@allow_methods("GET")
async def model_entry(request: HttpRequest, service, model_id: str) -> HttpResponse:
    """One model as the list gives it; also a name a request may use that the list leaves out (an alias without
    `includeAliasesInList`, an `unlisted` model or selector). A key is refused a name as the list leaves it out: by
    the models it may lead to, named as asked; a name nothing has by the name itself, so the key cannot tell which
    models exist outside its scope."""
    entry = next((entry for entry in await _entries(service, every_name=True) if entry["id"] == model_id), None)
    reached = (model_id,) if entry is None else _reached(service.config, entry)
    if denied := next(filter(None, (model_refusal(request.caller, model, model_id) for model in reached)), None):
        return refused_for(request.caller, json_error(denied.status, denied.message, denied.code))
    if entry is None:
        return json_error(404, f"The model '{model_id}' does not exist.", "model_not_found")
    return JsonResponse(entry)


async def _entries(service, *, every_name: bool) -> list[dict]:
    """Every entry of the list, sorted by ID as llama-swap lists them; with `every_name`, also the unlisted models
    and selectors, and an entry per alias."""
    config = service.config
    created = int(time.time())
    data = []
    states = await service.door.ask(Processes())
    for model_id, model in config.models.items():
        if model.unlisted and not every_name:
            continue
        state = states.get(model_id, ModelState.STOPPED)
        data.append(
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "llamaswap",
                "name": model.name,
                "description": model.description,
                "status": {"value": "unloaded" if state == ModelState.STOPPED else "loaded"},
                "meta": {"llamaswap": {"type": "model", "aliases": list(model.aliases), **dict(model.metadata)}},
            }
        )
        add_capabilities(data[-1], model.capabilities)
        if config.include_aliases_in_list or every_name:
            data += alias_entries(data[-1], model)
    data += listed_peer_models(config, created)
    profile = await active_profile(config)
    data += listed_choices(config, profile, states, created, {entry["id"] for entry in data}, unlisted=every_name)
    data.sort(key=lambda entry: entry["id"])
    return data


def _reached(config, entry: dict) -> tuple[str, ...]:
    """The model IDs an entry may lead to (`models_led_to`): an alias's model, each target of a selector or a
    profile's pin, else the entry's own ID."""
    meta = entry.get("meta", {}).get("llamaswap", {})
    if meta.get("type") == "alias":
        return (meta["modelID"],)
    if meta.get("type") in ("selector", "profile"):
        return tuple(model for target in meta["targets"] for model in models_led_to(config, target))
    return (entry["id"],)
