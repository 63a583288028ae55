"""The engine's request path: a request queued, granted or refused, released, and the core's effects
carried out in order on the event loop (see the package's docstring for the parts it is made of)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import deque
from collections.abc import Collection, Coroutine, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from scheduling.core import (
    Band, Decision, Dequeued, Grant, ModelState, Refuse, Scheduler, SchedulerSnapshot, StartModel, StopModel, Ticket,
    band_of,
)
from scheduling.core.durations import DurationHistory
from scheduling.core.forecast import Outlook
from scheduling.events import Dispatched, Finished, ModelStateChanged, Queued, Unserved, RuntimeEvent
from scheduling.rows.columns import decision_fields, outcome_columns, request_columns
from scheduling.tickets import Carried, Interrupted, Lease, Outcome, Refused, RequestState, TicketRequest

from .forecasting import Forecasting, job_kind
from .held import HeldRequests, Waiter
from .model_leases import ModelLeases
from .operators import OperatorActions
from .processes import Fleet, ModelProcesses
from .relayed import RelayedRows

log = logging.getLogger("llamaswap.scheduler")

# How long a shutdown waits, once it has cut what still runs, for those requests to end before models stop.
SHUTDOWN_CUT_GRACE_S = 2.0

# Retry-After for a request whose maximum wait ran out when its dispatch cannot be predicted.
MAX_WAIT_RETRY_AFTER_S = 5


class HandedOver(Exception):
    """The request stays queued for the worker that takes over from this one: answer nothing."""


class SchedulerRuntime:
    def __init__(
        self,
        scheduler: Scheduler,
        fleet: Fleet,
        recorder,
        *,
        first_ticket_id: int = 1,
        ticket_ids: Callable[[], int] | None = None,
        observer: Callable[[RuntimeEvent], None] | None = None,
        durations: DurationHistory | None = None,
    ) -> None:
        self.scheduler = scheduler
        # Typical job and load times, for the forecast: seeded from the rows, then from what ends here.
        self.durations = durations or DurationHistory()
        self.fleet = fleet
        self.recorder = recorder
        self._observer = observer or (lambda event: None)
        self._loop = asyncio.get_running_loop()
        # Workers sharing a database take ids from it (scheduling.door.ticket_ids); one alone counts up.
        self._ticket_id = ticket_ids or itertools.count(first_ticket_id).__next__
        self.held = HeldRequests()  # waiting for their grant, or running under their lease
        self._effects: deque = deque()
        self._applying = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        # The model starts and stops under way, each reported to the core when it ends.
        self.processes = ModelProcesses(scheduler, fleet, self.durations, self._observer, self.now, self._run,
                                        self._spawn)
        self._closing = False
        self.forecasting = Forecasting(scheduler, self.held, self.processes, self.durations, self.now)
        self.snapshot: tuple[float, SchedulerSnapshot] = (self.now(), scheduler.snapshot(self.now()))
        self.relayed = RelayedRows(recorder, self._ticket_id, self._observer)  # served without the scheduler
        self.model_leases = ModelLeases(self)  # its rows' reads run once the service starts `run()`
        self.operators = OperatorActions(self)  # cancel, cut, re-rank, retune, reconfigure; calls from threads

    # -- clocks -------------------------------------------------------------------------------
    def now(self) -> float:
        return self._loop.time()

    def _wall(self, monotonic: float) -> datetime:
        return datetime.now(timezone.utc) - timedelta(seconds=max(0.0, self.now() - monotonic))

    # -- front-end API ------------------------------------------------------------------------
    def _refuse_if_unrecordable(self) -> None:
        """At the recorder's bound a request served now could not be recorded: refuse it instead."""
        if self.recorder.backlogged():
            raise Refused(503, "request_history_unreachable",
                           "the request history database is unreachable; retry later", 5)

    async def submit(self, request: TicketRequest, queued: Callable[[int], None] | None = None) -> Lease:
        """Queue a request and wait for the GPU; raises Refused, or CancelledError if the caller leaves.
        `queued` is told the request's ticket id as soon as it has one, to follow its progress."""
        if self._closing:
            raise Refused(503, "shutting_down", "llamaswap is shutting down; retry later", 1)
        self._refuse_if_unrecordable()
        now = self.now()
        waiter = self._queue(request, now, now, None)
        if queued is not None:
            queued(waiter.ticket.id)
        self._run(lambda: self.scheduler.submit(waiter.ticket, now))
        return await self._wait(waiter)

    def _queue(self, request: TicketRequest, now: float, arrival: float, ticket_id: int | None) -> Waiter:
        """Hold a place for `request`; a new request (no `ticket_id`) gets its row here."""
        record = ticket_id is None
        if record:
            ticket_id = self._ticket_id()
        ticket = Ticket(id=ticket_id, model=request.model, priority=request.priority, arrival=arrival,
                        key=request.api_key or None, weight=request.key_weight)
        waiter = Waiter(self._loop.create_future(), ticket, request)
        self.held.wait(waiter)
        if request.max_wait_s is not None:  # counted from arrival: a carried request's wait so far counts
            expiry = self._loop.call_at(arrival + request.max_wait_s, self._waited_too_long, ticket.id)
            waiter.future.add_done_callback(lambda _: expiry.cancel())
        band = band_of(request.priority)
        if record and request.method != "LOAD":
            self.forecasting.arrived(arrival, request)
        if record:
            self.recorder.create(
                ticket.id,
                **request_columns(request),
                max_wait_s=request.max_wait_s,
                state=RequestState.QUEUED,
                scheduler=self.scheduler.name,
                arrived_at=self._wall(arrival),
            )
        self._observer(Queued(request.model, band))
        return waiter

    async def _wait(self, waiter: Waiter) -> Lease:
        try:
            return await waiter.future
        except Refused as exc:
            exc.ticket_id = waiter.ticket.id
            raise
        except asyncio.CancelledError:
            self.cancel(waiter.ticket.id, f"client disconnected {self._where(waiter.ticket.id)}")
            raise

    def cancel(self, ticket_id: int, reason: str) -> None:
        """The caller is gone (or an operator cancelled it). Idempotent."""
        if ticket_id in self.held.granted:
            self.release(ticket_id, Outcome(state=RequestState.CANCELLED, error=reason))
            return
        self._end_waiting(ticket_id, reason)
        now = self.now()
        self._run(lambda: self.scheduler.cancel(ticket_id, now))

    def _end_waiting(self, ticket_id: int, reason: str) -> None:
        """A request not yet granted is cancelled: its caller is refused, its row ends."""
        waiter = self.held.stop_waiting(ticket_id)
        if waiter is None:
            return
        if not waiter.future.done():
            waiter.future.set_exception(Refused(499, "cancelled", reason))
            waiter.future.exception()  # mark retrieved: the caller may already be gone
        self.recorder.update(ticket_id, state=RequestState.CANCELLED, error=reason, finished_at=self._wall(self.now()))
        self._observe(waiter.request, Unserved(waiter.ticket.model, waiter.request.route, 499, cancelled=True,
                                               key=waiter.request.api_key))

    def _where(self, ticket_id: int) -> str:
        """Where a request not yet granted waits, in words: queued, or its model starting for it."""
        return "while queued" if self.scheduler.is_queued(ticket_id) else "while its model was starting for it"

    def _waited_too_long(self, ticket_id: int) -> None:
        """A request's `max_wait_s` ran out before its grant: refuse it, saying when to retry from the
        forecast of its dispatch."""
        waiter = self.held.waiting.get(ticket_id)
        if waiter is None or waiter.future.done():
            return  # granted or gone in the same instant
        outlook = self.forecasting.forecast(stale_ok=True).get(ticket_id)
        if outlook is None:  # a forecast made before it came: the next one, shared again, knows it
            outlook = self.forecasting.forecast().get(ticket_id)
        eta = None if outlook is None else outlook.eta_s
        expected = "" if eta is None else f"; it was expected to be sent in ~{math.ceil(eta)} s more"
        because = self.scheduler.held_back_because(ticket_id)
        message = (
            f"not sent to model '{waiter.request.model}' within its maximum wait of "
            f"{waiter.request.max_wait_s:g} s{expected}{f' (held back: {because})' if because else ''}; "
            "retry later, or allow a longer wait"
        )
        retry_after = MAX_WAIT_RETRY_AFTER_S if eta is None else max(1, math.ceil(eta))
        self._refuse_waiting(ticket_id, Refused(503, "max_wait_exceeded", message, retry_after), RequestState.REJECTED)

    def _refuse_waiting(self, ticket_id: int, reason: Refused, state: str) -> None:
        """End a waiting request with `reason` (its caller's error) and free its place."""
        waiter = self.held.take_waiter(ticket_id)
        if not waiter.future.done():  # its client may have left a moment ago
            waiter.future.set_exception(reason)
            waiter.future.exception()  # mark retrieved: nobody may be left to read it
        self.recorder.update(
            ticket_id, state=state, status_code=reason.status, error=reason.message,
            finished_at=self._wall(self.now()),
        )
        self._observe(waiter.request, Unserved(waiter.ticket.model, waiter.request.route, reason.status,
                                               cancelled=state == RequestState.CANCELLED, key=waiter.request.api_key))
        now = self.now()
        self._run(lambda: self.scheduler.cancel(ticket_id, now))

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        """The granted request ended. Synchronous and idempotent, so it is safe in `finally`."""
        if self._record_end(ticket_id, outcome):
            now = self.now()
            self._run(lambda: self.scheduler.finished(ticket_id, now))

    def _record_end(self, ticket_id: int, outcome: Outcome) -> bool:
        """A granted request ended: its row and metrics say how (the scheduler is told by the caller).
        Returns whether it was running."""
        granted = self.held.end(ticket_id)
        if granted is None:
            return False
        request, decision, granted_at = granted
        now = self.now()
        if outcome.state == RequestState.COMPLETED and request.method != "LOAD":  # a preload's "job" is no job
            self.durations.add_job(job_kind(request, decision.priority), now - granted_at)
        first_byte = outcome.first_byte_monotonic
        self.recorder.update(ticket_id, **outcome_columns(
            outcome, self._wall(now), now - granted_at, None if first_byte is None else self._wall(first_byte)
        ))
        if outcome.state == RequestState.FAILED:  # the model may have died: the next request must start it again
            self.fleet.check_exited(request.model)
        self._observe(request, Finished.of_granted(request.model, request.route, decision, outcome, granted_at, now,
                                                   request.api_key))
        return True

    # -- the queue's forecast ---------------------------------------------------------------------
    def forecast(self, stale_ok: bool = False) -> dict[int, Outlook]:
        """The outlook of every request not yet sent to its model (see `Forecasting.forecast`)."""
        return self.forecasting.forecast(stale_ok)

    def next_job_end_in(self, model: str) -> int | None:
        """Whole seconds until the first of `model`'s running jobs is predicted to end (see `Forecasting`)."""
        return self.forecasting.next_job_end_in(model)

    # -- relayed to a peer ----------------------------------------------------------------------
    def begin_relayed(self, request: TicketRequest, peer: str, started_at: datetime, explanation: str) -> int:
        """A request served without the scheduler (relayed to `peer`) began at `started_at`: its row, as
        dispatched at once (refused where it could not be recorded). Returns its ticket id; end it with
        `end_relayed`."""
        self._refuse_if_unrecordable()
        return self.relayed.begin(request, peer, started_at, explanation)

    def end_relayed(self, ticket_id: int, outcome: Outcome, seconds: float, first_byte_s: float | None) -> None:
        """A relayed request ended (see `RelayedRows.end`). Idempotent, as `release`."""
        self.relayed.end(ticket_id, outcome, seconds, first_byte_s)

    # -- model processes ------------------------------------------------------------------------
    def unload(self, models: list[str] | None = None) -> list[asyncio.Task]:
        """Stop these models now (None: every model). Requests they are serving are cut at once (see
        `Lease`); returns the stops under way for them, which end once their processes are gone."""
        now = self.now()
        self._run(lambda: self.scheduler.unload(models, now))
        return self.processes.stops_of(models)

    def model_exited(self, model: str) -> None:
        """A model process died on its own (crash): the core must stop counting it as loaded."""
        now = self.now()
        self._observer(ModelStateChanged(model, ModelState.STOPPED))
        self._run(lambda: self.scheduler.model_stopped(model, now))

    def memory_measured(self, model: str, use: Mapping[str, int]) -> None:
        """What `model`'s processes use on each GPU (MiB by GPU id), measured where they run: the core shows it
        and counts it where it is more than declared, which is said here."""
        warning = self.scheduler.memory_measured(model, use)
        if warning is not None:
            log.warning("%s", warning)

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _cut_requests_on(self, model: str) -> None:
        """An operator unloads `model`: what it is serving ends now, each client told why."""
        reason = Refused(
            503, "model_unloaded", f"model '{model}' was unloaded by an operator while this request was running"
        )
        self._cut([ticket_id for ticket_id, (request, _, _) in self.held.granted.items() if request.model == model], reason)

    # -- taking over from another worker: requests the previous one left queued are queued again with their
    # waits so far, a worker that stops hands its queue over unanswered, and a request a dead worker had
    # granted ends as its front end reports --------------------------------------------------------------


    def requeue(self, carried: list[Carried]) -> list[Coroutine[Any, Any, Lease]]:
        """Queue requests a previous worker had queued, all at once, and return what to await for
        each one's lease (as `submit`). Their waits so far count for aging."""
        if self._closing:
            raise Refused(503, "shutting_down", "llamaswap is shutting down; retry later", 1)
        now = self.now()
        wall = datetime.now(timezone.utc)
        waiters = [
            self._queue(c.request, now, now - max(0.0, (wall - c.arrived_at).total_seconds()), c.ticket_id)
            for c in carried
        ]
        self._run(lambda: self.scheduler.submit_all([w.ticket for w in waiters], now))
        return [self._wait(waiter) for waiter in waiters]

    def reopen(self, ticket_id: int, explanation: str) -> None:
        """A request whose row was ended `cancelled` is queued again under it (see `requeue`): the row
        says `queued` again, and why, until it ends as the request then does."""
        self.recorder.update(ticket_id, state=RequestState.QUEUED, status_code=None, error="", finished_at=None,
                             explanation=explanation)

    def drop_carried(self, ticket_id: int, reason: str) -> None:
        """A request a previous worker left queued is given up before it was queued again: its row ends."""
        self.recorder.update(ticket_id, state=RequestState.CANCELLED, error=reason, finished_at=self._wall(self.now()))

    def hand_over(self) -> int:
        """Stop serving the queue without answering it: the rows stay queued for the worker that takes
        over, which rebuilds the queue from them. Returns how many requests were handed over."""
        waiters = self.held.stop_all_waiting()
        now = self.now()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(HandedOver())
                waiter.future.exception()
            self._run(lambda ticket_id=waiter.ticket.id: self.scheduler.cancel(ticket_id, now))
        return len(waiters)

    def end_interrupted(self, interrupted: Interrupted, outcome: Outcome) -> None:
        """A request a dead worker had granted ended after all, its front end says how: its row says
        so instead of `interrupted`, with the times the front end stamped (see `stamped`)."""
        def wall(unix: float | None) -> datetime | None:
            return None if unix is None else datetime.fromtimestamp(unix, timezone.utc)

        finished_at = wall(outcome.ended_at) or self._wall(self.now())
        seconds = max(0.0, (finished_at - interrupted.dispatched_at).total_seconds())
        self.recorder.update(interrupted.ticket_id, **outcome_columns(
            outcome, finished_at, seconds, wall(outcome.first_byte_at)
        ))

    # -- reads, for the front doors' questions and the metrics ---------------------------------
    def ranked(self) -> list:
        return self.scheduler.ranked(self.now())

    def waiting_request(self, ticket_id: int) -> TicketRequest | None:
        waiter = self.held.waiting.get(ticket_id)
        return waiter.request if waiter else None

    def arrival_of(self, ticket_id: int) -> float | None:
        """When a waiting request arrived (`now()` clock), counting a previous worker's wait for it."""
        waiter = self.held.waiting.get(ticket_id)
        return waiter.ticket.arrival if waiter else None

    def running_requests(self) -> list[tuple[int, tuple[TicketRequest, Decision, float]]]:
        return list(self.held.granted.items())

    def tickets_of(self, origins: Collection[str]) -> list[int]:
        """The requests, waiting or running, that front ends know by these keys (distributed mode)."""
        waiting = [tid for tid, waiter in self.held.waiting.items() if waiter.request.origin in origins]
        return waiting + [tid for tid, (request, _, _) in self.held.granted.items() if request.origin in origins]

    def ticket_of(self, origin: str) -> int | None:
        """The ticket of the waiting request a front end knows as `origin` (distributed mode)."""
        return next((tid for tid, waiter in self.held.waiting.items() if waiter.request.origin == origin), None)

    def granted_request(self, ticket_id: int) -> tuple[TicketRequest, Decision, float] | None:
        """A running request with its dispatch decision and when it was granted (`now()` clock), or None."""
        return self.held.granted.get(ticket_id)

    def oldest_wait_by_band(self) -> dict[Band, float]:
        """Oldest wait per band as of now, from the last published snapshot (thread-safe read)."""
        taken_at, snap = self.snapshot
        elapsed = self._loop.time() - taken_at
        return {
            band: (wait + elapsed if snap.depth_by_band[band] else 0.0)
            for band, wait in snap.oldest_wait_by_band.items()
        }

    # -- ending many at once, and the shutdown ----------------------------------------------------
    def cancel_all(self, ticket_ids: list[int], reason: str) -> None:
        """Requests whose callers are gone together (their front end died), wherever each is: their
        rows end `cancelled` with `reason`, a running one's lease is revoked, and only then does the
        scheduler give out what they held, so none of them is granted or starts a model on its way out."""
        for ticket_id in ticket_ids:
            lease = self.held.lease(ticket_id)
            if not self._record_end(ticket_id, Outcome(state=RequestState.CANCELLED, error=reason)):
                self._end_waiting(ticket_id, reason)
            elif lease is not None:
                lease.revoke(Refused(499, "cancelled", reason))
        now = self.now()
        self._run(lambda: self.scheduler.cancel_all(ticket_ids, now))

    async def shutdown(self, drain_seconds: float) -> None:
        """Refuse new work, fail queued requests, give running ones `drain_seconds` to finish."""
        self._closing = True
        now = self.now()
        # The core asks to stop every model at once; that would cut the running request short, so the
        # stops wait until the drain is over (the service stops the whole fleet then).
        self._run(lambda: [e for e in self.scheduler.shutdown(now) if not isinstance(e, StopModel)])
        deadline = self.now() + drain_seconds
        while (self.held.granted or self.relayed.underway() or self._tasks) and self.now() < deadline:
            await asyncio.sleep(0.05)
        # What still runs is cut by the shutdown, not by its model stopping: each client is told so.
        cut = [lease for ticket_id in self.held.granted if (lease := self.held.lease(ticket_id)) is not None]
        self._cut(list(self.held.granted), Refused(503, "shutting_down", "llamaswap shut down before this request finished"))
        # A cut request closes its model server's connection as its holder ends: the models stop after
        # that, so a server is not killed in the middle of its side of the close.
        holders = [task for lease in cut if (task := lease.holder()) is not None]
        if holders:
            await asyncio.wait(holders, timeout=SHUTDOWN_CUT_GRACE_S)
        if self._timer:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()

    # -- effects --------------------------------------------------------------------------------
    def _run(self, step: Callable[[], list]) -> None:
        """Call the core and carry out what it returns, including effects of effects, in order."""
        self._effects.append(step)
        if self._applying:
            return
        self._applying = True
        try:
            while self._effects:
                item = self._effects.popleft()
                if callable(item):
                    self._effects.extend(item())
                else:
                    self._apply(item)
        finally:
            self._applying = False
            self.forecasting.changed()
        now = self.now()
        self.snapshot = (now, self.scheduler.snapshot(now))
        self._arm_timer()

    def _apply(self, effect) -> None:
        if isinstance(effect, Grant):
            self._grant(effect)
        elif isinstance(effect, Refuse):
            self._refuse(effect)
        elif isinstance(effect, StartModel):
            self.processes.start(effect)
        elif isinstance(effect, StopModel):
            if effect.reason == "unload":
                self._cut_requests_on(effect.model)
            self.processes.stop(effect)
        elif isinstance(effect, Dequeued):
            pass  # the row was already marked by cancel()/operators.cancel()
        else:
            raise TypeError(f"unknown scheduler effect {effect!r}")

    def _grant(self, effect: Grant) -> None:
        waiter = self.held.stop_waiting(effect.ticket_id)
        now = self.now()
        if waiter is None or waiter.future.done():
            # The caller left in the same instant; hand the GPU straight to the next request.
            if waiter is not None:
                self.recorder.update(
                    effect.ticket_id, state=RequestState.CANCELLED, error="client disconnected while queued",
                    finished_at=self._wall(now),
                )
            self._effects.append(lambda: self.scheduler.finished(effect.ticket_id, now))
            return
        decision = effect.decision
        lease = Lease(effect.ticket_id, effect.model, self.fleet.upstream_url(effect.model), decision)
        self.held.grant(effect.ticket_id, waiter.request, decision, now, lease)
        waiter.future.set_result(lease)
        self.recorder.update(effect.ticket_id, state=RequestState.DISPATCHED, dispatched_at=self._wall(now), **decision_fields(decision))
        self._observe(waiter.request, Dispatched(decision))

    def _refuse(self, effect: Refuse) -> None:
        waiter = self.held.stop_waiting(effect.ticket_id)
        self.recorder.update(
            effect.ticket_id,
            state=RequestState.REJECTED,
            status_code=effect.status,
            error=effect.message,
            finished_at=self._wall(self.now()),
        )
        if waiter is not None and not waiter.future.done():
            retry_after = effect.retry_after
            if effect.code == "concurrency_limit":  # a place frees when the first of its jobs ends
                retry_after = self.forecasting.next_job_end_in(waiter.request.model) or retry_after
            waiter.future.set_exception(Refused(effect.status, effect.code, effect.message, retry_after))
        self._observe(
            waiter and waiter.request,
            Unserved(waiter.ticket.model if waiter else "", waiter.request.route if waiter else "other", effect.status,
                     key=waiter.request.api_key if waiter else ""),
        )

    def _observe(self, request: TicketRequest | None, event: RuntimeEvent) -> None:
        """Count a request in the metrics; a load made for a lease or a preload (method LOAD) is no client's
        request: what counts of it is its model's load (`ModelLoaded`)."""
        if request is None or request.method != "LOAD":
            self._observer(event)

    def _cut(self, ticket_ids: list[int], reason: Refused) -> None:
        """End these running requests now: their rows say `reason`, and their holders tell their clients."""
        for ticket_id in ticket_ids:
            lease = self.held.lease(ticket_id)
            self.release(ticket_id, Outcome(state=RequestState.CANCELLED, status_code=reason.status, error=reason.message))
            if lease is not None:
                lease.revoke(reason)

    def _arm_timer(self) -> None:
        deadline = self.scheduler.next_deadline()
        if self._timer is not None:
            if deadline is not None and math.isclose(self._timer.when(), deadline):
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None and not self._closing:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self.now()
        self._run(lambda: self.scheduler.tick(now))

    # -- metrics view ---------------------------------------------------------------------------
