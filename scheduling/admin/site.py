"""The admin site's look and its main pages: the live queue, the models, the scheduler settings and the request history.

The queue and models pages read the running scheduler through its front door (`scheduling.door.frontdoor`),
not the database, so they show what the scheduler will do next. The history is
read-only and built to stay fast on millions of rows: no full COUNT, and only
indexed orderings.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from scheduling.core.mentions import plain
from scheduling.door import frontdoor

from scheduling.operating import overview, placement_page, settings_preview
from scheduling.admin.forms import PriorityForm, SchedulerSettingsForm, config_or_problem
from scheduling.admin.read_only import ReadOnly
from scheduling.rows.history import CappedCountPaginator, HistoryQuerySet, search_requests
from scheduling.models import (
    ApiKey,
    ConfiguredModel,
    QueuedRequest,
    SchedulerSettings,
    SettingsChange,
    WaitingRequest,
)
from scheduling.tickets import RequestState
from scheduling.door.questions import BusyModels, Cancel, Processes, Queue, Reprioritize, Snapshot, Unload, Waiting
from scheduling.operating.settings_store import as_text, ignored_slot_lines, ignored_values, override_source, save_settings
from scheduling.whole_numbers import whole_number


admin.site.site_header = "llamaswap"
admin.site.site_title = "llamaswap admin"
admin.site.index_title = "llamaswap administration"
admin.site.index_template = "admin/scheduling/index.html"  # the Overview first

_NO_ANSWER = "The scheduler did not answer within 5 s (its event loop is busy or stuck); try again, and check the log."


def _seconds(ms: int | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.1f} s"


def _ticket_list(ids) -> str:
    return ", ".join(f"#{tid}" for tid in ids)


def _changelist_url(model) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")


class LivePageAdmin(admin.ModelAdmin):
    """An admin entry that is one custom page (no add/change/delete pages), drawn from the running service."""

    template_name = ""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def get_urls(self):
        opts = self.model._meta
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name=f"{opts.app_label}_{opts.model_name}_changelist",
            )
        ]

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            door = frontdoor.required()
        except frontdoor.NotServing as exc:
            door, unavailable = None, str(exc)
        else:
            unavailable = None
        try:
            if request.method == "POST":
                if not self.has_change_permission(request):
                    raise PermissionDenied
                if door is None:
                    self.message_user(request, unavailable, messages.ERROR)
                    return HttpResponseRedirect(request.path)
                return self.act(request, door)
            page = self.page_context(request, door) if door is not None else {}
        except frontdoor.Unanswered:
            page, unavailable = {}, _NO_ANSWER
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": self.model._meta.verbose_name_plural.capitalize(),
            "unavailable": unavailable,
            "can_change": self.has_change_permission(request),
            **page,
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.template_name, context)

    def page_context(self, request: HttpRequest, door: frontdoor.FrontDoor) -> dict:
        raise NotImplementedError

    def act(self, request: HttpRequest, door: frontdoor.FrontDoor) -> HttpResponse:
        raise NotImplementedError


def _selected_tickets(request: HttpRequest) -> list[int]:
    return sorted({ticket for ticket in map(whole_number, request.POST.getlist("ticket")) if ticket is not None})


@admin.register(WaitingRequest)
class WaitingRequestAdmin(LivePageAdmin):
    """The queue right now, ranked by current score; cancel or re-prioritize waiting requests."""

    template_name = "admin/scheduling/waitingrequest/queue.html"

    def page_context(self, request: HttpRequest, door: frontdoor.FrontDoor) -> dict:
        snapshot = door.ask_now(Snapshot())
        entries = door.ask_now(Waiting())
        # Ranked by score now; the forecast's place and wait (as /api/queue tells them) beside each.
        predicted = {entry.ticket_id: replace(entry, outlook=plain(entry.outlook)) for entry in door.ask_now(Queue())}
        return {
            "entries": entries,
            "rows": [(entry, predicted.get(entry.ticket_id)) for entry in entries],
            "busy_models": door.ask_now(BusyModels()),
            "scheduler": door.config.scheduler.use,
            "settings_in_use": snapshot.settings,
            "starting": snapshot.starting,
            "history_url": _changelist_url(QueuedRequest),
        }

    def act(self, request: HttpRequest, door: frontdoor.FrontDoor) -> HttpResponse:
        tickets = _selected_tickets(request)
        action = request.POST.get("action")
        if not tickets:
            self.message_user(request, "Select at least one waiting request first.", messages.WARNING)
            return HttpResponseRedirect(request.path)
        if action == "cancel":
            cancelled = door.ask_now(Cancel(tuple(tickets)))
            if cancelled:
                self.message_user(
                    request,
                    f"Cancelled {_ticket_list(cancelled)}; their clients were told an operator cancelled them.",
                    messages.SUCCESS,
                )
            self._report_gone(request, tickets, cancelled)
            return HttpResponseRedirect(request.path)
        if action == "reprioritize":
            return self._reprioritize(request, door, tickets)
        self.message_user(request, "Choose an action: cancel, or change priority.", messages.WARNING)
        return HttpResponseRedirect(request.path)

    def _reprioritize(self, request: HttpRequest, door: frontdoor.FrontDoor, tickets: list[int]) -> HttpResponse:
        form = PriorityForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            priority = form.cleaned_data["priority"]
            changed = door.ask_now(Reprioritize(tuple(tickets), priority))
            if changed:
                self.message_user(
                    request, f"{_ticket_list(changed)} now at priority {priority} and re-ranked.", messages.SUCCESS
                )
            self._report_gone(request, tickets, changed)
            return HttpResponseRedirect(request.path)
        selected = [entry for entry in door.ask_now(Waiting()) if entry.ticket_id in tickets]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Change the priority of waiting requests",
            "form": form,
            "tickets": tickets,
            "selected": selected,
        }
        return TemplateResponse(request, "admin/scheduling/waitingrequest/reprioritize.html", context)

    def _report_gone(self, request: HttpRequest, asked: list[int], done: list[int]) -> None:
        gone = [tid for tid in asked if tid not in done]
        if gone:
            self.message_user(
                request, f"{_ticket_list(gone)} no longer waiting (already dispatched or gone); left alone.",
                messages.WARNING,
            )


@admin.register(ConfiguredModel)
class ConfiguredModelAdmin(LivePageAdmin):
    """The configured models with their process state and last use, and with `hardware:` where they sit
    (`placement_page`); unload them."""

    template_name = "admin/scheduling/configuredmodel/models.html"

    def page_context(self, request: HttpRequest, door: frontdoor.FrontDoor) -> dict:
        try:
            states, unanswered = door.ask_now(Processes()), ""
        except frontdoor.Unanswered as exc:  # the configured models are still worth listing
            states, unanswered = {}, str(exc) or _NO_ANSWER
        rows = [
            {
                "id": model_id,
                "model": model,
                # "no worker": in distributed mode, its box's worker is down
                "state": states.get(model_id, "no answer" if unanswered else "no worker"),
                "last_used": _last_used(model_id),
                "history_url": f"{_changelist_url(QueuedRequest)}?{urlencode({'model': model_id})}",
            }
            for model_id, model in door.config.models.items()
        ]
        return {"rows": rows, "unanswered": unanswered, **placement_page.section(door, unanswered, _NO_ANSWER)}

    def act(self, request: HttpRequest, door: frontdoor.FrontDoor) -> HttpResponse:
        wanted = request.POST.getlist("model")
        unknown = [m for m in wanted if m not in door.config.models]
        if not wanted or unknown:
            self.message_user(request, f"No configured model named {', '.join(unknown) or 'in the request'}.",
                              messages.ERROR)
            return HttpResponseRedirect(request.path)
        door.ask_now(Unload(tuple(wanted), wait=False))
        self.message_user(
            request,
            f"Unloading {', '.join(wanted)} now; running requests on {'it' if len(wanted) == 1 else 'them'} "
            "are cut (their clients get a 503 saying an operator unloaded the model).",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(request.path)


def _last_used(model: str):
    """When the model last finished a request (walks the model's newest rows through its index)."""
    return (
        QueuedRequest.objects.filter(model=model, finished_at__isnull=False)
        .order_by("-arrived_at")
        .values_list("finished_at", flat=True)
        .first()
    )


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    """One page: the serial scheduler's overrides, where each value comes from, and what is in use."""

    form = SchedulerSettingsForm

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context=None) -> HttpResponse:
        SchedulerSettings.load()
        return HttpResponseRedirect(reverse("admin:scheduling_schedulersettings_change", args=[1]))

    def change_view(self, request: HttpRequest, object_id, form_url="", extra_context=None) -> HttpResponse:
        stored = SchedulerSettings.load()
        window = settings_preview.chosen_window(request.POST.get("preview_window"))
        context = {**(extra_context or {}), **self._overview(stored),
                   "preview_windows": settings_preview.WINDOWS, "preview_window": window}
        if request.method == "POST" and "_preview" in request.POST:
            form = self.get_form(request, stored, change=True)(request.POST, instance=SchedulerSettings.load())
            if form.is_valid():
                return self._preview_page(request, form, window, form_url, context)
        # An invalid preview takes Save's path, which shows the same errors and saves nothing.
        return super().change_view(request, str(stored.pk), form_url, context)

    def _preview_page(self, request: HttpRequest, form, window: str, form_url: str, context: dict) -> HttpResponse:
        """The page again with the values as typed and what they would have done; nothing saved or audited."""
        edited = form.instance  # the proposed values, unsaved
        admin_form = helpers.AdminForm(form, list(self.get_fieldsets(request, edited)), {}, model_admin=self)
        context.update(
            self.admin_site.each_context(request),
            title=f"Change {self.opts.verbose_name}", subtitle=str(edited), adminform=admin_form,
            object_id=str(edited.pk), original=edited, is_popup=False, to_field=None, inline_admin_formsets=[],
            media=self.media + admin_form.media, errors=helpers.AdminErrorList(form, []),
            preserved_filters=self.get_preserved_filters(request),
            preview=settings_preview.preview(edited, window, timezone.now()),
        )
        return self.render_change_form(request, context, change=True, obj=edited, form_url=form_url)

    def save_model(self, request: HttpRequest, obj: SchedulerSettings, form, change: bool) -> None:
        save_settings(obj, request.user.get_username())
        if frontdoor.installed() is None:
            self.message_user(
                request,
                "No scheduler runs in this process: `llamaswap serve` applies the new values when it next starts.",
                messages.WARNING,
            )

    def _overview(self, stored: SchedulerSettings) -> dict:
        config, problem = config_or_problem()
        door = frontdoor.installed()
        in_use = door.ask_now(Snapshot()).settings if door is not None else None
        rows = []
        for field, name in SchedulerSettings.CONFIG_NAMES.items():
            rows.append(
                {
                    "name": name,
                    "config": as_text(getattr(config.scheduler.serial, field)) if config else "unknown",
                    "override": as_text(getattr(stored, field)),
                    "source": override_source(stored, field),
                    "in_use": as_text(getattr(in_use, field)) if in_use else None,
                }
            )
        return {
            "scheduler_in_use": config.scheduler.use if config else None,
            "config_problem": problem,
            "setting_rows": rows,
            "service_running": door is not None,
            "ignored_values": [
                f"{SchedulerSettings.CONFIG_NAMES[field]}: {as_text(getattr(stored, field))} — {why}"
                for field, why in ignored_values(stored).items()
            ],
            "ignored_slots": ignored_slot_lines(stored.slots, config.models if config else None),
            "audit_url": _changelist_url(SettingsChange),
        }


@admin.register(SettingsChange)
class SettingsChangeAdmin(ReadOnly):
    """The audit trail of settings edits: read-only, nobody can rewrite it."""

    list_display = ("changed_at", "changed_by", "setting", "old", "new")
    list_filter = ("setting", "changed_by")
    date_hierarchy = "changed_at"

    @admin.display(description="old value")
    def old(self, obj: SettingsChange) -> str:
        return SettingsChange.shown(obj.old_value)

    @admin.display(description="new value")
    def new(self, obj: SettingsChange) -> str:
        return SettingsChange.shown(obj.new_value)


class ConfiguredModelFilter(admin.SimpleListFilter):
    """The models from the config, so the filter never scans the table for distinct names."""

    title = "model"
    parameter_name = "model"

    def lookups(self, request: HttpRequest, model_admin):
        config, _ = config_or_problem()
        if config is not None:
            names = [*config.models, *(peer.qualified(model) for peer in config.peers.values() for model in peer.models)]
        else:
            names = QueuedRequest.objects.order_by("model").values_list("model", flat=True).distinct()
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset):
        return queryset.filter(model=self.value()) if self.value() else queryset


class ApiKeyFilter(admin.SimpleListFilter):
    """The key rows' names (the table is small, so the filter never scans the history for distinct names), and
    the requests sent with no row key: with a config file apiKey, or to an open server."""

    title = "API key"
    parameter_name = "api_key"
    NO_ROW_KEY = "(none)"  # not a key's name: names start with a letter or digit

    def lookups(self, request: HttpRequest, model_admin):
        names = ApiKey.objects.order_by("name").values_list("name", flat=True)
        return [*((name, name) for name in names), (self.NO_ROW_KEY, "no row key (config file key, or open)")]

    def queryset(self, request: HttpRequest, queryset):
        if not self.value():
            return queryset
        return queryset.filter(api_key="" if self.value() == self.NO_ROW_KEY else self.value())


@admin.register(QueuedRequest)
class QueuedRequestAdmin(admin.ModelAdmin):
    """Every request with its decision; read-only, and only superusers may prune it."""

    list_display = (
        "id", "arrived_at", "model", "api_key", "band", "priority", "state", "score", "queue_wait", "duration",
        "output_tokens",
    )
    list_filter = ("state", "band", ConfiguredModelFilter, ApiKeyFilter, ("arrived_at", admin.DateFieldListFilter))
    search_fields = ("=id", "^model")  # served by search_requests, through the indexes
    search_help_text = "An exact request id, or the start of a model name."
    date_hierarchy = "arrived_at"
    ordering = ("-arrived_at",)  # every filter's index ends in arrived_at, so no filter needs a sort
    sortable_by = ("id", "arrived_at")
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # per-choice counts would scan the table
    paginator = CappedCountPaginator
    list_per_page = 100
    readonly_fields = ("why", "timeline", "tokens", "runner_up", "error_text", "waited_because_text", "explanation_text")
    fieldsets = (
        ("Why it ran when it did", {"fields": ("why", "timeline", "tokens")}),
        (
            "Request",
            {"fields": ("id", "model", "requested_model", "selector", "peer", "method", "path", "stream", "client",
                        "api_key", "asked_priority", "priority", "band", "state", "status_code", "error_text")},
        ),
        (
            "Decision",
            {"fields": ("scheduler", "serial_priority", "serial_band", "serial_score", "serial_queue_wait_ms",
                        "fifo_priority", "score_priority", "score_affinity", "score_aging", "runner_up",
                        "changed_by_aging", "changed_by_affinity", "changed_by_fairness", "needed_swap", "slot",
                        "waited_because_text",
                        "explanation_text")},
        ),
        ("Times", {"fields": ("arrived_at", "dispatched_at", "first_byte_at", "finished_at", "duration_ms")}),
        (
            "Tokens",
            {"fields": ("input_tokens", "output_tokens", "cache_tokens", "prompt_per_second", "tokens_per_second",
                        "response_bytes")},
        ),
    )

    def get_queryset(self, request: HttpRequest):
        queryset = super().get_queryset(request)
        return HistoryQuerySet(queryset.model, queryset.query, using=queryset.db)

    def get_search_results(self, request: HttpRequest, queryset, search_term: str):
        return search_requests(queryset, search_term), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return request.user.is_superuser

    @admin.display(description="score")
    def score(self, obj: QueuedRequest) -> str:
        if obj.serial_score is not None:
            return f"{obj.serial_score:.1f}"
        if obj.fifo_priority is not None:
            return str(obj.fifo_priority)
        return "—"

    @admin.display(description="queue wait")
    def queue_wait(self, obj: QueuedRequest) -> str:
        return _seconds(obj.serial_queue_wait_ms)

    @admin.display(description="duration")
    def duration(self, obj: QueuedRequest) -> str:
        return _seconds(obj.duration_ms)

    @admin.display(description="decision")
    def why(self, obj: QueuedRequest) -> str:
        if obj.explanation:
            explanation = plain(obj.explanation)
            return explanation[0].upper() + explanation[1:] + "."
        if obj.state == RequestState.QUEUED:
            return "Still waiting for the GPU; the queue page shows its current rank and score."
        reason = f": {plain(obj.error)}" if obj.error else ""
        return f"Never dispatched — {obj.get_state_display().lower()}{reason}."

    @admin.display(description="timeline")
    def timeline(self, obj: QueuedRequest) -> str:
        parts = []
        if obj.dispatched_at is not None:
            parts.append(f"waited {(obj.dispatched_at - obj.arrived_at).total_seconds():.1f} s in the queue")
            if obj.waited_because:
                parts[-1] += f" ({plain(obj.waited_because)})"
            if obj.slot is not None:
                parts.append(f"ran on slot {obj.slot} of {obj.model}")
        elif obj.finished_at is not None:
            parts.append(f"left the queue after {(obj.finished_at - obj.arrived_at).total_seconds():.1f} s")
        if obj.needed_swap:
            parts.append("its model had to be started")
        if obj.first_byte_at is not None and obj.dispatched_at is not None:
            parts.append(f"first byte {(obj.first_byte_at - obj.dispatched_at).total_seconds():.2f} s after dispatch")
        if obj.duration_ms is not None:
            parts.append(f"ran {_seconds(obj.duration_ms)}")
        return "; ".join(parts) or "—"

    @admin.display(description="tokens")
    def tokens(self, obj: QueuedRequest) -> str:
        if obj.input_tokens is None and obj.output_tokens is None:
            return "—"
        text = f"{obj.input_tokens or 0} in"
        if obj.cache_tokens:
            text += f" ({obj.cache_tokens} from cache)"
        text += f", {obj.output_tokens or 0} out"
        if obj.tokens_per_second is not None:
            text += f" at {obj.tokens_per_second:.1f} tokens/s"
        if obj.prompt_per_second is not None:
            text += f", prompt at {obj.prompt_per_second:.1f} tokens/s"
        return text

    # The row's texts name every model, lease and cost to operators (`scheduling.core.mentions`).
    @admin.display(description="error")
    def error_text(self, obj: QueuedRequest) -> str:
        return plain(obj.error)

    @admin.display(description="waited because")
    def waited_because_text(self, obj: QueuedRequest) -> str:
        return plain(obj.waited_because)

    @admin.display(description="explanation")
    def explanation_text(self, obj: QueuedRequest) -> str:
        return plain(obj.explanation)

    @admin.display(description="runner-up")
    def runner_up(self, obj: QueuedRequest):
        if obj.runner_up_id is None:
            return "—"
        url = reverse("admin:scheduling_queuedrequest_change", args=[obj.runner_up_id])
        score = "?" if obj.runner_up_score is None else f"{obj.runner_up_score:.1f}"
        return format_html('<a href="{}">#{}</a> at score {}', url, obj.runner_up_id, score)


def overview_view(request: HttpRequest) -> HttpResponse:
    """The operators' Overview: charts of the request history over a window (`scheduling.operating.overview`)."""
    if not request.user.has_perm("scheduling.view_queuedrequest"):
        raise PermissionDenied
    window, chosen = overview.chosen_window(request.GET, timezone.now())
    context = {**admin.site.each_context(request), "title": "Overview", **chosen}
    if window is None:
        return TemplateResponse(request, "admin/scheduling/overview.html", context, status=400)
    summary = overview.summarize(window)
    context.update(totals=summary.totals, charts=overview.charts(summary))
    return TemplateResponse(request, "admin/scheduling/overview.html", context)


overview_page = admin.site.admin_view(overview_view)
