"""The page django-axes answers a locked-out admin login with: the admin's own look, and how to lift the lock."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from axes.helpers import get_client_username, get_cool_off, get_failure_limit


def locked_out(request: HttpRequest, original_response=None, credentials: dict | None = None) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: 429 with the admin's header, the limit, the cool-off and the unlock command.
    Rendered here: it is answered from a middleware, after the views' template responses are rendered."""
    cool_off = get_cool_off(request)
    context = {
        **admin.site.each_context(request),
        "title": "Login refused",
        "failure_limit": get_failure_limit(request, credentials),
        "username": get_client_username(request, credentials) or "",
        "cooloff": _duration(cool_off) if cool_off else "",
    }
    return render(request, "admin/scheduling/login_locked.html", context, status=429)


def _duration(span: timedelta) -> str:
    seconds = round(span.total_seconds())
    for size, unit in ((3600, "hour"), (60, "minute")):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count > 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"
