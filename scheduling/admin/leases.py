"""The admin's Leases page: model leases (made through `POST /api/leases`, which also loads the model), each with
what it is doing now as the scheduler answers it (`/api/leases` shows the same states), revoked by deleting them."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone

from scheduling.core.mentions import plain
from scheduling.door import frontdoor
from scheduling.door.questions import KeepLeases
from scheduling.models import ModelLease


def state_in_words(state: dict | None) -> str:
    """A lease's state (`ModelLeases.states`) as an operator reads it: what it waits on, or why it cannot be kept."""
    if state is None:
        return "unknown: no scheduler has read it yet"
    name = state["state"]
    if name == "cannot_fit":
        return f"cannot fit: {plain(state['why'])}"
    if name == "waiting" and state.get("blocked_by"):
        return f"waiting: blocked by {', '.join(plain(blocker) for blocker in state['blocked_by'])}"
    if name == "waiting" and "retry_in_s" in state:
        failed = f"its load failed ({plain(state['last_error'])}); " if "last_error" in state else ""
        return f"waiting: {failed}tried again in {state['retry_in_s']:g} s"
    return name


def _states() -> tuple[dict[int, dict] | str, set[str]]:
    """The scheduler's states of the leases in force, by id (or why there are none to show), and the models
    configured."""
    door = frontdoor.installed()
    if door is None:
        return "unknown: no scheduler runs in this process", set()
    try:
        return door.ask_now(KeepLeases()), set(door.config.models)
    except frontdoor.Unanswered:
        return "unknown: the scheduler did not answer", set(door.config.models)


@admin.register(ModelLease)
class ModelLeaseAdmin(admin.ModelAdmin):
    """Model leases: listed with their state, and revoked by deleting them (the scheduler reads the rows within
    `SYNC_S`); made through the API, which also loads the model."""

    list_display = ("id", "model", "created_at", "expires_at", "in_force")
    list_filter = ("model",)

    def get_list_display(self, request: HttpRequest):
        """The columns, with the state asked of the scheduler once for the page."""
        states, models = _states()

        @admin.display(description="state")
        def state(obj: ModelLease) -> str:
            if obj.expires_at <= timezone.now():
                return "—"
            if isinstance(states, str):
                return states
            if models and obj.model not in models:
                return "model removed from the config"
            return state_in_words(states.get(obj.pk))

        return (*self.list_display, state)

    @admin.display(boolean=True, description="in force")
    def in_force(self, obj: ModelLease) -> bool:
        return obj.expires_at > timezone.now()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
