"""JSON error responses for Django views, in the same OpenAI shape the proxied routes use."""

from __future__ import annotations

import functools

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse

from proxy.serving.errors import error_body


def json_error(status: int, message: str, code: str | None = None, **headers: str) -> HttpResponse:
    response = HttpResponse(error_body(status, message, code), status=status, content_type="application/json")
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def allow_methods(*methods: str):
    """Like Django's require_http_methods, but the 405 is an OpenAI-shaped error API clients can read."""

    def refusal(request: HttpRequest) -> HttpResponse | None:
        if request.method in methods:
            return None
        allowed = " or ".join(methods)
        return json_error(405, f"{request.path} accepts {allowed} only", "method_not_allowed", Allow=", ".join(methods))

    def decorate(view):
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args, **kwargs):
                refused = refusal(request)
                return refused if refused is not None else await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            refused = refusal(request)
            return refused if refused is not None else view(request, *args, **kwargs)

        return wrapper

    return decorate
