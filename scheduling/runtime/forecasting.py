"""The engine's forecast of the queue: the core's copy run forward (`scheduling.core.forecast`) on what is
waiting and running now, with the job and load times learned here and the pace requests arrive at; one
forecast serves every reader until the queue changes or a second passes."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from scheduling.core import band_of
from scheduling.core.durations import JobKind
from scheduling.core.forecast import Arrivals, Outlook, RecentArrivals, Underway, forecast
from scheduling.tickets import TicketRequest

log = logging.getLogger("llamaswap.scheduler")

# A forecast is reused until the scheduler's state changes or this much time has passed: everyone
# streaming a loading state, and every /api/queue reader, shares one run of the copy per second.
FORECAST_MAX_AGE_S = 1.0


class Forecasting:
    """The queue's forecast and what it is made from beyond the engine's state, owned here: the pace requests
    arrive at (`arrived`) and the scheduler's steps (`changed`), by which one forecast serves every reader until
    the queue changes or a second passes. It reads the requests held, the starts and stops under way and the
    durations learned. `SchedulerRuntime` makes one (`runtime.forecasting`)."""

    def __init__(self, scheduler, held, processes, durations, now: Callable[[], float]) -> None:
        self.scheduler = scheduler
        self.held = held
        self.processes = processes
        self.durations = durations
        self.now = now
        self._arrived = RecentArrivals()  # recent new requests, for their pace
        self._version = 0  # counts the scheduler's steps, so a forecast knows when it went stale
        self._forecast: tuple[int, float, dict[int, Outlook]] | None = None

    def arrived(self, arrival: float, request: TicketRequest) -> None:
        """A new request (not a load) arrived: it counts in its kind's pace."""
        self._arrived.add(arrival, job_kind(request, request.priority), request.priority)

    def changed(self) -> None:
        """The scheduler took a step: a forecast made before it is stale."""
        self._version += 1

    def forecast(self, stale_ok: bool = False) -> dict[int, Outlook]:
        """The outlook of every request not yet sent to its model (see `scheduling.core.forecast`), its
        times counted from now. `stale_ok`: one made before the queue last changed will do (a hint
        for many requests at once must not replay the forecast for each)."""
        now = self.now()
        cached = self._forecast
        if cached is not None and now - cached[1] < FORECAST_MAX_AGE_S and (stale_ok or cached[0] == self._version):
            return aged(cached[2], now - cached[1])
        kinds = {tid: job_kind(waiter.request, waiter.ticket.priority) for tid, waiter in self.held.waiting.items()}
        kinds.update((tid, job_kind(request, decision.priority)) for tid, (request, decision, _) in self.held.granted.items())
        ranked = [ticket.id for ticket, _ in self.scheduler.ranked(now) if ticket.id in self.held.waiting]
        starting = [tid for tid in self.held.waiting if not self.scheduler.is_queued(tid)]
        underway = Underway(
            jobs={tid: since for tid, (_, _, since) in self.held.granted.items()},
            starts=self.processes.starting_since(),
            stops=self.processes.stopping(),
        )
        waiting = [*starting, *ranked]
        try:
            outlooks = forecast(self.scheduler, underway, kinds, waiting, self.durations, now, self.expected_arrivals(now))
        except Exception:  # a prediction is a hint: never let it stop a refusal, a page or a stream
            log.exception("the forecast of the queue failed; waits are shown without a prediction")
            unknown = "the forecast failed (see the log)"
            outlooks = {tid: Outlook(tid, None, None, unknown=unknown) for tid in starting}
            outlooks.update((tid, Outlook(tid, n, None, unknown=unknown)) for n, tid in enumerate(ranked, 1))
        self._forecast = (self._version, now, outlooks)
        return outlooks

    def expected_arrivals(self, now: float) -> list[Arrivals]:
        """Each kind of request at the pace it arrived at lately, with its median priority."""
        return self._arrived.expected(now)

    def next_job_end_in(self, model: str) -> int | None:
        """Whole seconds (at least 1) until the first of `model`'s running jobs is predicted to end, from
        their typical durations; None when none runs or none has a typical duration."""
        now = self.now()
        ends = []
        for request, decision, since in self.held.granted.values():
            if request.model != model:
                continue
            left = self.durations.job_left_s(job_kind(request, decision.priority), now - since)
            if left is not None:
                ends.append(left)
        return max(1, math.ceil(min(ends))) if ends else None


def aged(outlooks: dict[int, Outlook], seconds: float) -> dict[int, Outlook]:
    """Outlooks made `seconds` ago, their times counted from now."""
    if seconds <= 0:
        return outlooks

    def sooner(value: float | None) -> float | None:
        return None if value is None else max(0.0, value - seconds)

    return {
        ticket_id: dataclasses.replace(
            outlook, eta_s=sooner(outlook.eta_s),
            after=None if outlook.after is None else dataclasses.replace(outlook.after, in_s=sooner(outlook.after.in_s)),
        )
        for ticket_id, outlook in outlooks.items()
    }


def job_kind(request: TicketRequest, priority: int) -> JobKind:
    """What the request's run time is learned and predicted by (see `scheduling.core.durations`)."""
    return JobKind(request.model, request.route, request.stream, band_of(priority).value)
