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
from statistics import median

WINDOW = 50  # recent durations kept per kind: enough for a stable median, few enough to follow a change


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

    def job_s(self, kind: JobKind) -> float | None:
        """The typical run time of a job of `kind`, or None when the model has finished none."""
        exact = self._jobs.get(kind)
        if exact:
            return median(exact)
        for same in (
            lambda k: k.model == kind.model and k.route == kind.route and k.stream == kind.stream,
            lambda k: k.model == kind.model and k.route == kind.route,
            lambda k: k.model == kind.model,
        ):
            samples = [s for k, window in self._jobs.items() if same(k) for s in window]
            if samples:
                return median(samples)
        return None

    def load_s(self, model: str) -> float | None:
        """The typical time from deciding to start `model` to its being ready, or None if never seen."""
        loads = self._loads.get(model)
        return median(loads) if loads else None
