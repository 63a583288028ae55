"""When each waiting request will go: the scheduler itself, run forward on a copy.

Every job and load under way is assumed to take its typical time (see
`durations`); the copy is told of each end as it comes due, and makes the same
picks the real one would make then, with the scores of that moment. So the
prediction knows what the request competes with (slots, swaps, coexisting
models), what is ahead of it, and which aging crossovers happen meanwhile,
without a second model of the scheduler that could disagree with the first.

Requests keep arriving while one waits, and those that outrank it go first: so
the copy is also fed the requests expected meanwhile, each kind at the pace it
came at lately (`Arrivals`). Without them a batch request's wait would be
predicted as if nothing more urgent could come.

A job or load of a model with no history has no predicted end: the requests
that wait on it have no predicted wait either, and say why.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .durations import DurationHistory, JobKind
from .effects import Grant, StartModel, StopModel
from .ticket import Ticket

# Scheduler events the copy plays through at most, so a forecast of a very long queue stays cheap;
# requests beyond it are said to be too far ahead to predict.
MAX_EVENTS = 5000


@dataclass(frozen=True)
class Blocker:
    """What a request is predicted to wait for last: the end of a job, of a load, or of a stop."""

    kind: str  # job | load | stop
    model: str
    ticket_id: int | None  # the job's request
    in_s: float  # from now
    band: str = ""  # the job's band
    expected: bool = False  # the job is of a request expected to arrive meanwhile


@dataclass(frozen=True)
class Arrivals:
    """Requests of one kind and priority expected to keep coming, one every `every_s` seconds."""

    kind: JobKind
    priority: int
    every_s: float


@dataclass(frozen=True)
class Outlook:
    """One waiting request's forecast. `eta_s` counts to its dispatch (sent to its model), `load_s`
    the part of it spent starting that model; both None when `unknown` says why they cannot be told."""

    ticket_id: int
    position: int | None  # 1 = predicted to go next among the queued; None once its model starts for it
    eta_s: float | None
    load_s: float | None = None
    after: Blocker | None = None
    unknown: str = ""


@dataclass(frozen=True)
class Underway:
    """What runs at `now`, with when it began (same clock): jobs by ticket, model starts and stops."""

    jobs: Mapping[int, float]
    starts: Mapping[str, float]
    stops: Iterable[str] = ()


def forecast(
    scheduler,
    underway: Underway,
    kinds: Mapping[int, JobKind],
    waiting: Sequence[int],
    durations: DurationHistory,
    now: float,
    expected: Sequence[Arrivals] = (),
    max_events: int = MAX_EVENTS,
) -> dict[int, Outlook]:
    """The outlook of each of `waiting` (queued, or dispatched to a model that is starting for it),
    best-ranked first. `kinds` has every ticket of `waiting` and `underway.jobs`; `expected` are the
    requests expected to keep arriving meanwhile."""
    queued = {tid for tid in waiting if scheduler.is_queued(tid)}
    run = _Run(copy.deepcopy(scheduler), kinds, set(waiting), durations, now)
    for stream in expected:
        run.arrive_after(stream, now)
    for ticket_id, since in underway.jobs.items():
        kind = kinds[ticket_id]
        run.expect("finished", ticket_id, kind.model, now, durations.job_left_s(kind, now - since))
    for model, since in underway.starts.items():
        run.expect("ready", model, model, now, durations.load_left_s(model, now - since))
    for model in underway.stops:
        run.expect("stopped", model, model, now, 0.0)
    played = run.play(max_events)
    return run.outlooks(waiting, queued, complete=played)


class _Run:
    def __init__(self, sim, kinds: Mapping[int, JobKind], targets: set[int], durations: DurationHistory, now: float):
        self.sim = sim
        self.kinds = dict(kinds)  # and the requests the copy expects to arrive
        self.arrivals = itertools.count(-1, -1)  # their ticket ids: below every real one
        self.targets = targets
        self.durations = durations
        self.now = now
        self.events: list[tuple[float, int, str, object, str]] = []
        self.order = itertools.count()
        self.dispatched: dict[int, tuple[float, float | None, Blocker | None]] = {}
        self.launched: dict[str, tuple[float, Blocker | None]] = {}
        self.unknown: set[str] = set()  # what has no typical duration yet

    def expect(self, event: str, subject: object, model: str, at: float, after: float | None) -> None:
        """`event` comes due `after` seconds after `at` (never: its duration is not known)."""
        if after is None:
            self.unknown.add(f"{'a load of' if event == 'ready' else 'a request to'} {model}")
            return
        heapq.heappush(self.events, (at + after, next(self.order), event, subject, model))

    def arrive_after(self, stream: Arrivals, at: float) -> None:
        """The next request of `stream` arrives `every_s` after `at`."""
        heapq.heappush(self.events, (at + stream.every_s, next(self.order), "arrives", stream, stream.kind.model))

    def play(self, max_events: int) -> bool:
        """Play events until every target is dispatched; returns whether the forecast got that far
        (False: it ran out of known events, or of its budget)."""
        for _ in range(max_events):
            if self.targets <= self.dispatched.keys():
                return True
            if all(event == "arrives" for _, _, event, _, _ in self.events):
                return False  # nothing under way ends: arrivals alone free nothing
            at, _, event, subject, model = heapq.heappop(self.events)
            if event == "arrives":
                ticket = Ticket(next(self.arrivals), model, subject.priority, at)
                self.kinds[ticket.id] = subject.kind
                self.arrive_after(subject, at)
                self.carry_out(self.sim.submit(ticket, at), at, None)
                continue
            if event == "finished":
                band = self.kinds[subject].band
                cause = Blocker("job", model, subject, at - self.now, band, subject < 0)
                effects = self.sim.finished(subject, at)
            elif event == "ready":
                cause = Blocker("load", model, None, at - self.now)
                effects = self.sim.model_ready(subject, at)
            else:
                cause = Blocker("stop", model, None, at - self.now)
                effects = self.sim.model_stopped(subject, at)
            self.carry_out(effects, at, cause)
        return self.targets <= self.dispatched.keys()

    def carry_out(self, effects: list, at: float, cause: Blocker | None) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                kind = self.kinds.get(effect.ticket_id)
                if effect.ticket_id in self.targets:
                    launch = self.launched.get(effect.model) if effect.decision.needs_swap else None
                    load = None if launch is None else at - launch[0]
                    self.dispatched[effect.ticket_id] = (at, load, cause if launch is None else launch[1])
                if kind is not None:
                    self.expect("finished", effect.ticket_id, effect.model, at, self.durations.job_s(kind))
            elif isinstance(effect, StartModel):
                self.launched[effect.model] = (at, cause)
                self.expect("ready", effect.model, effect.model, at, self.durations.load_s(effect.model))
            elif isinstance(effect, StopModel):
                self.expect("stopped", effect.model, effect.model, at, 0.0)

    def outlooks(self, waiting: Sequence[int], queued_ids: set[int], complete: bool) -> dict[int, Outlook]:
        """Positions count the queued requests in predicted order, those with no prediction last."""
        queued = [tid for tid in waiting if tid in queued_ids]
        going = [tid for tid in self.dispatched if tid in queued_ids]  # in the order the copy dispatched them
        positions = {tid: n for n, tid in enumerate([*going, *(t for t in queued if t not in self.dispatched)], 1)}
        result = {}
        for tid in waiting:
            position = positions.get(tid)
            if tid in self.dispatched:
                at, load, after = self.dispatched[tid]
                result[tid] = Outlook(tid, position, at - self.now, load, after)
            else:
                result[tid] = Outlook(tid, position, None, unknown=self._why_unknown(complete))
        return result

    def _why_unknown(self, complete: bool) -> str:
        if self.unknown:
            return f"no history yet: {' or '.join(sorted(self.unknown))} has never finished, so its length is unknown"
        if not complete and self.events:
            return "too far back in the queue to predict"
        return "nothing under way is predicted to make room for it"
