"""The admin's API keys: make one (its secret shown once, on the page after creation), list them, edit their
scopes, revoke them. A key is never deleted here: a revoked row keeps every route behind a key, where deleting
the last one would open the server."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from scheduling.keys.store import make_key
from scheduling.models import ApiKey

_SCOPE = ("allowed_models", "operator", "read_only", "max_priority", "default_priority", "expires_at")
_QUOTAS = ("rpm", "tpm", "concurrency", "weight")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix_shown", "state", "kind", "models_shown", "max_priority", "default_priority",
                    "rpm", "tpm", "concurrency", "weight", "created_at", "last_used_at", "expires_at")
    list_filter = ("enabled", "operator", "read_only")
    search_fields = ("name", "prefix")
    readonly_fields = ("prefix_shown", "created_at", "last_used_at")
    actions = ("revoke",)

    def get_fieldsets(self, request: HttpRequest, obj: ApiKey | None = None):
        head = ("name",) if obj is None else ("name", "prefix_shown", "enabled", "created_at", "last_used_at")
        return [(None, {"fields": head}), ("Scope", {"fields": _SCOPE}),
                ("Quotas and fair share", {"fields": _QUOTAS})]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None):
        """A key keeps its name: the request rows it sent are recorded under it."""
        return self.readonly_fields if obj is None else ("name", *self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

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
