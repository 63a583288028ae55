"""The admin's API keys: make one (its secret shown once, on the page after creation), list them, edit their
scopes, revoke them. A key is never deleted here: a revoked row keeps every route behind a key, where deleting
the last one would open the server."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from scheduling.admin.forms import PriorityField
from scheduling.keys.store import make_key
from scheduling.models import ApiKey
from scheduling.operating import key_usage, overview

_SCOPE = ("allowed_models", "operator", "read_only", "max_priority", "default_priority", "expires_at")
_QUOTAS = ("rpm", "tpm", "concurrency", "weight")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "usage", "prefix_shown", "state", "kind", "models_shown", "max_priority", "default_priority",
                    "rpm", "tpm", "concurrency", "weight", "created_at", "last_used_at", "expires_at")
    list_filter = ("enabled", "operator", "read_only")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix_shown", "created_at", "last_used_at", "usage")
    actions = ("revoke",)

    def get_fieldsets(self, request: HttpRequest, obj: ApiKey | None = None):
        head = ("name",) if obj is None else ("name", "usage", "prefix_shown", "enabled", "created_at", "last_used_at")
        return [(None, {"fields": head}), ("Scope", {"fields": _SCOPE}),
                ("Quotas and fair share", {"fields": _QUOTAS})]

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        """The priorities take an alias (`interactive`) as well as a number, as `llamaswap keys create` does."""
        if db_field.name in ("max_priority", "default_priority"):
            return PriorityField(required=False, label=db_field.verbose_name.capitalize(), help_text=db_field.help_text)
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None):
        """A key keeps its name: the request rows it sent are recorded under it."""
        return self.readonly_fields if obj is None else ("name", *self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def get_urls(self):
        usage = path("<int:object_id>/usage/", self.admin_site.admin_view(self.usage_view),
                     name="scheduling_apikey_usage")
        return [usage, *super().get_urls()]

    @admin.display(description="usage")
    def usage(self, obj: ApiKey) -> str:
        return format_html('<a href="{}">requests, tokens, waits, errors</a>',
                           reverse("admin:scheduling_apikey_usage", args=[obj.pk]))

    def usage_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """The key's requests, tokens, queue waits and error statuses over a window, charted like the Overview."""
        if not (self.has_view_or_change_permission(request) and request.user.has_perm("scheduling.view_queuedrequest")):
            raise PermissionDenied
        key = get_object_or_404(ApiKey, pk=object_id)
        window, chosen = overview.chosen_window(request.GET, timezone.now())
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": f"Usage of {key.name}",
                   "key": key, **chosen}
        if window is None:
            return TemplateResponse(request, "admin/scheduling/apikey/usage.html", context, status=400)
        usage = key_usage.summarize(key.name, window)
        history = reverse("admin:scheduling_queuedrequest_changelist")
        context.update(totals=usage.totals, charts=key_usage.charts(usage),
                       history_url=f"{history}?{urlencode({'api_key': key.name})}")
        return TemplateResponse(request, "admin/scheduling/apikey/usage.html", context)

    @admin.display(description="prefix")
    def prefix_shown(self, obj: ApiKey) -> str:
        return f"{obj.prefix}…" if obj.prefix else "—"

    @admin.display(description="state")
    def state(self, obj: ApiKey) -> str:
        if not obj.enabled:
            return "revoked"
        return "expired" if obj.expires_at is not None and obj.expires_at <= timezone.now() else "enabled"

    @admin.display(description="kind")
    def kind(self, obj: ApiKey) -> str:
        return "operator" if obj.operator else "read-only" if obj.read_only else "inference"

    @admin.display(description="models")
    def models_shown(self, obj: ApiKey) -> str:
        return ", ".join(obj.model_globs()) or "every model"

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset) -> None:
        count = queryset.filter(enabled=True).update(enabled=False)
        self.message_user(request, f"Revoked {count} key(s); every front end refuses them within 2 s.", messages.SUCCESS)

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
        else:  # the secret lives on this request only, for the page `response_add` draws
            request.new_key_secret = make_key(obj)

    def response_add(self, request: HttpRequest, obj: ApiKey, post_url_continue=None) -> HttpResponse:
        """The secret, on this page only: it is not stored, so no later page (nor a message cookie) can show it."""
        response = TemplateResponse(request, "admin/scheduling/apikey/created.html", {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "key": obj,
            "secret": request.new_key_secret,
            "list_url": reverse("admin:scheduling_apikey_changelist"),
            "title": f"API key {obj.name} created",
        })
        response["Cache-Control"] = "no-store"
        return response
