"""The admin's own page for an address under /admin/ that leads nowhere: a person in a browser gets the admin's look
and a way back, not the JSON error API clients get for other unknown routes."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def admin_not_found(request: HttpRequest) -> HttpResponse:
    """404 in the admin's look, naming the address; rendered here, as Django answers a 404 outside any view."""
    context = {**admin.site.each_context(request), "title": "Page not found", "path": request.path}
    return render(request, "admin/scheduling/not_found.html", context, status=404)
