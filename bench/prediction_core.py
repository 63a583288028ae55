"""Wait prediction judged on the scheduling core alone: many seeds and workload shapes in seconds.

    .venv/bin/python bench/prediction_core.py [--seconds 600] [--knowing running|all]

The service's forecast is `scheduling.core.forecast` fed by `DurationHistory` and `RecentArrivals`;
here the same three are driven the way the runtime drives them, on a simulated clock, by the
workloads of `bench/prediction.py` (two models in one swap group, three bands; each shape's arrivals
and job lengths). Each request's forecast is taken as it arrives, and held against when the played
scheduler sent it to its model. What this leaves out is what the real service adds (polling, the
event loop, the dispatch gap, a process's start beside its load delay); `bench/prediction.py`
measures that on the real service. The seeds the forecast was tuned on and those never looked at
while tuning are reported apart. `--knowing` tells the forecast the true length of the jobs running
(or of every job, running and queued) instead of their typical one: what is left of the error then is
what the forecast cannot know, and the difference is what the jobs' unknown lengths cost.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import prediction  # noqa: E402
from scheduling.core import (Grant, ModelSpec, SerialSettings, StartModel, StopModel, SwapGroup,  # noqa: E402
                             SwapPolicy, Ticket, build_scheduler)
from scheduling.core.durations import DurationHistory, JobKind  # noqa: E402
from scheduling.core.forecast import RecentArrivals, Underway, forecast  # noqa: E402
from scheduling.core.priority import PRIORITY_ALIASES  # noqa: E402

SPAWN_S = 0.15  # a fake model's process start beside its load delay, as measured on the real service
KNOWING = ("nothing", "running", "all")  # whose true job length the forecast is told


def kind_of(job: prediction.Job) -> JobKind:
    return JobKind(job.model, "chat", prediction.BANDS[job.band][2], job.band)


class _Told:
    """The job history, except that each kind in `exact` (one ticket's own) is told its true length."""

    def __init__(self, history: DurationHistory, exact: dict[JobKind, float]) -> None:
        self.history, self.exact = history, exact

    def job_s(self, kind: JobKind, among: int = 1) -> float | None:
        return self.exact[kind] if kind in self.exact else self.history.job_s(kind, among)

    def job_left_s(self, kind: JobKind, elapsed: float) -> float | None:
        return self.exact[kind] - elapsed if kind in self.exact else self.history.job_left_s(kind, elapsed)

    def load_s(self, model: str) -> float | None:
        return self.history.load_s(model)

    def load_left_s(self, model: str, elapsed: float) -> float | None:
        return self.history.load_left_s(model, elapsed)


@dataclass
class _Played:
    """The scheduler driven by true job lengths, forecasting each request as it arrives."""

    jobs: list[prediction.Job]
    knowing: str = "nothing"  # see KNOWING

    def __post_init__(self) -> None:
        models = tuple(prediction.LOAD_DELAY_S)
        self.scheduler = build_scheduler("serial", {m: ModelSpec(m) for m in models},
                                         SwapPolicy([SwapGroup("gpu", models)], models), SerialSettings())
        self.durations = DurationHistory()
        self.arrivals = RecentArrivals()
        self.events: list = []
        self.order = itertools.count()
        self.kinds: dict[int, JobKind] = {}
        self.length: dict[int, float] = {}
        self.running: dict[int, float] = {}  # ticket -> granted at
        self.starting: dict[str, float] = {}
        self.waiting: set[int] = set()
        self.dispatched: dict[int, float] = {}
        self.predicted: dict[int, float | None] = {}

    def at(self, when: float, event: str, subject) -> None:
        heapq.heappush(self.events, (when, next(self.order), event, subject))

    def apply(self, effects, now: float) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                self.waiting.discard(effect.ticket_id)
                self.dispatched[effect.ticket_id] = now
                self.running[effect.ticket_id] = now
                self.at(now + self.length[effect.ticket_id], "finished", effect.ticket_id)
            elif isinstance(effect, StartModel):
                self.starting[effect.model] = now
                self.at(now + prediction.LOAD_DELAY_S[effect.model] + SPAWN_S, "ready", effect.model)
            elif isinstance(effect, StopModel):
                self.at(now, "stopped", effect.model)

    def arrive(self, ticket_id: int, job: prediction.Job, now: float, judged: bool) -> None:
        kind = kind_of(job)
        priority = PRIORITY_ALIASES[job.band]
        self.kinds[ticket_id], self.length[ticket_id] = kind, job.seconds
        self.arrivals.add(now, kind, priority)
        self.waiting.add(ticket_id)
        self.apply(self.scheduler.submit(Ticket(ticket_id, job.model, priority, now), now), now)
        if judged and ticket_id in self.waiting:
            # Only this request's outlook is asked for: it is the same as in a forecast of the whole queue
            # (the others only make the copy play on until they go too), at a fraction of the cost.
            underway = Underway(jobs=dict(self.running), starts=dict(self.starting))
            kinds, durations = self.told()
            outlook = forecast(self.scheduler, underway, kinds, [ticket_id], durations, now,
                               self.arrivals.expected(now))[ticket_id]
            self.predicted[ticket_id] = outlook.eta_s

    def told(self) -> tuple[dict[int, JobKind], DurationHistory | _Told]:
        """The kinds and durations the forecast is given: with `knowing`, each known job gets a kind of its
        own, told its true length."""
        if self.knowing == "nothing":
            return self.kinds, self.durations
        kinds, exact = dict(self.kinds), {}
        for ticket_id in self.running if self.knowing == "running" else self.kinds:
            own = replace(self.kinds[ticket_id], route=f"chat #{ticket_id}")
            kinds[ticket_id], exact[own] = own, self.length[ticket_id]
        return kinds, _Told(self.durations, exact)

    def step(self) -> None:
        now, _, event, subject = heapq.heappop(self.events)
        if event == "arrive":
            ticket_id, job, judged = subject
            self.arrive(ticket_id, job, now, judged)
        elif event == "finished":
            self.durations.add_job(self.kinds[subject], now - self.running.pop(subject))
            self.apply(self.scheduler.finished(subject, now), now)
        elif event == "ready":
            self.durations.add_load(subject, now - self.starting.pop(subject))
            self.apply(self.scheduler.model_ready(subject, now), now)
        else:
            self.apply(self.scheduler.model_stopped(subject, now), now)

    def play(self, seed: int) -> list[prediction.Sample]:
        ids = itertools.count(1)
        warm = prediction.warm_up()
        for job in warm:
            self.at(job.at_s, "arrive", (next(ids), job, False))
        start = 1.0  # after the warm-up's arrivals; as on the service, its jobs still run
        judged = {}
        for job in self.jobs:
            ticket_id = next(ids)
            judged[ticket_id] = job
            self.at(start + job.at_s, "arrive", (ticket_id, job, True))
        while self.events:
            self.step()
        samples = []
        for ticket_id, job in judged.items():
            waited = self.dispatched[ticket_id] - (start + job.at_s)
            seen = ticket_id in self.predicted
            samples.append(prediction.Sample(job.band, job.model, seen, self.predicted.get(ticket_id),
                                             0.0 if seen else None, waited, False, seed))
        return samples


def played(shape: str, seed: int, seconds: float, knowing: str = "nothing") -> list[prediction.Sample]:
    return _Played(prediction.workload(seconds, seed, shape), knowing).play(seed)


COST_WAITING = (100, 1000)  # queue lengths the forecast's cost is measured at
COST_CALLS = 5


def forecast_cost_ms(waiting: int, seed: int = 11) -> float:
    """Milliseconds one forecast of the whole queue takes (what `/api/queue` pays at most once a second), with
    `waiting` requests of the workload's mix queued while the first one's model starts and the workload's
    arrival pace expected: the median of `COST_CALLS` calls."""
    played = _Played([])
    for job in prediction.warm_up():  # one finished job and load of each kind: every kind has a typical length
        played.durations.add_job(kind_of(job), job.seconds)
        played.durations.add_load(job.model, prediction.LOAD_DELAY_S[job.model])
    now = 0.0
    for ticket_id, job in enumerate(prediction.workload(waiting / prediction.ARRIVALS_PER_S * 2, seed), 1):
        if ticket_id > waiting:
            break
        now = job.at_s
        played.arrive(ticket_id, job, now, judged=False)
    ranked = [t.id for t, _ in played.scheduler.ranked(now)]
    starting = [tid for tid in played.waiting if tid not in ranked]
    underway = Underway(jobs=dict(played.running), starts=dict(played.starting))
    expected = played.arrivals.expected(now)
    took = []
    for _ in range(COST_CALLS):
        began = time.perf_counter()
        forecast(played.scheduler, underway, played.kinds, [*starting, *ranked], played.durations, now, expected)
        took.append((time.perf_counter() - began) * 1000)
    return statistics.median(took)


@dataclass(frozen=True)
class Judged:
    shape: str
    seeds: str  # tuned | unseen
    samples: list[prediction.Sample]

    def median(self, band: str | None = None) -> float | None:
        used = [s.relative for s in self.samples if s.counted and (band is None or s.band == band)]
        return statistics.median(used) if used else None

    def p90(self, band: str | None = None) -> float | None:
        used = [s.relative for s in self.samples if s.counted and (band is None or s.band == band)]
        return prediction.p90(used) if used else None


def judge_all(seconds: float, knowing: str = "nothing") -> list[Judged]:
    """Every shape on the tuned and the unseen seeds, one seed a process at a time on each CPU."""
    groups = [(shape, name, seeds) for shape in prediction.SHAPES
              for name, seeds in (("tuned", prediction.TUNED_SEEDS), ("unseen", prediction.JUDGED_SEEDS))]
    runs = [(shape, seed, seconds, knowing) for shape, _, seeds in groups for seed in seeds]
    with multiprocessing.Pool(os.cpu_count()) as pool:
        samples = dict(zip(runs, pool.starmap(played, runs)))
    return [Judged(shape, name, [s for seed in seeds for s in samples[shape, seed, seconds, knowing]])
            for shape, name, seeds in groups]


HEADER = ("| workload | seeds | requests (counted) | interactive median / p90 | normal | batch | **all** |\n"
          "|---|---|--:|--:|--:|--:|--:|")


def _pair(result: Judged, band: str | None) -> str:
    median, p90 = result.median(band), result.p90(band)
    return "—" if median is None else f"{median:.0%} / {p90:.0%}"


def rows(results: list[Judged]) -> list[str]:
    lines = []
    for r in results:
        seeds = prediction.TUNED_SEEDS if r.seeds == "tuned" else prediction.JUDGED_SEEDS
        counted = sum(1 for s in r.samples if s.counted)
        lines.append(f"| {r.shape} | {r.seeds} ({', '.join(map(str, seeds))}) | {len(r.samples)} ({counted}) | "
                     + " | ".join(_pair(r, band) for band in [*prediction.BANDS, None]) + " |")
    return lines


def method(seconds: float) -> str:
    return (f"The scheduling core with the service's forecast, job and load history and arrival pace, on a "
            f"simulated clock; {seconds:g} s of arrivals a seed, 5 seeds a row; each request's forecast taken as "
            f"it arrives (requests that waited under {prediction.FLOOR_S:g} s are not counted). Cells: median / "
            f"p90 of \\|predicted − actual\\| ÷ actual. Shapes: steady (Poisson, log-normal lengths σ "
            f"{prediction.SPREAD_SIGMA:g}), heavy-tailed (Pareto lengths, α {prediction.PARETO_ALPHA:g}), bursty "
            f"(on/off spells of {prediction.ON_S:g} s and {prediction.OFF_S:g} s on average, at "
            f"{prediction.ON_PACE:g}× and {prediction.OFF_PACE:g}× the mean pace of "
            f"{prediction.ARRIVALS_PER_S:g}/s), and both.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="arrivals a seed")
    parser.add_argument("--knowing", choices=KNOWING, default="nothing",
                        help="tell the forecast the true length of the running jobs, or of every job")
    args = parser.parse_args(argv)
    told = "" if args.knowing == "nothing" else f" --knowing {args.knowing}"
    print(f"command: .venv/bin/python bench/prediction_core.py --seconds {args.seconds:g}{told}\n")
    print(method(args.seconds) + "\n")
    print(HEADER)
    print("\n".join(rows(judge_all(args.seconds, args.knowing))))
    print("\none forecast of the whole queue: " + ", ".join(
        f"{waiting:,} waiting {forecast_cost_ms(waiting):,.0f} ms" for waiting in COST_WAITING))
    return 0


if __name__ == "__main__":
    sys.exit(main())
