"""The admin's Batches page: OpenAI Batch API batches, read-only (they are made, cancelled and run through
`/v1/batches`), each with how many of its lines ended."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, Q
from django.http import HttpRequest

from scheduling.models import Batch


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "endpoint", "model", "priority", "api_key", "lines", "succeeded", "failed",
                    "created_at", "expires_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "input_file_id", "model")

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(
            line_count=Count("requests"), succeeded_count=Count("requests", filter=Q(requests__state="succeeded")),
            failed_count=Count("requests", filter=Q(requests__state="failed")))

    @admin.display(ordering="line_count")
    def lines(self, obj: Batch) -> int:
        return obj.line_count

    @admin.display(ordering="succeeded_count")
    def succeeded(self, obj: Batch) -> int:
        return obj.succeeded_count

    @admin.display(ordering="failed_count")
    def failed(self, obj: Batch) -> int:
        return obj.failed_count

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
