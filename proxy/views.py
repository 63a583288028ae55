"""Plain Django views for everything that is not a proxied model request."""

from __future__ import annotations

import asyncio
import functools
import time

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from proxy import events_stream
from proxy.active_profile import active_profile
from proxy.auth import is_authorized
from proxy.model_listing import add_capabilities, alias_entries
from proxy.model_choice import listed_choices
from proxy.peer_relay import listed_peer_models
from proxy.responses import allow_methods, json_error
from proxy.service import get_service
from scheduling.activity import ActivityQuery, ActivityQueryError, activity_page

# How often a front end asks the worker for new log text while a client streams its logs.
WORKER_LOG_POLL_S = 0.25


def api_key_required(view):
    """Protect a view with the configured apiKeys (no keys configured: open). It goes above
    `allow_methods`: a caller without the key learns nothing, not even which methods a route takes."""

    @functools.wraps(view)
    async def wrapper(request: HttpRequest, *args, **kwargs):
        service = get_service()
        headers = {k.lower(): v for k, v in request.headers.items()}
        if not is_authorized(headers, service.config.api_keys):
            return json_error(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                "invalid_api_key",
                WWW_Authenticate='Basic realm="llamaswap"',
            )
        return await view(request, service, *args, **kwargs)

    return csrf_exempt(wrapper)


@csrf_exempt  # machines probe it; an unsafe method gets a 405, not the CSRF page
@allow_methods("GET", "HEAD")
def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@allow_methods("GET")
async def list_models(request: HttpRequest, service) -> JsonResponse:
    created = int(time.time())
    data = []
    states = await service.door.processes()
    for model_id, model in service.config.models.items():
        if model.unlisted:
            continue
        state = states.get(model_id, "stopped")
        data.append(
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "llamaswap",
                "name": model.name,
                "description": model.description,
                "status": {"value": "unloaded" if state == "stopped" else "loaded"},
                "meta": {"llamaswap": {"type": "model", "aliases": list(model.aliases), **dict(model.metadata)}},
            }
        )
        add_capabilities(data[-1], model.capabilities)
        if service.config.include_aliases_in_list:
            data += alias_entries(data[-1], model)
    data += listed_peer_models(service.config, created)
    profile = await active_profile(service.config)
    data += listed_choices(service.config, profile, states, created, {entry["id"] for entry in data})
    data.sort(key=lambda entry: entry["id"])  # as llama-swap lists them
    response = JsonResponse({"object": "list", "data": data})
    if "Origin" in request.headers:  # a web page on another origin may read the list, as with llama-swap
        response["Access-Control-Allow-Origin"] = request.headers["Origin"]
    return response


@api_key_required
@allow_methods("GET")
async def running(request: HttpRequest, service) -> JsonResponse:
    items = []
    for model_id, state in (await service.door.processes()).items():
        if state == "stopped":
            continue
        # A model a reload removed is listed until it has stopped, with the entry it was started with.
        model = service.fleet.entry(model_id) if service.fleet is not None else service.config.models.get(model_id)
        item = {"model": model_id, "state": state}
        if model is not None:
            item.update(cmd=" ".join(model.cmd), proxy=model.proxy, ttl=model.ttl, name=model.name,
                        description=model.description)
        items.append(item)
    return JsonResponse({"running": items})


async def _unload(service, models: list[str] | None) -> None:
    """Stop the models now (None: all), as llama-swap does: requests they serve are cut with a clear
    error. Returns once their processes are gone (each stop is bounded by its unloadTimeout)."""
    await service.door.unload(models)


@api_key_required
@allow_methods("GET")
async def unload_all_legacy(request: HttpRequest, service) -> HttpResponse:
    await _unload(service, None)
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@allow_methods("POST")
async def unload_all(request: HttpRequest, service) -> JsonResponse:
    await _unload(service, None)
    return JsonResponse({"msg": "ok"})


@api_key_required
@allow_methods("POST")
async def unload_model(request: HttpRequest, service, model: str) -> HttpResponse:
    config = service.config.resolve(model)
    if config is None:
        return json_error(404, f"model '{model}' is not configured", "model_not_found")
    await _unload(service, [config.id])
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@allow_methods("GET")
async def logs(request: HttpRequest, service) -> HttpResponse:
    return HttpResponse(await service.door.logs(), content_type="text/plain; charset=utf-8")


@api_key_required
@allow_methods("GET")
async def logs_stream(request: HttpRequest, service, model: str | None = None) -> HttpResponse:
    model_id = None
    if model is not None:
        config = service.config.resolve(model)
        model_id = model if config is None else config.id  # a model a reload removed keeps its log
    history = "no-history" not in request.GET
    if service.fleet is None:
        return await _worker_logs_stream(service.door, model, model_id, history)
    if model_id is None:
        rings = dict(service.fleet.logs)
    elif model_id not in service.fleet.logs:
        return _unknown_log(model)
    else:
        rings = {model_id: service.fleet.logs[model_id]}

    async def lines():
        queues = {model_id: ring.subscribe() for model_id, ring in rings.items()}
        try:
            yield ""  # the headers go out now, not with the first text (which may be long in coming)
            if history:
                for ring in rings.values():
                    if ring.text():
                        yield ring.text()
            merged: asyncio.Queue[str] = asyncio.Queue()

            async def pump(q):
                while True:
                    await merged.put(await q.get())

            pumps = [asyncio.ensure_future(pump(q)) for q in queues.values()]
            try:
                while True:
                    yield await merged.get()
            finally:
                for task in pumps:
                    task.cancel()
        finally:
            for model_id, q in queues.items():
                rings[model_id].unsubscribe(q)

    return _text_stream(lines())


async def _worker_logs_stream(door, model: str | None, model_id: str | None, history: bool) -> HttpResponse:
    """`/logs/stream` on a front end: the logs are the worker's, so the front end asks it for what is
    new every WORKER_LOG_POLL_S for as long as the client stays (its leaving cancels the loop). A
    worker that does not answer is reported in the stream, which keeps asking."""
    try:
        first, failure = await door.logs_since({}, model_id), None
    except Exception as exc:  # reported in the stream
        first, failure = None, exc
    if model_id is not None and first == {}:
        return _unknown_log(model)

    async def pieces():
        answer, error, cursors = first, failure, {}
        shown = history  # without history, the first answer only places the cursors
        unreachable, line_start = False, True
        yield ""  # the headers now
        while True:
            if (error is not None) != unreachable:
                unreachable = error is not None
                notice = f"{error}; asking again" if unreachable else "the scheduler worker answers again"
                yield ("" if line_start else "\n") + f"llamaswap: {notice}\n"
                line_start = True
            if error is None:
                for name, (text, cursor) in answer.items():
                    cursors[name] = cursor
                    if text and shown:
                        yield text
                        line_start = text.endswith("\n")
                shown = True
            await asyncio.sleep(WORKER_LOG_POLL_S)
            try:
                answer, error = await door.logs_since(cursors, model_id), None
            except Exception as exc:  # Redis or the worker is away: say so once, then keep asking
                error = exc

    return _text_stream(pieces())


@api_key_required
@allow_methods("GET")
async def api_events(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/events`: llama-swap's Server-Sent Events (see proxy.events_stream)."""
    response = StreamingHttpResponse(events_stream.events(service), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must pass each event on as it comes
    return response


def _unknown_log(model: str) -> HttpResponse:
    return json_error(400, f"no log named '{model}': use a model id", "unknown_log")


def _text_stream(pieces) -> StreamingHttpResponse:
    response = StreamingHttpResponse(pieces, content_type="text/plain; charset=utf-8")
    response["X-Accel-Buffering"] = "no"  # a proxy in front must pass each piece on as it comes
    return response


def bad_request(request: HttpRequest, exception=None) -> HttpResponse:
    """Django's own 400s (a Host not in LLAMASWAP_ALLOWED_HOSTS, a suspicious path) as JSON too."""
    return json_error(400, str(exception) if exception else "bad request", "bad_request")


def not_found(request: HttpRequest, exception=None) -> HttpResponse:
    return json_error(404, f"no route {request.path}", "route_not_found")


def server_error(request: HttpRequest) -> HttpResponse:
    return json_error(500, "llamaswap hit an unexpected error; see its log", "internal_error")


@api_key_required
@allow_methods("GET")
async def activity(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/activity`: the request history as JSON."""
    try:
        query = ActivityQuery.from_params(request.GET)
    except ActivityQueryError as exc:
        return json_error(400, str(exc), "invalid_parameter")
    return JsonResponse(await sync_to_async(activity_page)(query))
