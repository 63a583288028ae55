"""Where the keys' quota windows are counted: in this process (one server), or in Redis, so that every front end
of a distributed deployment counts against the same windows and a key's limits hold in total.

The class is a setting, `LLAMASWAP_QUOTA_COUNTER` (a dotted path), chosen the way Channels picks its layer:
Redis when REDIS_URL is set. Both answer with `scheduling.keys.quota`'s arithmetic; Redis runs it in Lua
scripts over sorted sets, so a check and its count are one atomic step however many front ends ask at once.

Redis away: the counter fails open — requests are admitted uncounted, and the log says so once when the outage
begins and once when it ends. Refusing every keyed request instead would turn a counter's outage into an outage
of the service (and with Redis away, a distributed front end reaches no worker anyway).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.utils.module_loading import import_string

from scheduling.door.outage_log import OutageLog
from scheduling.keys.quota import WINDOW_S, OverQuota, QuotaLimits, RateWindows

log = logging.getLogger("llamaswap.quota")

# A place at once held in Redis lapses this long after its front end last renewed it: a front end killed
# mid-request frees its key's places within LEASE_S. Held places are renewed every LEASE_S / 3.
LEASE_S = 30.0
# How often a request waiting for a place at once asks again, for places freed on other front ends (one freed
# on this front end wakes its waiter at once).
RETRY_S = 0.1

# KEYS: admissions, spent tokens. ARGV: now, rpm (0: none), tpm (0: none), a new admission's member.
# Returns nil when admitted (and counted), else {limit, the score of the entry whose leaving frees the window}.
_ADMIT = """
local now, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
if rpm > 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    return {'rpm', redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')[2]}
  end
end
if tpm > 0 then
  local rows = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local total = 0
  for i = 1, #rows, 2 do total = total + tonumber(string.match(rows[i], ':(%d+)$')) end
  if total >= tpm then
    for i = 1, #rows, 2 do
      total = total - tonumber(string.match(rows[i], ':(%d+)$'))
      if total < tpm then return {'tpm', rows[i + 1]} end
    end
  end
end
if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
end
return nil
"""
# KEYS: spent tokens. ARGV: now, member ("<unique>:<tokens>"), window.
_SPEND = """
redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 1)
"""
# KEYS: the places held (member: holder, score: when its lease lapses). ARGV: now, concurrency, holder, lease.
_TAKE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4])) + 1)
return 1
"""


class QuotaCounter:
    """What a counter answers; `clock` is wall-clock seconds, so front ends on different machines agree."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    async def admit(self, key: str, limits: QuotaLimits) -> OverQuota | None:
        """Count one request of `key` against its rpm, or say which limit refuses it and for how long."""
        raise NotImplementedError

    async def spend(self, key: str, tokens: int) -> None:
        """Count a finished request's tokens against `key`'s tpm."""
        raise NotImplementedError

    async def take(self, key: str, concurrency: int) -> Any:
        """A place at once for `key` (a token for `give_back`), or None when all `concurrency` are held."""
        raise NotImplementedError

    async def give_back(self, key: str, place: Any) -> None:
        raise NotImplementedError


class InProcessQuotaCounter(QuotaCounter):
    """One server's windows, in its memory: the embedded default."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._windows = RateWindows()

    async def admit(self, key: str, limits: QuotaLimits) -> OverQuota | None:
        return self._windows.admit(key, limits, self.clock())

    async def spend(self, key: str, tokens: int) -> None:
        self._windows.spend(key, tokens, self.clock())

    async def take(self, key: str, concurrency: int) -> Any:
        return True if self._windows.take(key, concurrency) else None

    async def give_back(self, key: str, place: Any) -> None:
        self._windows.give_back(key)


class RedisQuotaCounter(QuotaCounter):
    """Every front end's windows, in Redis (`url`), under `prefix`."""

    def __init__(self, url: str | None = None, *, prefix: str = "llamaswap:quota",
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._url = url if url is not None else settings.LLAMASWAP_QUOTA_REDIS_URL
        self._prefix = prefix
        self._clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
        self._held: dict[str, str] = {}  # holder -> its key's places, renewed while held
        self._renewing: asyncio.Task | None = None
        self._outage = OutageLog(log, "counting API key quotas in Redis (meanwhile requests are admitted uncounted)")

    def _client(self) -> aioredis.Redis:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = aioredis.from_url(self._url, socket_connect_timeout=1.0, socket_timeout=1.0)
        return self._clients[loop]

    def _name(self, key: str, what: str) -> str:
        return f"{self._prefix}:{key}:{what}"

    async def _run(self, script: str, keys: list[str], args: list[Any], failed: Any) -> Any:
        """The script's answer, or `failed` when Redis cannot be reached (logged once per outage)."""
        try:
            answer = await self._client().eval(script, len(keys), *keys, *args)
        except (aioredis.RedisError, OSError, asyncio.TimeoutError) as exc:
            self._outage.failed(exc)
            return failed
        self._outage.worked()
        return answer

    async def admit(self, key: str, limits: QuotaLimits) -> OverQuota | None:
        now = self.clock()
        answer = await self._run(
            _ADMIT, [self._name(key, "rpm"), self._name(key, "tpm")],
            [repr(now), limits.rpm or 0, limits.tpm or 0, f"{now!r}:{uuid.uuid4().hex}", repr(WINDOW_S)], None)
        if answer is None:
            return None
        limit, freed_from = answer[0].decode(), float(answer[1])
        value = limits.rpm if limit == "rpm" else limits.tpm
        return OverQuota(key, limit, value, freed_from + WINDOW_S - now)

    async def spend(self, key: str, tokens: int) -> None:
        if tokens > 0:
            await self._run(_SPEND, [self._name(key, "tpm")],
                            [repr(self.clock()), f"{uuid.uuid4().hex}:{tokens}", repr(WINDOW_S)], None)

    async def take(self, key: str, concurrency: int) -> Any:
        holder = uuid.uuid4().hex
        taken = await self._run(_TAKE, [self._name(key, "held")], [repr(self.clock()), concurrency, holder, LEASE_S],
                                "uncounted")
        if taken == "uncounted":
            return taken
        if not taken:
            return None
        self._held[holder] = self._name(key, "held")
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew())
        return holder

    async def give_back(self, key: str, place: Any) -> None:
        if self._held.pop(place, None) is None:
            return  # admitted uncounted while Redis was away
        try:
            await self._client().zrem(self._name(key, "held"), place)
        except (aioredis.RedisError, OSError, asyncio.TimeoutError) as exc:
            self._outage.failed(exc)  # the place lapses LEASE_S after its last renewal

    async def _renew(self) -> None:
        """Push each held place's lapse LEASE_S ahead, every LEASE_S / 3, while any is held."""
        while self._held:
            await asyncio.sleep(LEASE_S / 3)
            lapse = self.clock() + LEASE_S
            try:
                async with self._client().pipeline(transaction=False) as pipe:
                    for holder, places in list(self._held.items()):
                        pipe.zadd(places, {holder: lapse}, xx=True)
                    await pipe.execute()
            except (aioredis.RedisError, OSError, asyncio.TimeoutError) as exc:
                self._outage.failed(exc)


_COUNTER: list[QuotaCounter] = []


def quota_counter() -> QuotaCounter:
    """This process's counter, of the class `LLAMASWAP_QUOTA_COUNTER` names."""
    if not _COUNTER:
        _COUNTER.append(import_string(settings.LLAMASWAP_QUOTA_COUNTER)())
    return _COUNTER[0]
