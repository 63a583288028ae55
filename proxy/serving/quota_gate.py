"""A key's quotas applied to one model request, before it joins the scheduler's queue.

Over rpm or tpm: 429 `rate_limit_exceeded` with `Retry-After`, at once. Over concurrency: the request waits
here, behind the key's own requests only — other keys' requests go straight on to the queue, so a key at its
limit never holds anyone else up — and goes on when one of the key's requests ends (on any front end: the
counter is shared). A front end's waiters of one key go on in arrival order. A waiter whose key is revoked
(disabled, expired, deleted) meanwhile is refused with the 401 a new request of it gets, and one whose key's
concurrency is raised or lifted meanwhile counts the new limit (`proxy.serving.key_watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator

from proxy.serving.errors import ProxyError
from proxy.serving.key_watch import concurrency_now, refusal_now
from proxy.serving.quota_counters import RETRY_S, QuotaCounter, quota_counter
from proxy.serving.token_tally import Tally
from scheduling.keys.scope import KeyScope


class _Line:
    """One key's waiters on this front end: the first asks the counter, the rest wait their turn."""

    def __init__(self) -> None:
        self.turn = asyncio.Lock()  # asyncio's lock wakes its waiters in arrival order
        self.freed = asyncio.Event()
        self.users = 0  # its requests admitted here and not yet ended
        self.waiting = 0  # those of them without a place yet


log = logging.getLogger("llamaswap.quota")

_LINES: dict[tuple[asyncio.AbstractEventLoop, str], _Line] = {}
_UNCOUNTED: set[str] = set()  # keys whose answers were estimated, warned about once


@contextlib.asynccontextmanager
async def within_quota(scope: KeyScope, counter: QuotaCounter | None = None) -> AsyncIterator[Tally]:
    """Hold one request of the key `scope` within its quotas while the block serves it; its tokens (the
    yielded `Tally`) are counted against the key's tpm when the block ends."""
    limits = scope.limits
    tally = Tally(counting=limits.tpm is not None)
    if not limits.any():
        yield tally
        return
    counter = counter or quota_counter()
    here = (asyncio.get_running_loop(), scope.name)
    # A place is taken at admission only when none of the key's requests wait here: they go first.
    queued = here in _LINES and _LINES[here].waiting > 0
    admission = await counter.admit(scope.name, limits, take_place=limits.concurrency is not None and not queued)
    if (over := admission.over) is not None:
        raise ProxyError(429, over.message(), "rate_limit_exceeded", headers={"Retry-After": over.retry_after_header()})
    place, line = admission.place, None
    if limits.concurrency is not None:
        line = _LINES.setdefault(here, _Line())
        line.users += 1
    try:
        if line is not None and place is None:
            place = await _wait_for_place(counter, scope.name, limits.concurrency, line)
        yield tally
    finally:
        if limits.tpm is not None and tally.estimated and scope.name not in _UNCOUNTED:
            _UNCOUNTED.add(scope.name)
            log.warning("an answer to the API key '%s' reported no token usage, so its tpm quota counted an estimate "
                        "(a client that left mid-stream, a model or route that reports none); logged once per key",
                        scope.name)
        await counter.end(scope.name, place, tally.tokens if limits.tpm is not None else 0)
        if line is not None:
            if place is not None:
                line.freed.set()
            line.users -= 1
            if not line.users:
                _LINES.pop(here, None)


async def _wait_for_place(counter: QuotaCounter, key: str, concurrency: int | None, line: _Line):
    line.waiting += 1
    try:
        async with line.turn:
            for tries in itertools.count():
                line.freed.clear()  # before asking: a place freed meanwhile sets it again
                if (denied := await refusal_now(key)) is not None:
                    raise ProxyError(denied.status, denied.message, denied.code, headers=denied.headers())
                if (concurrency := await concurrency_now(key, concurrency)) is None:
                    return None  # the limit was lifted while it waited
                if (place := await counter.take(key, concurrency)) is not None:
                    return place
                if not tries:
                    log.info("a request of the API key '%s' waits for one of its %d places at once (concurrency)",
                             key, concurrency)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(line.freed.wait(), RETRY_S)
    finally:
        line.waiting -= 1
