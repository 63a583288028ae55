"""A batch's lines count against the quotas of the key that created it (rpm, tpm, requests at once), in the same
windows as the key's own requests (`proxy.serving.quota_counters`), but are paced rather than refused: a line over
rpm or tpm waits until the window frees, one over concurrency waits for a place. The quotas are the key's row's
as it is while the line waits, so a quota changed meanwhile applies to the lines not yet sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from django.utils import timezone

from proxy.serving.key_cache import KEYS
from proxy.serving.key_watch import WATCH_S
from proxy.serving.quota_counters import RETRY_S, QuotaCounter, quota_counter
from proxy.serving.token_tally import Tally
from scheduling.keys.quota import UNLIMITED, QuotaLimits


class Stopped(Exception):
    """The batch ended (cancelled, expired) while the line waited for its turn: it was never sent."""


async def limits_now(name: str) -> QuotaLimits:
    """The quotas of the row key `name` now; none for a config file key or an open server (no name), a key that no
    longer counts, or while the rows cannot be read (the lines go on, as they do for the key's rights)."""
    if not name:
        return UNLIMITED
    rows = await KEYS.current_async()
    stored = None if rows is None else rows.named(name)
    if stored is None or stored.refusal(timezone.now()) is not None:
        return UNLIMITED  # its line is refused at once, unpaced
    return stored.scope.limits


@contextlib.asynccontextmanager
async def paced(name: str, stop: asyncio.Event, counter: QuotaCounter | None = None) -> AsyncIterator[Tally]:
    """Hold one line of the key `name` within its quotas while the block sends it, waiting first for its turn
    (Stopped once `stop` is set); the tokens noted in the yielded `Tally` count against the key's tpm."""
    limits, tally = await limits_now(name), Tally()
    if not limits.any():
        yield tally
        return
    counter = counter or quota_counter()
    limits, place = await _turn(name, limits, counter, stop)
    try:
        yield tally
    finally:
        await counter.end(name, place, tally.tokens if limits.tpm is not None else 0)


async def _turn(name: str, limits: QuotaLimits, counter: QuotaCounter, stop: asyncio.Event) -> tuple[QuotaLimits, Any]:
    """Wait until one more request of the key fits its rpm and tpm (then counted), and for a place at once; the
    limits are read again as it waits (an edit of the key counts for its waiting lines, as for its requests)."""
    while (admission := await counter.admit(name, limits, take_place=limits.concurrency is not None)).over is not None:
        await _wait(stop, min(admission.over.retry_after_s, WATCH_S))
        limits = await limits_now(name)
    place = admission.place
    while limits.concurrency is not None and place is None:
        await _wait(stop, RETRY_S)  # a place freed on another front end is seen at the next ask
        limits = await limits_now(name)
        if limits.concurrency is not None:
            place = await counter.take(name, limits.concurrency)
    return limits, place


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(seconds, 0.01))
        raise Stopped()
