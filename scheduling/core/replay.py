"""What other settings would have done: recorded arrivals played again through a fresh scheduler.

The recorded requests arrive at their recorded times and are driven through the
same core the service runs, on a simulated clock, the way the runtime drives it:
a grant's job ends after its recorded service time, a started model is ready
after a recorded load time, a stop is immediate (a recorded load already counts
the stops it needed first). Only the scheduler's settings differ between two
runs, so the difference between them is what the settings did.

Load times are drawn per start, in order: the n-th start of a model in the
replay takes as long as its n-th recorded start (cycling when the replay starts
it more often). With the settings in force the replay then makes the same starts
in the same order and reproduces the recording; a median would blur each start.

With `hardware:` described (`Setup.hardware`), the replayed scheduler places models by memory as the
service does: several at once where they fit, the cheapest idle ones stopped where they do not. A what-if
may so try other hardware, other memory figures, or other groups. `loading_gpu_s` sums what the starts
cost: each start's load time on each GPU it took (a start with no hardware described counts one GPU,
one on the CPU none).

What the recording cannot tell is handled in the open and counted, never
dropped silently: a client that left leaves again at the same moment (while
waiting, or cutting its job short), and so does a request an operator cancelled,
counted apart; a request whose job never ran to its end
runs for the median of its kind (see `durations`), or as long as it had run
when its client cut it, if that is longer; a model never loaded in the
window loads in the median of all loads; requests refused for a failed start or
another reason the replay cannot reproduce, and those of models no longer
configured, are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from .durations import DurationHistory, JobKind
from .effects import Grant, Refuse, StartModel, StopModel
from .placement import Hardware
from .priority import Band, band_of
from .scheduler import build_scheduler
from .settings import SerialSettings
from .simulation import CORE_EVENTS, Simulation
from .ticket import ModelSpec, Ticket

CHANGED_MOST = 10  # requests listed by how much their wait changed


@dataclass(frozen=True)
class Recorded:
    """One recorded request. Times are seconds on one clock (e.g. from the window's start)."""

    id: int
    model: str
    priority: int
    arrival_s: float
    route: str = "other"
    stream: bool = False
    service_s: float | None = None  # time on its model, when its job ran to its end (completed or failed)
    left_after_s: float | None = None  # its client left this long after arriving: waiting, or cutting its job
    by_operator: bool = False  # left_after_s is when an operator, not its client, cancelled it
    ran_s: float | None = None  # a job its client cut short: how long it had run (it would have run longer)
    max_wait_s: float | None = None  # refused if not sent to its model within this
    load_s: float | None = None  # the start of its model its dispatch needed took this long
    dispatched_s: float | None = None  # when it was recorded sent to its model
    refused: str = ""  # why the recording refused it in a way a replay cannot reproduce ("failed start", ...)
    key: str | None = None  # the API key row it came with, and that key's weight (fair share's turns)
    weight: int = 1

    @property
    def kind(self) -> JobKind:
        return JobKind(self.model, self.route, self.stream, band_of(self.priority).value)


@dataclass(frozen=True)
class Setup:
    """What a replay runs with besides the settings: the config's scheduler, models, swap router and hardware."""

    scheduler: str
    models: Mapping[str, ModelSpec]
    policy: object  # SwapPolicy or MatrixPolicy
    hardware: Hardware | None = None  # `hardware:`: the scheduler places models by memory


@dataclass(frozen=True)
class Replayed:
    """One request in a replay. `outcome`: served, left (its client left before it was sent), cancelled (an
    operator cancelled it before it was sent), timed_out (its maximum wait ran out) or refused (by the
    replayed scheduler)."""

    id: int
    model: str
    band: str
    arrival_s: float
    outcome: str
    dispatched_s: float | None = None  # sent to its model: granted, after any load
    order: int | None = None  # 1 = sent first
    needed_swap: bool = False

    @property
    def wait_s(self) -> float | None:
        return None if self.dispatched_s is None else self.dispatched_s - self.arrival_s


@dataclass(frozen=True)
class Handling:
    """What the replay did with what the recording could not tell, by count."""

    left: int = 0  # clients that left before being sent
    cancelled: int = 0  # cancelled by an operator before being sent (at the recorded moment)
    timed_out: int = 0  # maximum waits that ran out
    refused: int = 0  # refused by the replayed scheduler
    service_assumed: int = 0  # jobs whose length was not recorded: the median of their kind (see `replay`)
    loads_assumed: int = 0  # starts of a model with no recorded load: the median of all loads
    failed_starts: int = 0  # left out: refused because their model failed to start
    refused_recorded: int = 0  # left out: refused for another reason the replay cannot reproduce
    unconfigured: int = 0  # left out: their model is no longer configured


@dataclass(frozen=True)
class ReplayResult:
    settings: SerialSettings
    requests: Mapping[int, Replayed]
    swaps: int  # model starts
    busy_share: float  # of the time from the first arrival to the last job's end, with a job or load running
    reorders_aging: int  # picks aging changed (Decision.changed_by_aging)
    reorders_affinity: int  # picks swap affinity changed
    reorders_fairness: int  # requests fair share sent before an older equal one
    handling: Handling = field(default_factory=Handling)
    loading_gpu_s: float = 0.0  # GPU-seconds spent starting models (see the module's docstring)
    evicted_for_memory: int = 0  # models stopped to make room for another's memory


def replay(
    records: Sequence[Recorded], setup: Setup, settings: SerialSettings, warm: Sequence[str] = ()
) -> ReplayResult:
    """Play `records` (in arrival order) through a fresh scheduler with `settings`. `warm`: the models
    up when the recording began, in the order they were started."""
    return _Replay(records, setup, settings).run(warm)


class _Replay:
    def __init__(self, records: Sequence[Recorded], setup: Setup, settings: SerialSettings) -> None:
        self.settings = settings
        self.scheduler = build_scheduler(setup.scheduler, setup.models, setup.policy, settings, setup.hardware)
        self.models = setup.models
        # Deadlines the scheduler must be ticked at: a TTL's end, or a minResidency's (a start it held back may go)
        self.deadlines = any(spec.ttl > 0 or spec.min_residency > 0 for spec in setup.models.values())
        self.records = {}
        skipped = {"failed_starts": 0, "refused_recorded": 0, "unconfigured": 0}
        for record in records:
            if record.model not in setup.models:
                skipped["unconfigured"] += 1
            elif record.refused:
                skipped["failed_starts" if record.refused == "failed start" else "refused_recorded"] += 1
            else:
                self.records[record.id] = record
        self.counts = {**skipped, "left": 0, "cancelled": 0, "timed_out": 0, "refused": 0, "service_assumed": 0,
                       "loads_assumed": 0}
        self.loads = _load_draws(records)
        self.all_loads = median([s for draws in self.loads.values() for s in draws] or [0.0])
        self.started: dict[str, int] = {}
        self.durations = _typical_jobs(records)
        self.sim = Simulation(self.scheduler, self)
        self.results: dict[int, Replayed] = {}
        self.granted = 0
        self.swaps = self.aging = self.affinity = self.fairness = self.for_memory = 0
        self.drawn: dict[str, float] = {}  # each model's load time as last drawn
        self.loading_gpu_s = 0.0
        self.active = 0  # jobs and loads running
        self.busy_since = self.busy = self.idle_since = 0.0
        self.ticks: set[float] = set()

    def run(self, warm: Sequence[str]) -> ReplayResult:
        arrivals = sorted(self.records.values(), key=lambda r: (r.arrival_s, r.id))
        first = arrivals[0].arrival_s if arrivals else 0.0
        self._warm(warm, first)
        index = 0
        while index < len(arrivals) or self.sim.next_at() is not None:
            # What ends at an instant goes before what arrives at it.
            due = self.sim.next_at()
            if due is not None and (index == len(arrivals) or due <= arrivals[index].arrival_s):
                now, event, subject = self.sim.pop()
                self._event(event, subject, now)
            else:
                record = arrivals[index]
                index += 1
                now = record.arrival_s
                self._arrive(record, now)
            if self.deadlines:
                self._arm_tick()
        span = self.idle_since - first  # to the last job's end
        return ReplayResult(
            settings=self.settings,
            requests=self.results,
            swaps=self.swaps,
            busy_share=self.busy / span if span > 0 else 0.0,
            reorders_aging=self.aging,
            reorders_affinity=self.affinity,
            reorders_fairness=self.fairness,
            handling=Handling(**self.counts),
            loading_gpu_s=self.loading_gpu_s,
            evicted_for_memory=self.for_memory,
        )

    def _warm(self, models: Sequence[str], at: float) -> None:
        """Bring up the models that were up when the recording began, through the scheduler itself (a
        request each), one after another until `at`, each in its median recorded load, so the scheduler
        knows them loaded and, placing by memory, what each costs to stop; none of it counts."""
        models = [m for m in dict.fromkeys(models) if m in self.models]
        loads = [median(self.loads[m]) if self.loads.get(m) else self.all_loads for m in models]
        began = at - sum(loads)
        for n, (model, load) in enumerate(zip(models, loads, strict=True)):
            ticket_id, ready = -1 - n, began + load
            effects = self.scheduler.submit(Ticket(ticket_id, model, 0, began), began)
            while effects:
                effect = effects.pop(0)
                if isinstance(effect, StartModel):
                    effects += self.scheduler.model_ready(effect.model, ready)
                elif isinstance(effect, StopModel):
                    effects += self.scheduler.model_stopped(effect.model, ready)
                elif isinstance(effect, Grant) and effect.ticket_id == ticket_id:
                    effects += self.scheduler.finished(ticket_id, ready)
            began = ready

    def _arrive(self, record: Recorded, now: float) -> None:
        left = "cancelled" if record.by_operator else "left"
        for after, event in ((record.left_after_s, left), (record.max_wait_s, "timed_out")):
            if after is not None:
                self.sim.at(now + after, event, record.id)
        ticket = Ticket(record.id, record.model, record.priority, now, key=record.key, weight=record.weight)
        self._apply(self.scheduler.submit(ticket, now), now)

    def _event(self, event: str, subject, now: float) -> None:
        if event in CORE_EVENTS:
            if event in ("finished", "ready"):
                self._busy(-1, now)
            elif event == "tick":
                self.ticks.discard(now)
            self._watch(self.sim.tell(event, subject, now), now)
            return
        # left, cancelled or timed_out: only a request not yet sent goes; a running job's cut is its end
        if subject in self.results:
            return
        record = self.records[subject]
        self.results[subject] = Replayed(record.id, record.model, record.kind.band, record.arrival_s, event)
        self.counts[event] += 1
        self._apply(self.scheduler.cancel(subject, now), now)

    def _apply(self, effects: list, now: float) -> None:
        self.sim.carry_out(effects, now)
        self._watch(effects, now)

    def _watch(self, effects: Iterable, now: float) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                self._granted(effect, now)
            elif isinstance(effect, StartModel):
                self._busy(+1, now)
                self.swaps += 1
                self.for_memory += len(effect.for_memory)
                self.loading_gpu_s += self.drawn[effect.model] * (1 if effect.gpus is None else len(effect.gpus))
            elif isinstance(effect, Refuse) and effect.ticket_id not in self.results:
                record = self.records[effect.ticket_id]
                band = record.kind.band
                self.results[record.id] = Replayed(record.id, record.model, band, record.arrival_s, "refused")
                self.counts["refused"] += 1

    def _granted(self, grant: Grant, now: float) -> None:
        record = self.records[grant.ticket_id]
        decision = grant.decision
        self.granted += 1
        self.aging += decision.changed_by_aging
        self.affinity += decision.changed_by_affinity
        self.fairness += decision.changed_by_fairness
        self.results[record.id] = Replayed(
            record.id, record.model, str(decision.band), record.arrival_s, "served", now, self.granted,
            decision.needs_swap,
        )
        self._busy(+1, now)

    # -- Timing: what the recording says, or the median of the kind --------------------------------------
    def job_s(self, grant: Grant, now: float) -> float:
        record = self.records[grant.ticket_id]
        if record.service_s is not None:
            end = now + record.service_s
        else:
            end = now + max(self.durations.job_s(record.kind), record.ran_s or 0.0)
            self.counts["service_assumed"] += 1
        if record.left_after_s is not None:
            end = min(end, record.arrival_s + record.left_after_s)
        return max(now, end) - now

    def load_s(self, model: str) -> float:
        draws = self.loads.get(model)
        if not draws:
            self.counts["loads_assumed"] += 1
            self.drawn[model] = self.all_loads
        else:
            n = self.started.get(model, 0)
            self.started[model] = n + 1
            self.drawn[model] = draws[n % len(draws)]
        return self.drawn[model]

    def _busy(self, change: int, now: float) -> None:
        if self.active == 0 and change > 0:
            self.busy_since = now
        self.active += change
        if self.active == 0:
            self.busy += now - self.busy_since
            self.idle_since = now

    def _arm_tick(self) -> None:
        deadline = self.scheduler.next_deadline()
        if deadline is not None and deadline not in self.ticks:
            self.ticks.add(deadline)
            self.sim.at(deadline, "tick", None)


def _load_draws(records: Iterable[Recorded]) -> dict[str, list[float]]:
    """Each model's recorded load times, in the order its starts happened."""
    starts = sorted((r for r in records if r.load_s is not None and r.dispatched_s is not None),
                    key=lambda r: (r.dispatched_s, r.id))
    draws: dict[str, list[float]] = {}
    for record in starts:
        draws.setdefault(record.model, []).append(record.load_s)
    return draws


class _Typical:
    """The median job length of a kind over the whole recording, with `DurationHistory`'s fallbacks
    to closer kinds of the model, then to every job (0 s with none); worked out once per kind."""

    def __init__(self, history: DurationHistory, every: list[float]) -> None:
        self._history = history
        self._every = median(every) if every else 0.0
        self._known: dict[JobKind, float] = {}

    def job_s(self, kind: JobKind) -> float:
        if kind not in self._known:
            typical = self._history.job_s(kind)
            self._known[kind] = self._every if typical is None else typical
        return self._known[kind]


def _typical_jobs(records: Sequence[Recorded]) -> _Typical:
    known = [r for r in records if r.service_s is not None]
    history = DurationHistory(window=max(1, len(known)))
    for record in known:
        history.add_job(record.kind, record.service_s)
    return _Typical(history, [r.service_s for r in known])


# -- reading the results ------------------------------------------------------------------------


@dataclass(frozen=True)
class Waits:
    """Waits (dispatch − arrival) of the requests of one band that were sent to their model."""

    count: int
    p50: float | None
    p95: float | None
    max: float | None
    p99: float | None = None


def waits(values: Iterable[float]) -> Waits:
    ordered = sorted(values)
    if not ordered:
        return Waits(0, None, None, None)
    return Waits(len(ordered), _rank(ordered, 0.5), _rank(ordered, 0.95), ordered[-1], _rank(ordered, 0.99))


def _rank(ordered: list[float], share: float) -> float:
    """The nearest-rank percentile: a wait some request actually had."""
    return ordered[max(0, math.ceil(len(ordered) * share) - 1)]


def waits_by_band(result: ReplayResult) -> dict[str, Waits]:
    by_band: dict[str, list[float]] = {band.value: [] for band in Band}
    for request in result.requests.values():
        if request.wait_s is not None:
            by_band[request.band].append(request.wait_s)
    return {band: waits(values) for band, values in by_band.items()}


def waits_by_key(result: ReplayResult, records: Iterable[Recorded]) -> dict[str, Waits]:
    """Waits of the requests sent to their model, by the API key row they came with ("" for none)."""
    key_of = {record.id: record.key or "" for record in records}
    by_key: dict[str, list[float]] = {}
    for request in result.requests.values():
        if request.wait_s is not None:
            by_key.setdefault(key_of.get(request.id, ""), []).append(request.wait_s)
    return {key: waits(values) for key, values in sorted(by_key.items())}


@dataclass(frozen=True)
class Change:
    id: int
    model: str
    band: str
    before_s: float
    after_s: float


@dataclass(frozen=True)
class Comparison:
    bands: Mapping[str, tuple[Waits, Waits]]  # band -> (before, after)
    changed_most: tuple[Change, ...]  # served in both runs, largest |after − before| first


def compare(before: ReplayResult, after: ReplayResult, changed_most: int = CHANGED_MOST) -> Comparison:
    ahead, behind = waits_by_band(before), waits_by_band(after)
    changes = [
        Change(r.id, r.model, r.band, r.wait_s, other.wait_s)
        for r in before.requests.values()
        if r.wait_s is not None and (other := after.requests.get(r.id)) is not None and other.wait_s is not None
    ]
    changes.sort(key=lambda c: (-abs(c.after_s - c.before_s), c.id))
    return Comparison(
        bands={band: (ahead[band], behind[band]) for band in ahead},
        changed_most=tuple(c for c in changes[:changed_most] if c.after_s != c.before_s),
    )


@dataclass(frozen=True)
class Fidelity:
    """How closely a replay with the settings in force reproduces the recording.

    `same_order`: of the pairs of requests that waited at the same time in the recording (each arrived
    before the other was sent) and were sent in both, the share sent in the same order; None without
    such pairs (two sent at the same recorded instant have no order). `wait_error_s`: the median
    |replayed − recorded| wait, over the requests sent in both.
    """

    compared: int  # requests sent to their model in both
    pairs: int
    same_order: float | None
    wait_error_s: float | None


def fidelity(records: Iterable[Recorded], result: ReplayResult) -> Fidelity:
    both = sorted(
        ((r, result.requests[r.id]) for r in records
         if r.dispatched_s is not None and r.id in result.requests and result.requests[r.id].order is not None),
        key=lambda pair: (pair[0].arrival_s, pair[0].id),
    )
    pairs = agree = 0
    for i, (record, replayed) in enumerate(both):
        for j in range(i + 1, len(both)):
            other, other_replayed = both[j]
            if other.arrival_s >= record.dispatched_s:
                break
            if other.dispatched_s != record.dispatched_s:
                pairs += 1
                agree += (other.dispatched_s > record.dispatched_s) == (other_replayed.order > replayed.order)
    errors = [abs((replayed.dispatched_s - replayed.arrival_s) - (record.dispatched_s - record.arrival_s))
              for record, replayed in both]
    return Fidelity(len(both), pairs, agree / pairs if pairs else None, median(errors) if errors else None)
