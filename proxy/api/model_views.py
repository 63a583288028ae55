"""`GET /v1/models` and `GET /v1/models/<id>` (the openai SDK's `models.list` and `models.retrieve`): the models a
key may use, each as llama-swap's list renders it."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse, JsonResponse

from proxy.api.views import api_key_required, refused_for
from proxy.compat.active_profile import active_profile
from proxy.compat.model_choice import listed_choices
from proxy.compat.model_listing import add_capabilities, alias_entries
from proxy.http.access import model_refusal
from proxy.http.responses import allow_methods, json_error
from proxy.upstream.peer_relay import listed_peer_models
from scheduling.core import ModelState
from scheduling.door.questions import Processes


@api_key_required
@allow_methods("GET")
async def list_models(request: HttpRequest, service) -> JsonResponse:
    scope = request.caller.scope
    data = [entry for entry in await _entries(service, every_name=False) if scope.allows_model(_reached(entry))]
    response = JsonResponse({"object": "list", "data": data})
    if "Origin" in request.headers:  # a web page on another origin may read the list, as with llama-swap
        response["Access-Control-Allow-Origin"] = request.headers["Origin"]
    return response


@api_key_required
@allow_methods("GET")
async def model_entry(request: HttpRequest, service, model_id: str) -> HttpResponse:
    """One model as the list gives it; also a name a request may use that the list leaves out (an alias without
    `includeAliasesInList`, an `unlisted` model or selector). A key is refused a name outside its models as a
    request for it is: by the name as asked (configured or not, so it cannot tell which models exist outside its
    scope), then by the model an alias reaches."""
    entry = next((entry for entry in await _entries(service, every_name=True) if entry["id"] == model_id), None)
    reached = model_id if entry is None else _reached(entry)
    if denied := model_refusal(request.caller, model_id) or model_refusal(request.caller, reached, model_id):
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


def _reached(entry: dict) -> str:
    """The model ID an entry reaches: an alias's model, else the entry's own ID."""
    meta = entry.get("meta", {}).get("llamaswap", {})
    return meta.get("modelID", entry["id"]) if meta.get("type") == "alias" else entry["id"]
