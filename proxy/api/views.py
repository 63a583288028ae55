"""Plain Django views for everything that is not a proxied model request."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from proxy.api import events_stream
from proxy.api.visibility import told_page
from proxy.serving.access import Caller, Denied, Need, route_refusal
from proxy.serving.key_cache import KEYS, caller_of
from proxy.config.secrets import shown_argv, shown_url
from proxy.serving.cross_site import CROSS_SITE_CODE, cross_site_refusal
from proxy.api.responses import allow_methods, json_error
from proxy.service import get_service
from scheduling.admin.not_found import admin_not_found
from scheduling.rows.activity import ActivityQuery, ActivityQueryError, activity_page
from scheduling.door.questions import Logs, LogsSince, RunningProcesses, Unload

# How often `/logs/stream` asks the scheduler for new log text while a client streams the logs.
LOG_POLL_S = 0.25


def api_key_required(view):
    """Protect a view with the API keys (the config's and the rows; none at all: open); any valid key reads.
    The caller is `request.caller`. It goes above `allow_methods`: a caller without the key learns nothing,
    not even which methods a route takes."""

    @functools.wraps(view)
    async def wrapper(request: HttpRequest, *args, **kwargs):
        service = get_service()
        caller = await caller_of({k.lower(): v for k, v in request.headers.items()}, service.config.api_keys)
        if isinstance(caller, Denied):
            return _denied(caller)
        request.caller = caller
        return await view(request, service, *args, **kwargs)

    return csrf_exempt(wrapper)


def operator_only(view):
    """A view only an operator key (or a config file apiKey) may call, whatever the method. It goes below
    `api_key_required`."""

    @functools.wraps(view)
    async def wrapper(request: HttpRequest, service, *args, **kwargs):
        if denied := route_refusal(request.caller, Need.OPERATOR):
            return refused_for(request.caller, _denied(denied))
        return await view(request, service, *args, **kwargs)

    return wrapper


def changes_state(*methods: str, need: Need = Need.OPERATOR):
    """A view that changes something when called with `methods`: those need a key that may do `need` (an
    operator's unless said) and, from a page on another origin, the key shown as Bearer or x-api-key, not the
    browser's saved Basic credentials (proxy.serving.cross_site). It goes below `api_key_required`."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, service, *args, **kwargs):
            if request.method in methods:
                if denied := route_refusal(request.caller, need):
                    return refused_for(request.caller, _denied(denied))
                headers = {k.lower(): v for k, v in request.headers.items()}
                refusal = cross_site_refusal(headers, request.caller)
                if refusal is not None:
                    return refused_for(request.caller, json_error(403, refusal, CROSS_SITE_CODE))
            return await view(request, service, *args, **kwargs)

        return wrapper

    return decorate


def refused_for(caller: Caller, response: HttpResponse) -> HttpResponse:
    """`response`, a refusal of what `caller`'s key may not do, counted for a row key's usage page and /metrics
    as a model request's refusal at the door is."""
    if caller.scope.name:
        KEYS.refused(caller.scope.name, response.status_code)
    return response


def _denied(denied: Denied) -> HttpResponse:
    return json_error(denied.status, denied.message, denied.code,
                      **{name.replace("-", "_"): value for name, value in denied.headers().items()})


@csrf_exempt  # machines probe it; an unsafe method gets a 405, not the CSRF page
@allow_methods("GET", "HEAD")
def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@allow_methods("GET")
async def running(request: HttpRequest, service) -> JsonResponse:
    items = []
    # A model a reload removed is listed until it has stopped, with the entry it was started with.
    for process in await service.door.ask(RunningProcesses()):
        if not request.caller.scope.sees_model(process.model):
            continue
        item = {"model": process.model, "state": process.state}
        if process.cmd is not None:
            item.update(cmd=" ".join(shown_argv(process.cmd)), proxy=shown_url(process.proxy), ttl=process.ttl,
                        name=process.name, description=process.description)
        items.append(item)
    return JsonResponse({"running": items})


async def _unload(service, models: list[str] | None) -> None:
    """Stop the models now (None: all), as llama-swap does: requests they serve are cut with a clear
    error. Returns once their processes are gone (each stop is bounded by its unloadTimeout)."""
    await service.door.ask(Unload(None if models is None else tuple(models)))


@api_key_required
@changes_state("GET")
@allow_methods("GET")
async def unload_all_legacy(request: HttpRequest, service) -> HttpResponse:
    await _unload(service, None)
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@changes_state("POST")
@allow_methods("POST")
async def unload_all(request: HttpRequest, service) -> JsonResponse:
    await _unload(service, None)
    return JsonResponse({"msg": "ok"})


@api_key_required
@changes_state("POST")
@allow_methods("POST")
async def unload_model(request: HttpRequest, service, model: str) -> HttpResponse:
    config = service.config.resolve(model)
    if config is None:
        return json_error(404, f"model '{model}' is not configured", "model_not_found")
    await _unload(service, [config.id])
    return HttpResponse("OK", content_type="text/plain")


@api_key_required
@operator_only
@allow_methods("GET")
async def logs(request: HttpRequest, service) -> HttpResponse:
    return HttpResponse(await service.door.ask(Logs()), content_type="text/plain; charset=utf-8")


@api_key_required
@operator_only
@allow_methods("GET")
async def logs_stream(request: HttpRequest, service, model: str | None = None) -> HttpResponse:
    model_id = None
    if model is not None:
        config = service.config.resolve(model)
        model_id = model if config is None else config.id  # a model a reload removed keeps its log
    return await _logs_stream(service.door, model, model_id, "no-history" not in request.GET)


async def _logs_stream(door, model: str | None, model_id: str | None, history: bool) -> HttpResponse:
    """`/logs/stream`: the text new in the logs, asked for every LOG_POLL_S for as long as the client
    stays (its leaving cancels the loop). A scheduler that does not answer (a worker, in distributed
    mode) is reported in the stream, which keeps asking."""
    try:
        first, failure = await door.ask(LogsSince({}, model_id)), None
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
                for name, piece in answer.items():
                    cursors[name] = piece.cursor
                    if piece.text and shown:
                        yield piece.text
                        line_start = piece.text.endswith("\n")
                shown = True
            await asyncio.sleep(LOG_POLL_S)
            try:
                answer, error = await door.ask(LogsSince(cursors, model_id)), None
            except Exception as exc:  # Redis or the worker is away: say so once, then keep asking
                error = exc

    return _text_stream(pieces())


@api_key_required
@allow_methods("GET")
async def api_events(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/events`: llama-swap's Server-Sent Events (see proxy.api.events_stream), of what the key may
    see (proxy.api.visibility); the models' log text only for an operator key, as `/logs`."""
    stream = events_stream.EventStream(service, viewer=request.caller.scope)
    first = await stream.first()  # the scheduler or the database away: 503 (proxy.api.unavailable), not a stream
    response = StreamingHttpResponse(events_stream.events(stream, first), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must pass each event on as it comes
    return response


def _unknown_log(model: str) -> HttpResponse:
    return json_error(400, f"no log named '{model}': use a model id", "unknown_log")


def _text_stream(pieces) -> StreamingHttpResponse:
    response = StreamingHttpResponse(pieces, content_type="text/plain; charset=utf-8")
    response["X-Accel-Buffering"] = "no"  # a proxy in front must pass each piece on as it comes
    return response


# Django's own 400s in words of our own: its messages name files and settings (a static path that
# climbs out of its folder is answered with the absolute paths of the install), and any client,
# without a key, may ask. The log keeps Django's message for the operator.
_BAD_REQUESTS = {
    "SuspiciousFileOperation": "the path leads outside the folder it names",
    "RequestDataTooBig": "the request body is too large for this route",
    "TooManyFieldsSent": "the request has too many form fields",
    "TooManyFilesSent": "the request has too many files",
    "DisallowedHost": "the Host header names no host this server answers to (LLAMASWAP_ALLOWED_HOSTS)",
}


def bad_request(request: HttpRequest, exception=None) -> HttpResponse:
    """Django's own 400s (a suspicious path, a form too large) as JSON too, saying what was wrong in general terms."""
    reason = _BAD_REQUESTS.get(type(exception).__name__, "the request cannot be served as sent")
    return json_error(400, f"bad request: {reason}", "bad_request")


def not_found(request: HttpRequest, exception=None) -> HttpResponse:
    """An unknown route: the OpenAI-shaped error API clients read; under /admin/, the admin's own page."""
    if request.path.startswith("/admin/"):
        return admin_not_found(request)
    return json_error(404, f"no route {request.path}", "route_not_found")


def server_error(request: HttpRequest) -> HttpResponse:
    return json_error(500, "llamaswap hit an unexpected error; see its log", "internal_error")


@api_key_required
@allow_methods("GET")
async def activity(request: HttpRequest, service) -> HttpResponse:
    """`GET /api/activity`: the request history as JSON; a key that is not an operator's reads its own requests."""
    try:
        query = ActivityQuery.from_params(request.GET)
    except ActivityQueryError as exc:
        return json_error(400, str(exc), "invalid_parameter")
    owner = request.caller.scope.owner_filter()
    if owner is not None:
        if query.keys and owner not in query.keys:
            return JsonResponse({"data": [], "next_before_id": None})
        query = replace(query, keys=(owner,))
    return JsonResponse(told_page(request.caller.scope, await sync_to_async(activity_page)(query)))
