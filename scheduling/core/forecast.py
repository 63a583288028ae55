"""When each waiting request will go: the scheduler itself, run forward on a copy.

Every job and load under way is assumed to take its typical time (see
`durations`; the jobs the copy plays one after another add up, so the n-th is
told by a length that moves from their median toward their mean); the copy is told of each end as it comes due, and makes the same
picks the real one would make then, with the scores of that moment. So the
prediction knows what the request competes with (slots, swaps, coexisting
models), what is ahead of it, and which aging crossovers happen meanwhile,
without a second model of the scheduler that could disagree with the first.
With `hardware:` described the copy carries the scheduler's memory book, so it
places every start it plays by memory as the live one would: a model that fits
beside busy ones waits only for its load, one that does not waits for the jobs
on the models placement stops for it.

Requests keep arriving while one waits, and those that outrank it go first. The
copy is not fed sample arrivals: a wait would then jump by a whole job whenever
a made-up arrival fell just before or after a dispatch, and the copy would play
every one of them. Instead each kind expected to outrank the request adds its
share of the GPU while the request waits: `ρ` = Σ pace × typical length over the
kinds that arrive at a higher priority (`Arrivals`, each at the pace it came at
lately), and a wait of `d` with what is queued now stretches to `d / (1 − ρ)`,
the work those arrivals bring meanwhile included (they too bring arrivals).
That is the expected delay in a priority queue with random arrivals, and it
costs one pass over the queue, not one per arrival.

A job or load of a model with no history has no predicted end: the requests
that wait on it have no predicted wait either, and say why.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import median

from .durations import DurationHistory, JobKind
from .effects import Grant, StartModel
from .mentions import named
from .simulation import Simulation

# Scheduler events the copy plays through at most, so a forecast of a very long queue stays cheap;
# requests beyond it are said to be too far ahead to predict.
MAX_EVENTS = 5000
# The pace of arrivals the forecast expects to go on: each kind's arrivals over the last ten minutes,
# once at least three came over ten seconds or more (a single burst is no pace).
ARRIVAL_WINDOW_S = 600.0
ARRIVAL_MIN_SPAN_S = 10.0
ARRIVAL_MIN_COUNT = 3


@dataclass(frozen=True)
class Blocker:
    """What a request is predicted to wait for last: the end of a job, of a load, or of a stop."""

    kind: str  # job | load | stop
    model: str
    ticket_id: int | None  # the job's request
    in_s: float  # from now
    band: str = ""  # the job's band
    expected: bool = False  # requests expected to arrive meanwhile, of `band` mostly


@dataclass(frozen=True)
class Arrivals:
    """Requests of one kind and priority expected to keep coming, one every `every_s` seconds on average."""

    kind: JobKind
    priority: int
    every_s: float


class RecentArrivals:
    """The new requests of the last `ARRIVAL_WINDOW_S`, and the pace each kind came at: what the
    forecast expects to keep coming."""

    def __init__(self, keep: int = 5000) -> None:
        self._seen: deque[tuple[float, JobKind, int]] = deque(maxlen=keep)

    def add(self, at: float, kind: JobKind, priority: int) -> None:
        self._seen.append((at, kind, priority))

    def expected(self, now: float) -> list[Arrivals]:
        """Each kind of request at the pace it arrived at lately, with its median priority."""
        while self._seen and self._seen[0][0] < now - ARRIVAL_WINDOW_S:
            self._seen.popleft()
        if not self._seen or now - self._seen[0][0] < ARRIVAL_MIN_SPAN_S:
            return []
        span = now - self._seen[0][0]
        priorities: dict[JobKind, list[int]] = {}
        for _, kind, priority in self._seen:
            priorities.setdefault(kind, []).append(priority)
        return [Arrivals(kind, int(median(seen)), span / len(seen))
                for kind, seen in priorities.items() if len(seen) >= ARRIVAL_MIN_COUNT]


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
    for ticket_id, since in underway.jobs.items():
        kind = kinds[ticket_id]
        run.expect("finished", ticket_id, kind.model, durations.job_left_s(kind, now - since))
    for model, since in underway.starts.items():
        run.expect("ready", model, model, durations.load_left_s(model, now - since))
    for model in underway.stops:
        run.expect("stopped", model, model, 0.0)
    played = run.play(max_events)
    outlooks = run.outlooks(waiting, queued, complete=played)
    shares = _arrival_shares(expected, durations)
    return {tid: _outranked(outlook, run.priorities.get(tid), shares) for tid, outlook in outlooks.items()}


def _arrival_shares(expected: Sequence[Arrivals], durations: DurationHistory) -> list[tuple[float, Arrivals]]:
    """The share of the GPU each kind expected to arrive will take: pace × typical length (kinds
    with no history yet are left out, as they are nowhere counted). The typical length is the
    median, as for the queued jobs: a wait is judged by its usual error, and the mean did no better
    on the benchmark's heavy-tailed lengths."""
    shares = []
    for stream in expected:
        job_s = durations.job_s(stream.kind)
        if job_s is not None and job_s > 0:
            shares.append((job_s / stream.every_s, stream))
    return shares


def _outranked(outlook: Outlook, priority: int | None, shares: list[tuple[float, Arrivals]]) -> Outlook:
    """A queued request's wait stretched by the work of the arrivals that will go before it: those of
    a higher priority (see the module's docstring; the few points aging and swap affinity add are
    left out). One already dispatched to its model's start (no position) is past being overtaken."""
    if outlook.eta_s is None or outlook.position is None or priority is None:
        return outlook
    ahead = [(share, stream) for share, stream in shares if stream.priority > priority]
    if not ahead or outlook.eta_s <= 0:
        return outlook
    load = sum(share for share, _ in ahead)
    if load >= 1:
        return replace(outlook, eta_s=None, load_s=None, after=None,
                       unknown="requests that outrank it are expected to keep coming faster than they can be served")
    eta_s = outlook.eta_s / (1 - load)
    _, most = max(ahead, key=lambda pair: pair[0])
    return replace(outlook, eta_s=eta_s, after=Blocker("job", most.kind.model, None, eta_s, most.kind.band, True))


class _Run:
    """The copy played forward, watching when each target is dispatched and what it waited for last;
    every duration is the typical one, and one with no history makes `unknown` say so."""

    def __init__(self, scheduler, kinds: Mapping[int, JobKind], targets: set[int], durations: DurationHistory,
                 now: float):
        self.sim = Simulation(scheduler, self)
        self.kinds = kinds
        self.targets = targets
        self.durations = durations
        self.now = now
        self.dispatched: dict[int, tuple[float, float | None, Blocker | None]] = {}
        self.priorities: dict[int, int] = {}  # of the targets, as dispatched
        self.launched: dict[str, tuple[float, Blocker | None]] = {}
        self.unknown: set[tuple[str, str]] = set()  # what has no typical duration yet: (a load of, model)
        self.granted = 0  # jobs the copy has played

    # -- Timing: the typical durations ---------------------------------------------------------------
    def job_s(self, grant: Grant, now: float) -> float | None:
        kind = self.kinds.get(grant.ticket_id)
        if kind is None:
            return None
        self.granted += 1  # the jobs played so far add up before every later dispatch (see `job_s`'s `among`)
        return self._known(self.durations.job_s(kind, self.granted), "a request to", grant.model)

    def load_s(self, model: str) -> float | None:
        return self._known(self.durations.load_s(model), "a load of", model)

    def _known(self, seconds: float | None, what: str, model: str) -> float | None:
        if seconds is None:
            self.unknown.add((what, model))
        return seconds

    def expect(self, event: str, subject: object, model: str, after: float | None) -> None:
        """What is under way now: `event` comes due `after` seconds from now (never: not known)."""
        if self._known(after, "a load of" if event == "ready" else "a request to", model) is not None:
            self.sim.at(self.now + after, event, subject)

    def play(self, max_events: int) -> bool:
        """Play events until every target is dispatched; returns whether the forecast got that far
        (False: it ran out of known events, or of its budget)."""
        for _ in range(max_events):
            if self.targets <= self.dispatched.keys():
                return True
            if self.sim.next_at() is None:
                return False  # nothing under way ends: nothing frees what they wait for
            at, event, subject = self.sim.pop()
            if event == "finished":
                cause = Blocker("job", self.kinds[subject].model, subject, at - self.now, self.kinds[subject].band)
            elif event == "ready":
                cause = Blocker("load", subject, None, at - self.now)
            else:
                cause = Blocker("stop", subject, None, at - self.now)
            self.watch(self.sim.tell(event, subject, at), at, cause)
        return self.targets <= self.dispatched.keys()

    def watch(self, effects: list, at: float, cause: Blocker | None) -> None:
        for effect in effects:
            if isinstance(effect, Grant) and effect.ticket_id in self.targets:
                launch = self.launched.get(effect.model) if effect.decision.needs_swap else None
                load = None if launch is None else at - launch[0]
                self.dispatched[effect.ticket_id] = (at, load, cause if launch is None else launch[1])
                self.priorities[effect.ticket_id] = effect.decision.priority
            elif isinstance(effect, StartModel):
                self.launched[effect.model] = (at, cause)

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
                result[tid] = Outlook(tid, position, None, unknown=self._why_unknown(tid, complete))
        return result

    def _why_unknown(self, ticket_id: int, complete: bool) -> str:
        if self.unknown:
            never = " or ".join(f"{what} {named(model)}" for what, model in sorted(self.unknown))
            return f"no history yet: {never} has never finished, so its length is unknown"
        if not complete and self.sim.next_at() is not None:
            return "too far back in the queue to predict"
        # What the copy, with nothing left under way, last held it back for: a pin or a lease in its way, say.
        because = self.sim.scheduler.held_back_because(ticket_id)
        return because or "nothing under way is predicted to make room for it"
