"""A key's quotas — requests per minute, tokens per minute, requests at once — and the sliding-window
arithmetic that says whether a request is admitted now and, when not, how long until it would be.

Pure: times are seconds passed in (`now`); `RateWindows` is the state one process keeps. Counters shared by
every front end (Redis) keep the same windows elsewhere and answer with the same `freed_at` arithmetic:
`proxy.serving.quota_counters`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# The window rpm and tpm count over: an entry made at `t` counts while `now - WINDOW_S < t`.
WINDOW_S = 60.0


@dataclass(frozen=True)
class QuotaLimits:
    """A key's limits; None: unlimited."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None

    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.concurrency is not None


UNLIMITED = QuotaLimits()


@dataclass(frozen=True)
class OverQuota:
    """A request refused: which limit (`rpm` or `tpm`), its value, and when the window frees enough."""

    key: str
    limit: str
    value: int
    retry_after_s: float

    def retry_after_header(self) -> str:
        """Whole seconds, rounded up: a client that waits that long is admitted (unless others come first)."""
        return str(max(1, math.ceil(self.retry_after_s)))

    def message(self) -> str:
        unit = ("request" if self.limit == "rpm" else "token") + ("" if self.value == 1 else "s")
        return (f"the API key '{self.key}' is over its limit of {self.value} {unit} per minute ({self.limit}); "
                f"try again in {self.retry_after_header()} s")


def rpm_freed_at(times: Iterable[float], rpm: int, now: float) -> float | None:
    """None when one more request fits under `rpm` now (fewer than rpm admitted in the window), else the time
    it will: when the oldest admission that must leave the window for one more to fit does (ascending times)."""
    inside = [t for t in times if t > now - WINDOW_S]
    if len(inside) < rpm:
        return None
    return inside[len(inside) - rpm] + WINDOW_S


def tpm_freed_at(spent: Iterable[tuple[float, int]], tpm: int, now: float) -> float | None:
    """None while the tokens counted in the window (`(when, tokens)`, ascending) are under `tpm`, else the
    time they will be, as the oldest leave it."""
    inside = [(at, tokens) for at, tokens in spent if at > now - WINDOW_S]
    total = sum(tokens for _, tokens in inside)
    if total < tpm:
        return None
    for at, tokens in inside:
        total -= tokens
        if total < tpm:
            return at + WINDOW_S
    raise AssertionError("unreachable: the total of an emptied window is 0, under any tpm of at least 1")


class RateWindows:
    """Each key's admissions and spent tokens over the last WINDOW_S, and its requests at once, in one process."""

    def __init__(self) -> None:
        self._admitted: dict[str, deque[float]] = {}
        self._spent: dict[str, deque[tuple[float, int]]] = {}
        self._spent_total: dict[str, int] = {}  # the sum of `_spent[key]`, so a check under tpm reads no entry
        self._holding: dict[str, int] = {}

    def admit(self, key: str, limits: QuotaLimits, now: float) -> OverQuota | None:
        """Admit one request of `key` now (counted against rpm), or say which limit refuses it until when."""
        admitted = self._admitted.setdefault(key, deque())
        while admitted and admitted[0] <= now - WINDOW_S:
            admitted.popleft()
        spent = self._spent.setdefault(key, deque())
        while spent and spent[0][0] <= now - WINDOW_S:
            self._spent_total[key] -= spent.popleft()[1]
        if (limits.rpm is not None and len(admitted) >= limits.rpm
                and (freed := rpm_freed_at(admitted, limits.rpm, now)) is not None):
            return OverQuota(key, "rpm", limits.rpm, freed - now)
        if (limits.tpm is not None and self._spent_total.get(key, 0) >= limits.tpm
                and (freed := tpm_freed_at(spent, limits.tpm, now)) is not None):
            return OverQuota(key, "tpm", limits.tpm, freed - now)
        if limits.rpm is not None:
            admitted.append(now)
        return None

    def spend(self, key: str, tokens: int, now: float) -> None:
        """Count `tokens` (a request's prompt and completion) against `key`'s tpm from `now`."""
        if tokens > 0:
            self._spent.setdefault(key, deque()).append((now, tokens))
            self._spent_total[key] = self._spent_total.get(key, 0) + tokens

    def take(self, key: str, concurrency: int) -> bool:
        """One of `key`'s places at once, if fewer than `concurrency` are held."""
        if self._holding.get(key, 0) >= concurrency:
            return False
        self._holding[key] = self._holding.get(key, 0) + 1
        return True

    def give_back(self, key: str) -> None:
        left = self._holding.get(key, 0) - 1
        if left > 0:
            self._holding[key] = left
        else:
            self._holding.pop(key, None)

