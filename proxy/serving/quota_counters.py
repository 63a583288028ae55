"""Where the keys' quota windows are counted: in this process (one server), or in Redis, so that every front end
of a distributed deployment counts against the same windows and a key's limits hold in total.

The class is a setting, `LLAMASWAP_QUOTA_COUNTER` (a dotted path), chosen the way Channels picks its layer:
Redis when REDIS_URL is set. Both answer with `scheduling.keys.quota`'s arithmetic; Redis runs it in Lua
scripts over sorted sets, so a check and its count are one atomic step however many front ends ask at once;
a tpm check under the limit reads a running total, not each entry.

Redis away: the counter fails open — requests are admitted uncounted, and the log says so once when the outage
begins and once when it ends. Refusing every keyed request instead would turn a counter's outage into an outage
of the service (and with Redis away, a distributed front end reaches no worker anyway). A place that could not be
given back is given back as soon as Redis answers again, not left to lapse with its lease.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings
from django.utils.module_loading import import_string

from scheduling.outage_log import OutageLog
from scheduling.keys.quota import WINDOW_S, OverQuota, QuotaLimits, RateWindows

log = logging.getLogger("llamaswap.quota")

# A place at once held in Redis lapses this long after its front end last renewed it: a front end killed
# mid-request frees its key's places within LEASE_S. Held places are renewed every LEASE_S / 3.
LEASE_S = 30.0
# How often a request waiting for a place at once asks again, for places freed on other front ends (one freed
# on this front end wakes its waiter at once).
RETRY_S = 0.1

# Takes one of a key's places at once: `held` holds each holder with when its lease lapses.
_TAKE_FUNCTION = """
local function take(held, now, concurrency, holder, lease)
  redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
  if redis.call('ZCARD', held) >= concurrency then return 0 end
  redis.call('ZADD', held, now + lease, holder)
  redis.call('EXPIRE', held, math.ceil(lease) + 1)
  return 1
end
"""
# KEYS: admissions, spent tokens ("<unique>:<tokens>"), their total, places held. ARGV: now, rpm (0: none), tpm
# (0: none), a new admission's member, the window, concurrency (0: take no place), holder, lease.
# Returns {limit, the score of the entry whose leaving frees the window} when refused, else {"ok", place taken}.
_ADMIT = _TAKE_FUNCTION + """
local now, rpm, tpm, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local total = 0
if tpm > 0 then
  total = tonumber(redis.call('GET', KEYS[3]) or '0')
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - window)
  if #gone > 0 then
    for i = 1, #gone do total = total - tonumber(string.match(gone[i], ':(%d+)$')) end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
    redis.call('SET', KEYS[3], string.format('%d', total), 'KEEPTTL')
  end
end
if rpm > 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    return {'rpm', redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')[2]}
  end
end
if tpm > 0 and total >= tpm then
  local rows = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #rows, 2 do
    total = total - tonumber(string.match(rows[i], ':(%d+)$'))
    if total < tpm then return {'tpm', rows[i + 1]} end
  end
end
if rpm > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
end
local concurrency = tonumber(ARGV[6])
if concurrency == 0 then return {'ok', 0} end
return {'ok', take(KEYS[4], now, concurrency, ARGV[7], tonumber(ARGV[8]))}
"""
# KEYS: places held. ARGV: now, concurrency, holder, lease. 1: taken.
_TAKE = _TAKE_FUNCTION + """
return take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
"""
# KEYS: places held, spent tokens, their total. ARGV: the holder ("": none), now, tokens, a unique mark, the window.
_END = """
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local tokens = tonumber(ARGV[3])
if tokens > 0 then
  local ttl = math.ceil(tonumber(ARGV[5])) + 1
  redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), ARGV[4] .. ':' .. ARGV[3])
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('EXPIRE', KEYS[3], ttl)
end
"""
# What a counter answers when it counted nothing (Redis away): admitted, with a place that is no place.
UNCOUNTED = "uncounted"
_FAILED = object()  # what `_run` answers for a script Redis did not run


@dataclass(frozen=True)
class Admission:
    """A request admitted (`over` None) or refused; `place`: the place at once it took, when asked to take one."""

    over: OverQuota | None
    place: Any = None


class QuotaCounter:
    """What a counter answers; `clock` is wall-clock seconds, so front ends on different machines agree."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    async def admit(self, key: str, limits: QuotaLimits, *, take_place: bool) -> Admission:
        """Count one request of `key` against its rpm, or say which limit refuses it and for how long; with
        `take_place`, also try to take one of its `limits.concurrency` places at once."""
        raise NotImplementedError

    async def take(self, key: str, concurrency: int) -> Any:
        """A place at once for `key` (a token for `end`), or None when all `concurrency` are held."""
        raise NotImplementedError

    async def end(self, key: str, place: Any, tokens: int) -> None:
        """A request of `key` ended: give back its place (None: it held none) and count its tokens against tpm."""
        raise NotImplementedError


class InProcessQuotaCounter(QuotaCounter):
    """One server's windows, in its memory: the embedded default."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._windows = RateWindows()

    async def admit(self, key: str, limits: QuotaLimits, *, take_place: bool) -> Admission:
        if (over := self._windows.admit(key, limits, self.clock())) is not None:
            return Admission(over)
        return Admission(None, await self.take(key, limits.concurrency) if take_place else None)

    async def take(self, key: str, concurrency: int) -> Any:
        return True if self._windows.take(key, concurrency) else None

    async def end(self, key: str, place: Any, tokens: int) -> None:
        if place is not None:
            self._windows.give_back(key)
        self._windows.spend(key, tokens, self.clock())


class RedisQuotaCounter(QuotaCounter):
    """Every front end's windows, in Redis (`url`), under `prefix`: one round trip to admit a request (and take
    its place), one when it ends."""

    def __init__(self, url: str | None = None, *, prefix: str = "llamaswap:quota",
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self._url = url if url is not None else settings.LLAMASWAP_QUOTA_REDIS_URL
        self._prefix = prefix
        self._clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
        self._held: dict[str, str] = {}  # holder -> its key's places, renewed while held
        self._renewing: asyncio.Task | None = None
        self._unreturned: list[tuple[float, list[str], list[Any]]] = []  # ends Redis missed: (lapse, keys, args)
        self._returning: asyncio.Task | None = None
        self._outage = OutageLog(log, "counting API key quotas in Redis (meanwhile requests are admitted uncounted)")

    def _client(self) -> aioredis.Redis:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = aioredis.from_url(self._url, socket_connect_timeout=1.0, socket_timeout=1.0)
        return self._clients[loop]

    def _names(self, key: str, *what: str) -> list[str]:
        return [f"{self._prefix}:{key}:{one}" for one in what]

    async def _run(self, script: str, keys: list[str], args: list[Any], failed: Any) -> Any:
        """The script's answer, or `failed` when Redis cannot be reached (logged once per outage)."""
        try:
            answer = await self._client().eval(script, len(keys), *keys, *args)
        except (aioredis.RedisError, OSError, asyncio.TimeoutError) as exc:
            self._outage.failed(exc)
            return failed
        self._outage.worked()
        return answer

    async def admit(self, key: str, limits: QuotaLimits, *, take_place: bool) -> Admission:
        now, holder = self.clock(), uuid.uuid4().hex
        answer = await self._run(
            _ADMIT, self._names(key, "rpm", "tpm", "tpm-total", "held"),
            [repr(now), limits.rpm or 0, limits.tpm or 0, f"{now!r}:{holder}", repr(WINDOW_S),
             limits.concurrency if take_place else 0, holder, LEASE_S], None)
        if answer is None:
            return Admission(None, UNCOUNTED if take_place else None)
        verdict = answer[0].decode()
        if verdict == "ok":
            return Admission(None, self._holding(key, holder) if answer[1] else None)
        value = limits.rpm if verdict == "rpm" else limits.tpm
        return Admission(OverQuota(key, verdict, value, float(answer[1]) + WINDOW_S - now))

    async def take(self, key: str, concurrency: int) -> Any:
        holder = uuid.uuid4().hex
        taken = await self._run(_TAKE, self._names(key, "held"), [repr(self.clock()), concurrency, holder, LEASE_S],
                                UNCOUNTED)
        if taken == UNCOUNTED:
            return taken
        return self._holding(key, holder) if taken else None

    def _holding(self, key: str, holder: str) -> str:
        """Renew `holder`'s place from now on, until it is given back."""
        self._held[holder] = self._names(key, "held")[0]
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew())
        return holder

    async def end(self, key: str, place: Any, tokens: int) -> None:
        holder = place if self._held.pop(place, None) is not None else ""  # not UNCOUNTED: it was never held
        if holder or tokens > 0:
            names = self._names(key, "held", "tpm", "tpm-total")
            args = [holder, repr(self.clock()), tokens, uuid.uuid4().hex, repr(WINDOW_S)]
            if await self._run(_END, names, args, _FAILED) is _FAILED and holder:
                self._give_back_later(key, names, args)

    def _give_back_later(self, key: str, names: list[str], args: list[Any]) -> None:
        """Keep an end whose place Redis did not free, and send it again until Redis answers: left alone, the
        place would hold one of the key's `concurrency` for the rest of its lease (LEASE_S, the bound here)."""
        if not self._unreturned:
            log.warning("could not give back a place at once of the API key '%s' in Redis: trying again until it "
                        "answers (%.0f s at most; then the place lapses by itself)", key, LEASE_S)
        self._unreturned.append((self.clock() + LEASE_S, names, args))
        if self._returning is None or self._returning.done():
            self._returning = asyncio.get_running_loop().create_task(self._give_back())

    async def _give_back(self) -> None:
        while self._unreturned:
            await asyncio.sleep(RETRY_S)
            for end in list(self._unreturned):
                lapse, names, args = end
                if lapse <= self.clock() or await self._run(_END, names, args, _FAILED) is not _FAILED:
                    self._unreturned.remove(end)

    async def _renew(self) -> None:
        """Push each held place's lapse LEASE_S ahead, every LEASE_S / 3, while any is held, and the expiry of the
        record holding it with it (as a take sets it): a record left to expire would drop a place still held."""
        while self._held:
            await asyncio.sleep(LEASE_S / 3)
            lapse = self.clock() + LEASE_S
            try:
                async with self._client().pipeline(transaction=False) as pipe:
                    for holder, places in list(self._held.items()):
                        pipe.zadd(places, {holder: lapse}, xx=True)
                    for places in set(self._held.values()):
                        pipe.expire(places, math.ceil(LEASE_S) + 1)
                    await pipe.execute()
            except (aioredis.RedisError, OSError, asyncio.TimeoutError) as exc:
                self._outage.failed(exc)


_COUNTER: list[QuotaCounter] = []


def quota_counter() -> QuotaCounter:
    """This process's counter, of the class `LLAMASWAP_QUOTA_COUNTER` names."""
    if not _COUNTER:
        _COUNTER.append(import_string(settings.LLAMASWAP_QUOTA_COUNTER)())
    return _COUNTER[0]
