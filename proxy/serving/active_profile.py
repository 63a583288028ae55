"""Which profile is active: `hooks.on_startup.profile` (or none) at start and after a config reload, else the
last `PUT /api/profiles/active`.

The name lives in one database row (scheduling.models.ActiveProfile), so in distributed mode every
front end applies the same profile. Each process reads it again at most every REFRESH_S, so a switch
made through one front end reaches the others within that time; the process that made it sees it at
once. A config without profiles never reads it.
"""

from __future__ import annotations

import logging
import time

from channels.db import database_sync_to_async
from django.db import DatabaseError
from django.utils import timezone

from scheduling.outage_log import OutageLog
from scheduling.models import ActiveProfile

log = logging.getLogger("llamaswap.profiles")

REFRESH_S = 1.0

_cached: tuple[str, float] | None = None  # (name, when it was read, monotonic)
_OUTAGE = OutageLog(log, "reading the active profile (the one last read stays active)")


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
        try:
            _cached = (await database_sync_to_async(_read)(), now)
            _OUTAGE.worked()
        except DatabaseError as exc:  # the database away: the profile last read (or the config's) stays active
            _OUTAGE.failed(exc)
            _cached = (config.startup_profile if _cached is None else _cached[0], now)
    name = _cached[0]
    return name if name in config.profiles else ""


async def set_active_profile(name: str) -> None:
    """Make `name` (a configured profile, or "" for none) the active one, for every process."""
    global _cached
    await database_sync_to_async(_write)(name)
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
