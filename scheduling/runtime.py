"""The single consumer that owns the GPU.

Consumers call `submit()` and await a lease; the pure scheduling core decides
who goes next and this runtime carries out what it asks for (grant, start or
stop a model, reject). Every core call happens on the event loop, one at a
time, so the core needs no locks. The runtime knows nothing of HTTP: model
processes are reached through a `fleet` object and rows through a recorder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from statistics import median
from typing import Any, Callable, Protocol

from scheduling.core import (
    Band,
    Decision,
    Dequeued,
    Grant,
    ModelSpec,
    Reject,
    Scheduler,
    SchedulerSnapshot,
    SerialSettings,
    StartModel,
    StopModel,
    SwapPolicy,
    Ticket,
    band_of,
)
from scheduling.core.durations import DurationHistory, JobKind
from scheduling.core.forecast import Arrivals, Outlook, Underway, forecast
from scheduling.events import Dispatched, Finished, ModelLoaded, ModelStateChanged, Queued, Refused, RuntimeEvent

log = logging.getLogger("llamaswap.scheduler")

# A forecast is reused until the scheduler's state changes or this much time has passed: everyone
# streaming a loading state, and every /api/queue reader, shares one run of the copy per second.
FORECAST_MAX_AGE_S = 1.0
# The pace of arrivals the forecast expects to go on: each kind's arrivals over the last ten minutes,
# once at least three came over ten seconds or more (a single burst is no pace).
ARRIVAL_WINDOW_S = 600.0
ARRIVAL_MIN_SPAN_S = 10.0
ARRIVAL_MIN_COUNT = 3
# Retry-After for a request whose maximum wait ran out when its dispatch cannot be predicted.
MAX_WAIT_RETRY_AFTER_S = 5


class Fleet(Protocol):
    """What the runtime needs from model-process management."""

    async def swap_in(self, model: str, evict: tuple[str, ...]) -> None: ...  # raises on failure
    async def stop(self, model: str) -> None: ...
    def upstream_url(self, model: str) -> str: ...
    def check_exited(self, model: str) -> bool: ...  # a dead process is reported as a crash at once


@dataclass(frozen=True)
class TicketRequest:
    """What a front end knows about a request when it asks for the GPU."""

    model: str
    path: str
    priority: int
    requested_model: str = ""
    method: str = "POST"
    stream: bool = False
    client: str = ""
    route: str = "other"  # the path as a bounded metrics label, which only the front end can tell
    origin: str = ""  # distributed mode: the front end's key for it (see QueuedRequest.origin)
    max_wait_s: float | None = None  # refused if not granted this long after it arrived (the caller's limit)
    selector: str = ""  # the selector (a virtual model ID) that picked `model`, if one did


@dataclass(frozen=True)
class Carried:
    """A request queued before this runtime started (a worker that took over): when it arrived, so
    aging carries on, and the row the previous worker wrote for it, if it wrote one."""

    request: TicketRequest
    arrived_at: datetime
    ticket_id: int | None = None


class HandedOver(Exception):
    """The request stays queued for the worker that takes over from this one: answer nothing."""


@dataclass(eq=False)
class Lease:
    """Permission to send one request upstream; give it back with `release()`.

    An operator who unloads the model takes the GPU back at once: the lease is then `cut`, with
    the reason to give the client, and the task that `held_by()` it is cancelled.
    """

    ticket_id: int
    model: str
    upstream: str
    decision: Decision
    cut: Rejected | None = None
    _holder: asyncio.Task | None = field(default=None, repr=False)

    def held_by(self, task: asyncio.Task) -> None:
        """`task` sends the request; a cut cancels it (at once, if the cut came first)."""
        self._holder = task
        if self.cut is not None:
            task.cancel()

    def revoke(self, reason: Rejected) -> None:
        self.cut = reason
        if self._holder is not None:
            self._holder.cancel()


class Rejected(Exception):
    """The scheduler answered a request with an error instead of a grant."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None,
                 ticket_id: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.ticket_id = ticket_id  # the refused request's row, when it had one: its client can look it up


@dataclass(frozen=True)
class Outcome:
    """How a granted request ended, for its row."""

    state: str  # completed | failed | cancelled
    status_code: int | None = None
    error: str = ""
    usage: dict[str, Any] | None = None
    first_byte_monotonic: float | None = None
    response_bytes: int | None = None


@dataclass
class _Waiter:
    future: asyncio.Future
    ticket: Ticket
    request: TicketRequest


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
        # Workers sharing a database take ids from it (scheduling.ticket_ids); one alone counts up.
        self._ticket_id = ticket_ids or itertools.count(first_ticket_id).__next__
        self._waiting: dict[int, _Waiter] = {}
        self._granted: dict[int, tuple[TicketRequest, Decision, float]] = {}
        self._leases: dict[int, Lease] = {}
        self._relayed: dict[int, tuple[TicketRequest, datetime]] = {}  # served without the scheduler, until they end
        self._effects: deque = deque()
        self._applying = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self._starts: dict[str, asyncio.Task] = {}
        self._stops: dict[str, asyncio.Task] = {}
        self._starting_since: dict[str, float] = {}
        self._closing = False
        self._arrived: deque[tuple[float, JobKind, int]] = deque(maxlen=5000)  # recent new requests, for their pace
        self._version = 0  # counts the scheduler's steps, so a forecast knows when it went stale
        self._forecast: tuple[int, float, dict[int, Outlook]] | None = None
        self.snapshot: tuple[float, SchedulerSnapshot] = (self.now(), scheduler.snapshot(self.now()))

    # -- clocks -------------------------------------------------------------------------------
    def now(self) -> float:
        return self._loop.time()

    def _wall(self, monotonic: float) -> datetime:
        return datetime.now(timezone.utc) - timedelta(seconds=max(0.0, self.now() - monotonic))

    # -- front-end API ------------------------------------------------------------------------
    async def submit(self, request: TicketRequest, queued: Callable[[int], None] | None = None) -> Lease:
        """Queue a request and wait for the GPU; raises Rejected, or CancelledError if the caller leaves.
        `queued` is told the request's ticket id as soon as it has one, to follow its progress."""
        if self._closing:
            raise Rejected(503, "shutting_down", "llamaswap is shutting down; retry later", 1)
        now = self.now()
        waiter = self._queue(request, now, now, None)
        if queued is not None:
            queued(waiter.ticket.id)
        self._run(lambda: self.scheduler.submit(waiter.ticket, now))
        return await self._wait(waiter)

    def requeue(self, carried: list[Carried]) -> list[Coroutine[Any, Any, Lease]]:
        """Queue requests a previous worker had queued, all at once, and return what to await for
        each one's lease (as `submit`). Their waits so far count for aging."""
        if self._closing:
            raise Rejected(503, "shutting_down", "llamaswap is shutting down; retry later", 1)
        now = self.now()
        wall = datetime.now(timezone.utc)
        waiters = [
            self._queue(c.request, now, now - max(0.0, (wall - c.arrived_at).total_seconds()), c.ticket_id)
            for c in carried
        ]
        self._run(lambda: self.scheduler.submit_all([w.ticket for w in waiters], now))
        return [self._wait(waiter) for waiter in waiters]

    def drop_carried(self, ticket_id: int, reason: str) -> None:
        """A request a previous worker left queued is given up before it was queued again: its row ends."""
        self.recorder.update(ticket_id, state="cancelled", error=reason, finished_at=self._wall(self.now()))

    def hand_over(self) -> int:
        """Stop serving the queue without answering it: the rows stay queued for the worker that takes
        over, which rebuilds the queue from them. Returns how many requests were handed over."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        now = self.now()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(HandedOver())
                waiter.future.exception()
            self._run(lambda ticket_id=waiter.ticket.id: self.scheduler.cancel(ticket_id, now))
        return len(waiters)

    def _queue(self, request: TicketRequest, now: float, arrival: float, ticket_id: int | None) -> _Waiter:
        """Hold a place for `request`; a new request (no `ticket_id`) gets its row here."""
        record = ticket_id is None
        if record:
            ticket_id = self._ticket_id()
        ticket = Ticket(id=ticket_id, model=request.model, priority=request.priority, arrival=arrival)
        waiter = _Waiter(self._loop.create_future(), ticket, request)
        self._waiting[ticket.id] = waiter
        if request.max_wait_s is not None:  # counted from arrival: a carried request's wait so far counts
            expiry = self._loop.call_at(arrival + request.max_wait_s, self._waited_too_long, ticket.id)
            waiter.future.add_done_callback(lambda _: expiry.cancel())
        band = band_of(request.priority)
        if record and request.method != "LOAD":
            self._arrived.append((arrival, job_kind(request, request.priority), request.priority))
        if record:
            self.recorder.create(
                ticket.id,
                **_request_columns(request),
                max_wait_s=request.max_wait_s,
                state="queued",
                scheduler=self.scheduler.name,
                arrived_at=self._wall(arrival),
            )
        self._observer(Queued(request.model, band))
        return waiter

    async def _wait(self, waiter: _Waiter) -> Lease:
        try:
            return await waiter.future
        except Rejected as exc:
            exc.ticket_id = waiter.ticket.id
            raise
        except asyncio.CancelledError:
            self.cancel(waiter.ticket.id, f"client disconnected {self._where(waiter.ticket.id)}")
            raise

    def cancel(self, ticket_id: int, reason: str) -> None:
        """The caller is gone (or an operator cancelled it). Idempotent."""
        waiter = self._waiting.pop(ticket_id, None)
        if waiter is not None:
            if not waiter.future.done():
                waiter.future.set_exception(Rejected(499, "cancelled", reason))
                waiter.future.exception()  # mark retrieved: the caller may already be gone
            self.recorder.update(
                ticket_id, state="cancelled", error=reason, finished_at=self._wall(self.now())
            )
            self._observer(Refused(waiter.ticket.model, waiter.request.route, 499, cancelled=True))
        elif ticket_id in self._granted:
            self.release(ticket_id, Outcome(state="cancelled", error=reason))
            return
        now = self.now()
        self._run(lambda: self.scheduler.cancel(ticket_id, now))

    def operator_cut(self, ticket_id: int) -> bool:
        """Operator action: end a running request now, its client told why. Returns whether it ran."""
        if ticket_id not in self._granted:
            return False
        self._cut([ticket_id], Rejected(503, "cancelled_by_operator", "cancelled by an operator while running"))
        return True

    def operator_cancel(self, ticket_id: int) -> bool:
        """Admin action: fail a queued request with a clear message. Returns whether it was waiting."""
        if ticket_id not in self._waiting:
            return False
        reason = Rejected(503, "cancelled_by_operator", f"cancelled by an operator {self._where(ticket_id)}")
        self._refuse_waiting(ticket_id, reason, "cancelled")
        return True

    def _where(self, ticket_id: int) -> str:
        """Where a request not yet granted waits, in words: queued, or its model starting for it."""
        return "while queued" if self.scheduler.is_queued(ticket_id) else "while its model was starting for it"

    def _waited_too_long(self, ticket_id: int) -> None:
        """A request's `max_wait_s` ran out before its grant: refuse it, saying when to retry from the
        forecast of its dispatch."""
        waiter = self._waiting.get(ticket_id)
        if waiter is None or waiter.future.done():
            return  # granted or gone in the same instant
        outlook = self.forecast(stale_ok=True).get(ticket_id)
        eta = None if outlook is None else outlook.eta_s
        expected = "" if eta is None else f"; it was expected to be sent in ~{math.ceil(eta)} s more"
        message = (
            f"not sent to model '{waiter.request.model}' within its maximum wait of "
            f"{waiter.request.max_wait_s:g} s{expected}; retry later, or allow a longer wait"
        )
        retry_after = MAX_WAIT_RETRY_AFTER_S if eta is None else max(1, math.ceil(eta))
        self._refuse_waiting(ticket_id, Rejected(503, "max_wait_exceeded", message, retry_after), "rejected")

    def _refuse_waiting(self, ticket_id: int, reason: Rejected, state: str) -> None:
        """End a waiting request with `reason` (its caller's error) and free its place."""
        waiter = self._waiting.pop(ticket_id)
        if not waiter.future.done():  # its client may have left a moment ago
            waiter.future.set_exception(reason)
            waiter.future.exception()  # mark retrieved: nobody may be left to read it
        self.recorder.update(
            ticket_id, state=state, status_code=reason.status, error=reason.message,
            finished_at=self._wall(self.now()),
        )
        self._observer(Refused(waiter.ticket.model, waiter.request.route, reason.status, cancelled=state == "cancelled"))
        now = self.now()
        self._run(lambda: self.scheduler.cancel(ticket_id, now))

    def reprioritize(self, ticket_id: int, priority: int) -> bool:
        """Admin action: re-rank a queued request. Returns whether it was still queued (one whose
        model is starting for it has left the queue)."""
        if ticket_id not in self._waiting or not self.scheduler.is_queued(ticket_id):
            return False
        now = self.now()
        self._run(lambda: self.scheduler.reprioritize(ticket_id, priority, now))
        self.recorder.update(ticket_id, priority=priority, band=band_of(priority).value)
        return True

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        """The granted request ended. Synchronous and idempotent, so it is safe in `finally`."""
        granted = self._granted.pop(ticket_id, None)
        if granted is None:
            return
        self._leases.pop(ticket_id, None)
        request, decision, granted_at = granted
        now = self.now()
        if outcome.state == "completed" and request.method != "LOAD":  # a preload's "job" is no job
            self.durations.add_job(job_kind(request, decision.priority), now - granted_at)
        first_byte = outcome.first_byte_monotonic
        self.recorder.update(ticket_id, **_outcome_columns(
            outcome, self._wall(now), now - granted_at, None if first_byte is None else self._wall(first_byte)
        ))
        if outcome.state == "failed":  # the model may have died: the next request must start it again
            self.fleet.check_exited(request.model)
        self._observer(
            Finished(
                model=request.model,
                route=request.route,
                band=decision.band,
                state=outcome.state,
                status=outcome.status_code,
                seconds=now - granted_at,
                ttfb_s=None if outcome.first_byte_monotonic is None else outcome.first_byte_monotonic - granted_at,
                usage=outcome.usage or {},
            )
        )
        self._run(lambda: self.scheduler.finished(ticket_id, now))

    def begin_relayed(self, request: TicketRequest, peer: str, started_at: datetime, explanation: str) -> int:
        """A request served without the scheduler (relayed to `peer`) began at `started_at`: its row, as
        dispatched at once. Returns its ticket id; end it with `end_relayed`."""
        ticket_id = self._ticket_id()
        self._relayed[ticket_id] = (request, started_at)
        self.recorder.create(
            ticket_id,
            **_request_columns(request),
            peer=peer,
            state="dispatched",
            arrived_at=started_at,
            dispatched_at=started_at,
            explanation=explanation,
        )
        return ticket_id

    def end_relayed(self, ticket_id: int, outcome: Outcome, seconds: float, first_byte_s: float | None) -> None:
        """A relayed request ended, `seconds` after it began (its first byte `first_byte_s` after).
        Idempotent, as `release`."""
        relayed = self._relayed.pop(ticket_id, None)
        if relayed is None:
            return
        request, started_at = relayed
        first_byte_at = None if first_byte_s is None else started_at + timedelta(seconds=first_byte_s)
        self.recorder.update(ticket_id, **_outcome_columns(
            outcome, started_at + timedelta(seconds=seconds), seconds, first_byte_at
        ))
        self._observer(
            Finished(
                model=request.model, route=request.route, band=band_of(request.priority), state=outcome.state,
                status=outcome.status_code, seconds=seconds, ttfb_s=first_byte_s, usage=outcome.usage or {},
            )
        )

    # -- operator API ---------------------------------------------------------------------------
    def retune(self, settings: SerialSettings) -> None:
        now = self.now()
        self._run(lambda: self.scheduler.retune(settings, now))

    def reconfigure(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: list[str]) -> None:
        """A reloaded config: new model table and swap groups; `restart` models get a fresh process."""
        now = self.now()
        self._run(lambda: self.scheduler.reconfigure(models, policy, restart, now))

    def unload(self, models: list[str] | None = None) -> list[asyncio.Task]:
        """Stop these models now (None: every model). Requests they are serving are cut at once (see
        `Lease`); returns the stops under way for them, which end once their processes are gone."""
        now = self.now()
        self._run(lambda: self.scheduler.unload(models, now))
        return [task for model, task in self._stops.items() if models is None or model in models]

    def model_exited(self, model: str) -> None:
        """A model process died on its own (crash): the core must stop counting it as loaded."""
        now = self.now()
        self._observer(ModelStateChanged(model, "stopped"))
        self._run(lambda: self.scheduler.model_stopped(model, now))

    def ranked(self) -> list:
        return self.scheduler.ranked(self.now())

    def forecast(self, stale_ok: bool = False) -> dict[int, Outlook]:
        """The outlook of every request not yet sent to its model (see `scheduling.core.forecast`), its
        times counted from now. `stale_ok`: one made before the queue last changed will do (a hint
        for many requests at once must not replay the forecast for each)."""
        now = self.now()
        cached = self._forecast
        if cached is not None and now - cached[1] < FORECAST_MAX_AGE_S and (stale_ok or cached[0] == self._version):
            return aged(cached[2], now - cached[1])
        kinds = {tid: job_kind(waiter.request, waiter.ticket.priority) for tid, waiter in self._waiting.items()}
        kinds.update((tid, job_kind(request, decision.priority)) for tid, (request, decision, _) in self._granted.items())
        ranked = [ticket.id for ticket, _ in self.scheduler.ranked(now) if ticket.id in self._waiting]
        starting = [tid for tid in self._waiting if not self.scheduler.is_queued(tid)]
        underway = Underway(
            jobs={tid: since for tid, (_, _, since) in self._granted.items()},
            starts=dict(self._starting_since),
            stops=[model for model in self._stops if model not in self._starting_since],
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
        while self._arrived and self._arrived[0][0] < now - ARRIVAL_WINDOW_S:
            self._arrived.popleft()
        if not self._arrived or now - self._arrived[0][0] < ARRIVAL_MIN_SPAN_S:
            return []
        span = now - self._arrived[0][0]
        priorities: dict[JobKind, list[int]] = {}
        for _, kind, priority in self._arrived:
            priorities.setdefault(kind, []).append(priority)
        return [
            Arrivals(kind, int(median(seen)), span / len(seen))
            for kind, seen in priorities.items()
            if len(seen) >= ARRIVAL_MIN_COUNT
        ]

    def next_job_end_in(self, model: str) -> int | None:
        """Whole seconds (at least 1) until the first of `model`'s running jobs is predicted to end, from
        their typical durations; None when none runs or none has a typical duration."""
        now = self.now()
        ends = []
        for request, decision, since in self._granted.values():
            left = self.durations.job_left_s(job_kind(request, decision.priority), now - since)
            if request.model == model and left is not None:
                ends.append(left)
        return max(1, math.ceil(min(ends))) if ends else None

    def from_thread(self, fn: Callable[..., Any], *args: Any, timeout: float = 5.0) -> Any:
        """Run `fn(*args)` on the runtime's event loop from another thread (sync admin views) and return its result."""

        async def call():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    def waiting_request(self, ticket_id: int) -> TicketRequest | None:
        waiter = self._waiting.get(ticket_id)
        return waiter.request if waiter else None

    def arrival_of(self, ticket_id: int) -> float | None:
        """When a waiting request arrived (`now()` clock), counting a previous worker's wait for it."""
        waiter = self._waiting.get(ticket_id)
        return waiter.ticket.arrival if waiter else None

    def running_requests(self) -> list[tuple[int, tuple[TicketRequest, Decision, float]]]:
        return list(self._granted.items())

    def ticket_of(self, origin: str) -> int | None:
        """The ticket of the waiting request a front end knows as `origin` (distributed mode)."""
        return next((tid for tid, waiter in self._waiting.items() if waiter.request.origin == origin), None)

    def granted_request(self, ticket_id: int) -> tuple[TicketRequest, Decision, float] | None:
        """A running request with its dispatch decision and when it was granted (`now()` clock), or None."""
        return self._granted.get(ticket_id)

    async def shutdown(self, drain_seconds: float) -> None:
        """Refuse new work, fail queued requests, give running ones `drain_seconds` to finish."""
        self._closing = True
        now = self.now()
        # The core asks to stop every model at once; that would cut the running request short, so the
        # stops wait until the drain is over (the service stops the whole fleet then).
        self._run(lambda: [e for e in self.scheduler.shutdown(now) if not isinstance(e, StopModel)])
        deadline = self.now() + drain_seconds
        while (self._granted or self._relayed or self._tasks) and self.now() < deadline:
            await asyncio.sleep(0.05)
        # What still runs is cut by the shutdown, not by its model stopping: each client is told so.
        self._cut(list(self._granted), Rejected(503, "shutting_down", "llamaswap shut down before this request finished"))
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
            self._version += 1
        now = self.now()
        self.snapshot = (now, self.scheduler.snapshot(now))
        self._arm_timer()

    def _apply(self, effect) -> None:
        if isinstance(effect, Grant):
            self._grant(effect)
        elif isinstance(effect, Reject):
            self._reject(effect)
        elif isinstance(effect, StartModel):
            self._starts[effect.model] = self._spawn(self._start_model(effect))
        elif isinstance(effect, StopModel):
            if effect.reason == "unload":
                self._cut_requests_on(effect.model)
            self._stops[effect.model] = self._spawn(self._stop_model(effect))
        elif isinstance(effect, Dequeued):
            pass  # the row was already marked by cancel()/operator_cancel()
        else:
            raise TypeError(f"unknown scheduler effect {effect!r}")

    def _grant(self, effect: Grant) -> None:
        waiter = self._waiting.pop(effect.ticket_id, None)
        now = self.now()
        if waiter is None or waiter.future.done():
            # The caller left in the same instant; hand the GPU straight to the next request.
            if waiter is not None:
                self.recorder.update(
                    effect.ticket_id, state="cancelled", error="client disconnected while queued",
                    finished_at=self._wall(now),
                )
            self._effects.append(lambda: self.scheduler.finished(effect.ticket_id, now))
            return
        decision = effect.decision
        self._granted[effect.ticket_id] = (waiter.request, decision, now)
        lease = Lease(effect.ticket_id, effect.model, self.fleet.upstream_url(effect.model), decision)
        self._leases[effect.ticket_id] = lease
        waiter.future.set_result(lease)
        self.recorder.update(effect.ticket_id, state="dispatched", dispatched_at=self._wall(now), **decision_fields(decision))
        self._observer(Dispatched(decision))

    def _reject(self, effect: Reject) -> None:
        waiter = self._waiting.pop(effect.ticket_id, None)
        self.recorder.update(
            effect.ticket_id,
            state="rejected",
            status_code=effect.status,
            error=effect.message,
            finished_at=self._wall(self.now()),
        )
        if waiter is not None and not waiter.future.done():
            retry_after = effect.retry_after
            if effect.code == "concurrency_limit":  # a place frees when the first of its jobs ends
                retry_after = self.next_job_end_in(waiter.request.model) or retry_after
            waiter.future.set_exception(Rejected(effect.status, effect.code, effect.message, retry_after))
        self._observer(
            Refused(waiter.ticket.model if waiter else "", waiter.request.route if waiter else "other", effect.status)
        )

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _start_model(self, effect: StartModel) -> None:
        try:
            await self._start_and_report(effect)
        finally:
            if self._starts.get(effect.model) is asyncio.current_task():
                del self._starts[effect.model]
                self._starting_since.pop(effect.model, None)

    async def _start_and_report(self, effect: StartModel) -> None:
        started = self._starting_since[effect.model] = self.now()
        self._observer(ModelStateChanged(effect.model, "starting"))
        try:
            await self.fleet.swap_in(effect.model, tuple(effect.evict))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any start failure is reported to the waiting requests, never raised
            reason = str(exc) or type(exc).__name__  # the text names the cause; the model is named here
            log.warning("model %s failed to start: %s", effect.model, reason)
            self._observer(ModelStateChanged(effect.model, "stopped"))
            self._run(lambda: self.scheduler.model_failed(effect.model, reason, self.now()))
            return
        self.durations.add_load(effect.model, self.now() - started)
        self._observer(ModelLoaded(effect.model, self.now() - started))
        self._observer(ModelStateChanged(effect.model, "ready"))
        for model in effect.evict:
            self._observer(ModelStateChanged(model, "stopped"))
        self._run(lambda: self.scheduler.model_ready(effect.model, self.now()))

    def _cut_requests_on(self, model: str) -> None:
        """An operator unloads `model`: what it is serving ends now, each client told why."""
        reason = Rejected(
            503, "model_unloaded", f"model '{model}' was unloaded by an operator while this request was running"
        )
        self._cut([ticket_id for ticket_id, (request, _, _) in self._granted.items() if request.model == model], reason)

    def _cut(self, ticket_ids: list[int], reason: Rejected) -> None:
        """End these running requests now: their rows say `reason`, and their holders tell their clients."""
        for ticket_id in ticket_ids:
            lease = self._leases.get(ticket_id)
            self.release(ticket_id, Outcome(state="cancelled", status_code=reason.status, error=reason.message))
            if lease is not None:
                lease.revoke(reason)

    async def _stop_model(self, effect: StopModel) -> None:
        self._observer(ModelStateChanged(effect.model, "stopping"))
        try:
            try:
                await self.fleet.stop(effect.model)
            except Exception:  # the process is treated as gone either way; say why it may not be
                log.exception("stopping model %s failed", effect.model)
            start = self._starts.get(effect.model)
            if start is not None:
                # A start this stop cut short must report its failure before the stop is reported,
                # or the core could blame that failure on a later start of the same model.
                await asyncio.wait([start])
        finally:
            if self._stops.get(effect.model) is asyncio.current_task():
                del self._stops[effect.model]
            self._observer(ModelStateChanged(effect.model, "stopped"))
            self._run(lambda: self.scheduler.model_stopped(effect.model, self.now()))

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
    def oldest_wait_by_band(self) -> dict[Band, float]:
        """Oldest wait per band as of now, from the last published snapshot (thread-safe read)."""
        taken_at, snap = self.snapshot
        elapsed = self._loop.time() - taken_at
        return {
            band: (wait + elapsed if snap.depth_by_band[band] else 0.0)
            for band, wait in snap.oldest_wait_by_band.items()
        }


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


def _request_columns(request: TicketRequest) -> dict[str, Any]:
    """A request's row columns as it arrived, alike for a queued request and one relayed to a peer."""
    return {
        "model": request.model,
        "requested_model": request.requested_model,
        "method": request.method,
        "path": request.path,
        "stream": request.stream,
        "client": request.client,
        "origin": request.origin,
        "route": request.route,
        "selector": request.selector,
        "priority": request.priority,
        "band": band_of(request.priority).value,
    }


def _outcome_columns(outcome: Outcome, finished_at: datetime, seconds: float,
                     first_byte_at: datetime | None) -> dict[str, Any]:
    """A request's row columns as it ended, alike for a scheduled request and one relayed to a peer."""
    columns: dict[str, Any] = {
        "state": outcome.state,
        "status_code": outcome.status_code,
        "error": outcome.error,
        "finished_at": finished_at,
        "duration_ms": int(seconds * 1000),
    }
    if first_byte_at is not None:
        columns["first_byte_at"] = first_byte_at
    if outcome.response_bytes is not None:
        columns["response_bytes"] = outcome.response_bytes
    if outcome.usage:
        columns.update(outcome.usage)
    return columns


def job_kind(request: TicketRequest, priority: int) -> JobKind:
    """What the request's run time is learned and predicted by (see `scheduling.core.durations`)."""
    return JobKind(request.model, request.route, request.stream, band_of(priority).value)


def decision_fields(decision: Decision) -> dict[str, Any]:
    """The activity-log columns of a dispatch decision."""
    fields: dict[str, Any] = {
        "score_priority": decision.terms.priority,
        "score_affinity": decision.terms.affinity,
        "score_aging": decision.terms.aging,
        "runner_up_id": decision.runner_up_id,
        "runner_up_score": decision.runner_up_score,
        "changed_by_aging": decision.changed_by_aging,
        "changed_by_affinity": decision.changed_by_affinity,
        "needed_swap": decision.needs_swap,
        "explanation": decision.explain(),
        "slot": decision.slot,
        "waited_because": decision.waited_because,
    }
    if decision.scheduler == "serial":
        fields.update(
            serial_priority=decision.priority,
            serial_band=str(decision.band),
            serial_score=decision.score,
            serial_queue_wait_ms=int(decision.queue_wait_s * 1000),
        )
    else:
        fields.update(fifo_priority=decision.fifo_priority)
    return fields
