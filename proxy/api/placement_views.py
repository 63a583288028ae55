"""`/api/placement`: where models sit on the hardware `hardware:` describes, and whether one would fit now."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from proxy.api.views import api_key_required, refused_for
from proxy.api.visibility import shown_boxes, shown_models
from proxy.api.responses import allow_methods, json_error
from scheduling.door.questions import CanLoad, Placement


@api_key_required
@allow_methods("GET")
async def placement(request: HttpRequest, service) -> JsonResponse:
    """Each box's GPUs (memory, declared, counted and measured use, models), its CPU's, and each placed model's
    GPUs, declared and measured memory, protection and eviction cost. `placed_by_memory` is false without a
    `hardware:` section (then there are no boxes). A key that is not an operator's is told of its models only."""
    boxes = shown_boxes(request.caller.scope, await service.door.ask(Placement()))
    return JsonResponse({"placed_by_memory": service.config.hardware is not None, "boxes": boxes})


@api_key_required
@allow_methods("GET")
async def can_load(request: HttpRequest, service, model: str) -> JsonResponse:
    """Whether `model` fits now, what its start would stop and what pinned or leased model blocks it: of a model
    the key may use, naming only the models it may see (`fits_now` still counts every model)."""
    config, scope = service.config.resolve(model), request.caller.scope
    if not scope.sees_model(model if config is None else config.id):  # configured or not: the same answer
        return refused_for(request.caller, json_error(403, f"the API key '{scope.name}' may not use model '{model}'",
                                                      "model_not_allowed"))
    if config is None:
        return json_error(404, f"model '{model}' is not configured", "model_not_found")
    answer = await service.door.ask(CanLoad(config.id))
    if answer is None:
        return json_error(503, f"no scheduler worker serving '{config.id}' answered; retry later", "scheduler_unreachable")
    answer = {**answer, **{name: shown_models(scope, answer[name]) for name in ("would_evict", "blocked_by")}}
    return JsonResponse({"model": config.id, **answer})
