"""Which profile is active: `hooks.on_startup.profile` (or none) at start and after a config reload, else the
last `PUT /api/profiles/active`.

The name lives in one database row (scheduling.models.ActiveProfile), so in distributed mode every
front end applies the same profile. Each process reads it again at most every REFRESH_S, so a switch
made through one front end reaches the others within that time; the process that made it sees it at
once. A config without profiles never reads it.
"""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async
from django.utils import timezone

from scheduling.models import ActiveProfile

REFRESH_S = 1.0

_cached: tuple[str, float] | None = None  # (name, when it was read, monotonic)


def _read() -> str:
    row = ActiveProfile.objects.filter(pk=1).first()
    return "" if row is None else row.name


def _write(name: str) -> None:
    ActiveProfile.objects.update_or_create(pk=1, defaults={"name": name, "changed_at": timezone.now()})


async def active_profile(config) -> str:
    """The active profile's name ("" for none). A stored name the config no longer has counts as none."""
    global _cached
    if not config.profiles:
        return ""
    now = time.monotonic()
    if _cached is None or now - _cached[1] >= REFRESH_S:
        _cached = (await sync_to_async(_read)(), now)
    name = _cached[0]
    return name if name in config.profiles else ""


async def set_active_profile(name: str) -> None:
    """Make `name` (a configured profile, or "" for none) the active one, for every process."""
    global _cached
    await sync_to_async(_write)(name)
    _cached = (name, time.monotonic())


def reset_active_profile(config) -> None:
    """At start and after a config reload the config's `hooks.on_startup.profile` is active, or none (llama-swap
    switches profiles off on both). Synchronous (database)."""
    global _cached
    _write(config.startup_profile)
    _cached = None


def start_profile(config) -> None:
    """At start: the profile last selected when `profileStateFile` asks to remember it (and it is still
    configured), else the startup profile. Synchronous (database)."""
    global _cached
    if config.remember_profile:
        row = ActiveProfile.objects.filter(pk=1).first()
        if row is not None and (row.name in config.profiles or not row.name):
            _cached = None
            return
    reset_active_profile(config)


def start_with_profile(config) -> None:
    """Distributed mode, where the active profile belongs to the whole deployment and a worker starting does not
    reset it: the startup profile is taken only when no profile was ever stored. Synchronous (database)."""
    ActiveProfile.objects.get_or_create(pk=1, defaults={"name": config.startup_profile, "changed_at": timezone.now()})
