"""The scheduling core driven on a simulated clock, the way the runtime drives it on the real one.

The forecast (the queue as it stands, run forward) and the replay (recorded arrivals played again
under other settings) are both this one simulation: a heap of timed events, where a job's end, a
model ready or stopped and a deadline's tick are told to the scheduler, and what it asks for comes
due after the time the caller's `Timing` says it takes. Each caller adds only what is its own:
arrivals and departures, and what it watches in the effects.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

from .effects import Grant, StartModel, StopModel

# The events the scheduler itself is told of; a caller may put others of its own on the clock.
CORE_EVENTS = frozenset({"finished", "ready", "stopped", "tick"})


class Timing(Protocol):
    """How long what the scheduler asks for takes; None: unknown, so it never comes due."""

    def job_s(self, grant: Grant, now: float) -> float | None: ...

    def load_s(self, model: str) -> float | None: ...


class Simulation:
    def __init__(self, scheduler, timing: Timing) -> None:
        self.scheduler = scheduler
        self.timing = timing
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()  # what comes due at one instant goes in the order it was put on the clock

    def at(self, when: float, event: str, subject: object) -> None:
        heapq.heappush(self._events, (when, next(self._order), event, subject))

    def next_at(self) -> float | None:
        """When the next event comes due (None: nothing will)."""
        return self._events[0][0] if self._events else None

    def pop(self) -> tuple[float, str, object]:
        """The next event due: (when, event, subject)."""
        when, _, event, subject = heapq.heappop(self._events)
        return when, event, subject

    def tell(self, event: str, subject: object, now: float) -> list:
        """Tell the scheduler one of `CORE_EVENTS`; its effects, already carried out."""
        if event == "finished":
            effects = self.scheduler.finished(subject, now)
        elif event == "ready":
            effects = self.scheduler.model_ready(subject, now)
        elif event == "stopped":
            effects = self.scheduler.model_stopped(subject, now)
        else:
            effects = self.scheduler.tick(now)
        self.carry_out(effects, now)
        return effects

    def carry_out(self, effects: list, now: float) -> None:
        """Put what `effects` start on the clock: a granted job's end, a started model's readiness, a stop
        (at once: a load's time counts the stops it needed first)."""
        for effect in effects:
            if isinstance(effect, Grant):
                self._after(now, self.timing.job_s(effect, now), "finished", effect.ticket_id)
            elif isinstance(effect, StartModel):
                self._after(now, self.timing.load_s(effect.model), "ready", effect.model)
            elif isinstance(effect, StopModel):
                self.at(now, "stopped", effect.model)

    def _after(self, now: float, seconds: float | None, event: str, subject: object) -> None:
        if seconds is not None:
            self.at(now + seconds, event, subject)
