"""Whether a row key still counts, and with which limits, while something it opened is still held (an open
WebSocket, a request waiting at the quota gate or in the scheduler's queue): a key revoked, disabled, expired or deleted ends those within the
same bound as a new request of it is refused, REFRESH_S plus one read of the rows (`proxy.serving.key_cache`). Its
requests already running at a model go on to their end.

While the rows cannot be read at all (past `STALE_LIMIT_S`), nothing is ended on a guess: the holder goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from django.utils import timezone

from proxy.serving.access import Caller, Denied, Need, model_refusal, route_refusal
from proxy.serving.key_cache import KEYS, REFRESH_S
from scheduling.door import frontdoor

# How often a holder looks: twice per refresh, so a revoke is seen at most REFRESH_S plus one read after it.
WATCH_S = REFRESH_S / 2

log = logging.getLogger("llamaswap.keys")


@dataclass
class _Watch:
    """One key's watch on this front end: the task, and how many of the key's requests it watches for."""

    task: asyncio.Task
    users: int = 0


_WATCHES: dict[tuple[asyncio.AbstractEventLoop, str], _Watch] = {}


async def refusal_now(name: str, model: str | None = None) -> Denied | None:
    """The refusal a request of the row key `name` would get now: 401 once the key no longer counts; with `model`,
    403 once its row no longer lets it send requests to that model (its models narrowed, or made read-only).
    None while it may, for a config file apiKey (no name), while the rows cannot be read, and once no key is left
    anywhere (the service is open)."""
    if not name:
        return None
    rows = await KEYS.current_async()
    if rows is None or (rows.count == 0 and not _config_keys()):
        return None
    why = rows.refusal_of(name, timezone.now())
    if why is not None:
        return Denied(401, why, "invalid_api_key")
    stored = rows.named(name)
    if model is None or stored is None:
        return None
    caller = Caller(stored.scope)
    return route_refusal(caller, Need.INFERENCE) or model_refusal(caller, model)


def _config_keys() -> tuple[str, ...]:
    """The running service's config file apiKeys (none before a service runs)."""
    door = frontdoor.installed()
    return () if door is None else tuple(door.config.api_keys)


async def concurrency_now(name: str, admitted: int | None) -> int | None:
    """The `concurrency` of the row key `name` as its row stands now (None: no limit), so an edit counts for its
    requests still waiting for a place; `admitted`, the limit it came with, for a config file apiKey and while
    the rows cannot be read."""
    rows = await KEYS.current_async() if name else None
    stored = None if rows is None else rows.named(name)
    return admitted if stored is None else stored.scope.limits.concurrency


async def until_refused(name: str, model_of: Callable[[], str | None] = lambda: None) -> Denied:
    """Wait until the row key `name` no longer counts, or no longer may use the model `model_of` names once it
    names one; the refusal a new request of it (to that model) gets."""
    if not name:
        await asyncio.Event().wait()  # a config file apiKey is never revoked while the service runs
    while (denied := await refusal_now(name, model_of())) is None:
        await asyncio.sleep(WATCH_S)
    return denied


@contextlib.asynccontextmanager
async def queue_closed_when_revoked(door, name: str) -> AsyncIterator[None]:
    """While the block serves a request of the row key `name`, watch the key: once it stops counting, every
    request of it still in the scheduler's queue (on any worker) is refused with its 401. One watch per key and
    front end, however many of its requests are in flight."""
    if not name:
        yield
        return
    loop = asyncio.get_running_loop()
    here = (loop, name)
    if here not in _WATCHES:
        _WATCHES[here] = _Watch(loop.create_task(_refuse_queued(door, name)))
    watch = _WATCHES[here]
    watch.users += 1
    try:
        yield
    finally:
        watch.users -= 1
        if not watch.users:
            watch.task.cancel()
            _WATCHES.pop(here, None)


async def _refuse_queued(door, name: str) -> None:
    """Refuse the key's queued requests every `WATCH_S` for as long as it does not count and this front end holds
    one of its requests: a submit that waited for Redis (up to REDIS_WAIT_S) reaches the queue seconds after the
    revoke. The door refuses them at once whether or not its scheduler can be reached now (`FrontDoor.refuse_key`):
    a Redis blink neither delays the 401s nor ends the sweep. A key that counts again is left alone."""
    while True:
        denied = await until_refused(name)
        if refused := await door.refuse_key(name, denied.message):
            log.info("refused %d queued request(s) of the API key '%s': %s", refused, name, denied.message)
        await asyncio.sleep(WATCH_S)
