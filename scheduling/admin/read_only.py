"""A page of rows the service writes and the admin only shows: no add, change or delete."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest


class ReadOnly(admin.ModelAdmin):
    """Rows the API or the service writes: the admin only shows them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
