"""The admin's Batches page: OpenAI Batch API batches (made and run through `/v1/batches`), each with its
progress, its predicted time left, a link to its lines' outcomes, and a cancel action that does what
`POST /v1/batches/<id>/cancel` does."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html

from scheduling.admin.read_only import ReadOnly
from scheduling.door import frontdoor
from scheduling.door.queue_entries import seconds_in_words
from scheduling.models import Batch, BatchRequest
from scheduling.operating.batch_progress import counted, of_row, time_left_question
from scheduling.rows.batch_status import cancel


@admin.register(Batch)
class BatchAdmin(ReadOnly):
    list_display = ("id", "status", "endpoint", "model", "priority", "api_key", "progress", "time_left", "lines",
                    "created_at", "expires_at")
    list_filter = ("status", "endpoint")
    search_fields = ("id", "input_file_id", "model")
    actions = ("cancel_batches",)

    def get_queryset(self, request: HttpRequest):
        return counted(super().get_queryset(request))

    def get_list_display(self, request: HttpRequest):
        shown = super().get_list_display(request)
        return (*shown, "cancel_button") if self.has_cancel_permission(request) else shown

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancelling changes a batch: the change permission the page itself does without."""
        return request.user.has_perm("scheduling.change_batch")

    @admin.display(description="progress", ordering="total_count")
    def progress(self, obj: Batch):
        shown = of_row(obj)
        ended = shown.succeeded + shown.failed
        return format_html('<progress value="{}" max="{}"></progress> <span class="counts">{} done, {} failed, '
                           '{} total</span>', ended, max(shown.total, 1), shown.succeeded, shown.failed, shown.total)

    @admin.display(description="time left")
    def time_left(self, obj: Batch) -> str:
        """The scheduler's prediction (see `batch_progress`); — when there is nothing to predict."""
        door = frontdoor.installed()
        question = None if door is None else time_left_question(door.config, of_row(obj))
        if question is None:
            return "—"
        try:
            seconds = door.ask_now(question)
        except frontdoor.Unanswered:
            return "unknown: the scheduler did not answer"
        return "unknown: no job of its model finished yet" if seconds is None else seconds_in_words(seconds)

    @admin.display(description="lines")
    def lines(self, obj: Batch):
        url = reverse("admin:scheduling_batchrequest_changelist") + "?" + urlencode({"batch": obj.id})
        return format_html('<a href="{}">each line</a>', url)

    @admin.display(description="")
    def cancel_button(self, obj: Batch):
        if obj.status not in ("validating", "in_progress"):
            return ""
        # Inside the list's form (which carries the CSRF token), sent to the cancel view instead.
        return format_html('<button type="submit" class="cancel-batch" formaction="{}">Cancel</button>',
                           reverse("admin:scheduling_batch_cancel", args=[obj.id]))

    @admin.action(description="Cancel the selected batches", permissions=("cancel",))
    def cancel_batches(self, request: HttpRequest, queryset) -> None:
        self._cancelled(request, list(queryset.values_list("id", flat=True)))

    def get_urls(self):
        return [path("<path:batch_id>/cancel/", self.admin_site.admin_view(self.cancel_view),
                     name="scheduling_batch_cancel"), *super().get_urls()]

    def cancel_view(self, request: HttpRequest, batch_id: str):
        if request.method != "POST" or not self.has_cancel_permission(request):
            raise PermissionDenied
        self._cancelled(request, [batch_id])
        return HttpResponseRedirect(reverse("admin:scheduling_batch_changelist"))

    def _cancelled(self, request: HttpRequest, batch_ids: list[str]) -> None:
        done = [batch_id for batch_id in batch_ids if cancel(batch_id)]
        if done:
            self.message_user(request, f"Cancelling {', '.join(done)}: no further line is sent; those at the model "
                                       "finish, then the batch is cancelled.", messages.SUCCESS)
        if left := [batch_id for batch_id in batch_ids if batch_id not in done]:
            self.message_user(request, f"{', '.join(left)} not running (ended or already cancelling); left alone.",
                              messages.WARNING)


@admin.register(BatchRequest)
class BatchRequestAdmin(ReadOnly):
    """Each line of a batch and how it ended; reached from a batch's `each line` link."""

    list_display = ("batch", "line", "custom_id", "state", "outcome", "attempts", "ended_at")
    list_filter = ("state",)
    search_fields = ("custom_id",)
    ordering = ("batch", "line")
    show_full_result_count = False
    list_per_page = 100

    def lookup_allowed(self, lookup: str, value, request=None) -> bool:
        return lookup == "batch" or super().lookup_allowed(lookup, value, request)

    @admin.display(description="outcome")
    def outcome(self, obj: BatchRequest) -> str:
        """The model's HTTP status, or the error's code for a line that never reached it."""
        if not obj.result:
            return "—"
        result = json.loads(obj.result)
        if result.get("error"):
            return result["error"].get("code") or "error"
        response = result.get("response") or {}
        body = response.get("body")
        code = body.get("error", {}).get("code") if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
        return f"{response.get('status_code')} {code}" if code else str(response.get("status_code"))

