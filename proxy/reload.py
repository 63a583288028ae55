"""Config reload (SIGHUP, or `--watch-config` polling the file and `--config-dir`): a bad file is refused, the old
config keeps serving.

Unlike llama-swap, which rebuilds everything and stops every model, a reload here
keeps queued requests for models that still exist and only replaces the
processes whose command, address or environment changed.
"""

from __future__ import annotations

import asyncio
import logging
import os

from django.db import DatabaseError

from proxy.config import ConfigError, load_config
from proxy.config.config_dir import sources_signature
from proxy.model_processes.fleet import process_changed
from proxy.model_processes.log_level import apply_log_level
from proxy.model_processes.log_output import apply_log_output

log = logging.getLogger("llamaswap.reload")

WATCH_INTERVAL_S = 2.0


async def reload_config(service, path: str | None, config_dir: str | None = None) -> bool:
    """Load `path` (with `config_dir`'s files merged after it) and apply it to the running service; returns
    whether it was applied. Never raises: a SIGHUP's task and the file watcher go on after a failed reload."""
    try:
        return await _reload(service, path, config_dir)
    except Exception:
        log.exception("config reload failed; still serving what was in force before it")
        return False


async def _reload(service, path: str | None, config_dir: str | None) -> bool:
    from proxy.serving.active_profile import reset_active_profile
    from scheduling.operating.settings_store import stored_serial_settings
    from scheduling.rows.connections import on_fresh_connection

    loop = asyncio.get_running_loop()
    try:
        # Each model keeps its ${PORT} number: one added or removed would renumber, and restart, those after it.
        kept_ports = {model.id: model.port for model in service.config.models.values() if model.port is not None}
        new = await loop.run_in_executor(None, load_config, path, config_dir, kept_ports)
    except ConfigError as exc:
        log.error("config reload rejected; still serving the previous config:\n%s", exc)
        return False
    except OSError as exc:
        log.error("config reload rejected: cannot read %s (%s); still serving the previous config", path, exc.strerror)
        return False
    old = service.config
    if new.scheduler.use != old.scheduler.use:
        hardware = (" (a top-level hardware: section was added, which places by memory with the serial scheduler)"
                    if old.hardware is None and new.hardware is not None else
                    " (the hardware: section was removed)" if old.hardware is not None and new.hardware is None else "")
        log.error(
            "config reload rejected: routing.scheduler.use changed from %s to %s%s, which needs a restart; "
            "still serving the previous config", old.scheduler.use, new.scheduler.use, hardware,
        )
        return False
    for warning in new.warnings:
        log.warning("%s", warning)
    restart = sorted(m for m in new.models if m in old.models and process_changed(old.models[m], new.models[m]))
    try:
        settings = await loop.run_in_executor(
            None, on_fresh_connection, stored_serial_settings, new.scheduler.serial, new.models,
        )
    except DatabaseError as exc:
        log.warning("the admin's scheduler settings could not be read (%s); the reloaded config's apply until the "
                    "next reload or edit", exc)
        settings = new.scheduler.serial
    service.apply_config(new, restart, settings)
    try:  # a reload switches to the startup profile, or off
        await loop.run_in_executor(None, on_fresh_connection, reset_active_profile, new)
    except DatabaseError as exc:
        log.warning("the active profile could not be reset after the reload (%s); the one last read stays active", exc)
    apply_log_level(new.log_level)
    apply_log_output(new.log_output)
    added = sorted(set(new.models) - set(old.models))
    removed = sorted(set(old.models) - set(new.models))
    log.info(
        "config reloaded from %s: added %s, removed %s, restarting %s",
        new.path, ", ".join(added) or "none", ", ".join(removed) or "none", ", ".join(restart) or "none",
    )
    return True


async def watch_config(
    service, path: str | None, config_dir: str | None = None, interval: float = WATCH_INTERVAL_S
) -> None:
    """Poll the stat of the file and of the directory's files (works on every filesystem, containers included)
    and reload when one is changed, added or removed."""
    seen = sources_signature(path, config_dir)
    while True:
        await asyncio.sleep(interval)
        current = sources_signature(path, config_dir)
        if path and not os.path.exists(path):
            continue  # an editor replacing the file: wait for the new one
        if current and current != seen:
            seen = current
            await reload_config(service, path, config_dir)
