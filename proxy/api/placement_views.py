"""`/api/placement`: where models sit on the hardware `hardware:` describes, and whether one would fit now."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from proxy.api.views import api_key_required
from proxy.http.responses import allow_methods, json_error
from scheduling.door.questions import CanLoad, Placement


@api_key_required
@allow_methods("GET")
async def placement(request: HttpRequest, service) -> JsonResponse:
    """Each box's GPUs (memory, declared, counted and measured use, models), its CPU's, and each placed model's
    GPUs, declared and measured memory, protection and eviction cost. `placed_by_memory` is false without a
    `hardware:` section (then there are no boxes)."""
    boxes = await service.door.ask(Placement())
    return JsonResponse({"placed_by_memory": service.config.hardware is not None, "boxes": boxes})


@api_key_required
@allow_methods("GET")
async def can_load(request: HttpRequest, service, model: str) -> JsonResponse:
    """Whether `model` fits now, what its start would stop and what pinned or leased model blocks it."""
    config = service.config.resolve(model)
    if config is None:
        return json_error(404, f"model '{model}' is not configured", "model_not_found")
    answer = await service.door.ask(CanLoad(config.id))
    if answer is None:
        return json_error(503, f"no scheduler worker serving '{config.id}' answered; retry later", "scheduler_unreachable")
    return JsonResponse({"model": config.id, **answer})
