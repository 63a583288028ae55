"""How long a model's jobs and loads usually take, learned from the ones that ended.

The typical duration is the median of the most recent ones, so one 12-hour outlier
moves it by one place, not by hours. A job's duration depends on what was asked
(the route, and whether it streams) and on who asks: a batch job is a long render,
an interactive one a short chat, on the same route. A kind never seen yet borrows
from the model's jobs of the same route and streaming in other bands, then from
its jobs on the same route, then from all of its jobs. A model with no finished
job at all has no typical duration: the forecast says so instead of inventing one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import fmean, median

WINDOW = 50  # recent durations kept per kind: enough for a stable median, few enough to follow a change
# A job or load already past every recent one of its kind is expected to overrun by as much again as it
# has overrun so far (at least this share of its typical time): the longer it runs, the longer it may.
OVERDUE_SHARE = 0.1


@dataclass(frozen=True)
class JobKind:
    """What a request's run time depends on, besides its prompt: the model, the route, streaming, and
    the band of its priority (see `priority.Band`)."""

    model: str
    route: str
    stream: bool
    band: str


class DurationHistory:
    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._jobs: dict[JobKind, deque[float]] = {}
        self._loads: dict[str, deque[float]] = {}

    def add_job(self, kind: JobKind, seconds: float) -> None:
        """A job that completed on its model (failed and cancelled ones say nothing of its length)."""
        self._jobs.setdefault(kind, deque(maxlen=self._window)).append(max(0.0, seconds))

    def add_load(self, model: str, seconds: float) -> None:
        """A start of `model` that ended ready, including the stops it needed first."""
        self._loads.setdefault(model, deque(maxlen=self._window)).append(max(0.0, seconds))

    def job_s(self, kind: JobKind, among: int = 1) -> float | None:
        """The typical run time of a job of `kind`, or None when the model has finished none. `among`:
        the job is the among-th of a run of jobs whose lengths add up (a forecast's queue): one job alone
        is told by the median, but a sum of many comes near as many times their mean, well above the
        median when lengths have a heavy tail, so the n-th is told by median + (mean − median)(1 − 1/n)."""
        samples = self._job_samples(kind)
        if not samples:
            return None
        typical = median(samples)
        return typical + (fmean(samples) - typical) * (1 - 1 / among) if among > 1 else typical

    def run_s(self, kind: JobKind, jobs: int, parallel: int) -> float | None:
        """How long `jobs` jobs of `kind` take, `parallel` at a time (a batch's lines left, at most its
        model's slots at once): that many rounds of the typical job, the later ones told as `job_s` tells
        the n-th of a run. None when the model has finished no job yet."""
        rounds = -(-jobs // max(1, parallel))
        typical = self.job_s(kind, among=rounds)
        return None if typical is None else rounds * typical

    def job_left_s(self, kind: JobKind, elapsed: float) -> float | None:
        """How much longer a job of `kind` that has run `elapsed` seconds is expected to run."""
        return _left(self._job_samples(kind), elapsed)

    def load_s(self, model: str) -> float | None:
        """The typical time from deciding to start `model` to its being ready, or None if never seen."""
        loads = self._loads.get(model)
        return median(loads) if loads else None

    def load_left_s(self, model: str, elapsed: float) -> float | None:
        """How much longer a start of `model` begun `elapsed` seconds ago is expected to take."""
        return _left(list(self._loads.get(model, ())), elapsed)

    def _job_samples(self, kind: JobKind) -> list[float]:
        """The recent durations of `kind`, or of the closest kinds of its model when it has none."""
        exact = self._jobs.get(kind)
        if exact:
            return list(exact)
        for same in (
            lambda k: k.model == kind.model and k.route == kind.route and k.stream == kind.stream,
            lambda k: k.model == kind.model and k.route == kind.route,
            lambda k: k.model == kind.model,
        ):
            samples = [s for k, window in self._jobs.items() if same(k) for s in window]
            if samples:
                return samples
        return []


def _left(samples: list[float], elapsed: float) -> float | None:
    """The median time left of what has lasted `elapsed`, among the recent ones that lasted longer:
    what is known to have run 20 s is not one of the 5 s jobs. One that outlasted them all is
    expected to overrun its typical time by as much again (see OVERDUE_SHARE)."""
    if not samples:
        return None
    longer = [s for s in samples if s > elapsed]
    if longer:
        return median(longer) - elapsed
    typical = median(samples)
    return max(elapsed - typical, OVERDUE_SHARE * typical)
