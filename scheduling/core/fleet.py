"""What the scheduler believes about each model process: lifecycle state, requests being
served or waiting, and the idle clock that drives TTL unloads.

A model is idle only when it serves nothing and no request waits for it: a model
that requests are queued for (behind another model's job, say) is about to be
used, and unloading it would only make them wait for it to load again. Its TTL
counts from the moment it last became idle.

The runtime reports transitions (ready, failed, stopped); the schedulers record
their own requests (starting, stopping, serving). Nothing here acts.

A config reload can leave processes behind that no longer match the config: a
model removed from it, or one whose command changed. Those are *retiring*: they
finish what they serve (or the start under way), are never handed new work, and
are stopped once idle. A removed model keeps its state here until it has stopped,
then is forgotten.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from .ticket import ModelSpec


class ModelState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


class ModelFleet:
    def __init__(self, models: Mapping[str, ModelSpec]) -> None:
        self._specs = dict(models)
        self._state: dict[str, ModelState] = {}  # absent = stopped
        self._serving: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._idle_since: dict[str, float] = {}
        self._retiring: set[str] = set()

    def reconfigure(self, models: Mapping[str, ModelSpec]) -> tuple[str, ...]:
        """Adopt a reloaded model table; returns the ids it dropped, sorted. Their processes
        are still tracked until reported stopped (see `departing`)."""
        removed = tuple(sorted(self._specs.keys() - models.keys()))
        self._specs = dict(models)
        return removed

    def __contains__(self, model: object) -> bool:
        return model in self._specs

    def ids(self) -> tuple[str, ...]:
        """Every configured model, sorted."""
        return tuple(sorted(self._specs))

    def spec(self, model: str) -> ModelSpec:
        return self._specs[model]

    def state(self, model: str) -> ModelState:
        return self._state.get(model, ModelState.STOPPED)

    def in_state(self, *states: ModelState) -> tuple[str, ...]:
        """Models currently in any of `states`, sorted by id."""
        return tuple(sorted(model for model, state in self._state.items() if state in states))

    def loaded(self) -> tuple[str, ...]:
        """Models whose process is up, including retiring ones still serving."""
        return self.in_state(ModelState.READY)

    def ready_for_work(self) -> tuple[str, ...]:
        """Loaded models that may take new requests (and so earn swap affinity), sorted."""
        return tuple(model for model in self.loaded() if model not in self._retiring)

    def not_stopped(self) -> tuple[str, ...]:
        """Every configured model holding (or about to hold, or still releasing) GPU memory.
        Removed models still up are listed by `departing` instead: the swap groups no longer
        know them."""
        return tuple(sorted(model for model in self._state if model in self._specs))

    def departing(self) -> tuple[str, ...]:
        """Models removed from the config whose process has not been reported stopped yet.
        Nothing new may start beside them: the config no longer says what they can share
        the GPU with."""
        return tuple(sorted(model for model in self._state if model not in self._specs))

    def serving(self, model: str) -> int:
        """Granted requests on `model` that have not finished."""
        return self._serving.get(model, 0)

    def mark_starting(self, model: str) -> None:
        self._state[model] = ModelState.STARTING

    def mark_ready(self, model: str, now: float) -> None:
        self._state[model] = ModelState.READY
        self._idle_since[model] = now

    def mark_stopping(self, model: str) -> None:
        self._state[model] = ModelState.STOPPING
        self._retiring.discard(model)

    def mark_stopped(self, model: str) -> None:
        self._state.pop(model, None)
        self._idle_since.pop(model, None)
        self._retiring.discard(model)

    def retire(self, model: str) -> bool:
        """Mark a ready or starting model's process to be stopped for a reload. True when it can
        stop at once; otherwise `due_for_retirement` turns true when its start or its last
        request ends."""
        if self.state(model) in (ModelState.READY, ModelState.STARTING):
            self._retiring.add(model)
        return self.due_for_retirement(model)

    def is_retiring(self, model: str) -> bool:
        return model in self._retiring

    def due_for_retirement(self, model: str) -> bool:
        """A retiring model that is up and idle: stop it now."""
        return model in self._retiring and self.state(model) is ModelState.READY and not self.serving(model)

    def waiting(self, model: str) -> int:
        """Queued requests for `model` (not those waiting on its start, nor those it serves)."""
        return self._waiting.get(model, 0)

    def begin_serving(self, model: str) -> None:
        self._serving[model] = self._serving.get(model, 0) + 1

    def end_serving(self, model: str, now: float) -> None:
        """One request on `model` ended; the idle clock restarts if that left the model idle."""
        _decrement(self._serving, model)
        self._restart_idle_clock(model, now)

    def begin_waiting(self, model: str) -> None:
        """A request for `model` joined the queue."""
        self._waiting[model] = self._waiting.get(model, 0) + 1

    def end_waiting(self, model: str, now: float) -> None:
        """A request for `model` left the queue (dispatched, cancelled or refused)."""
        _decrement(self._waiting, model)
        self._restart_idle_clock(model, now)

    def _restart_idle_clock(self, model: str, now: float) -> None:
        if model in self._idle_since and not self.serving(model) and not self.waiting(model):
            self._idle_since[model] = now

    def _ttl_deadline(self, model: str) -> float | None:
        """When an idle, ready model with a TTL should be unloaded; None if it should not
        (a retiring model is stopped by the reload instead)."""
        if model in self._retiring or self.state(model) is not ModelState.READY:
            return None
        if self.serving(model) or self.waiting(model):
            return None
        ttl = self._specs[model].ttl
        if ttl <= 0:
            return None
        return self._idle_since[model] + ttl

    def ttl_expired(self, now: float) -> tuple[str, ...]:
        """Ready models that have been idle for at least their TTL."""
        return tuple(
            model
            for model in self.loaded()
            if (deadline := self._ttl_deadline(model)) is not None and deadline <= now
        )

    def next_ttl_deadline(self, kept: Callable[[str], bool] = lambda model: False) -> float | None:
        """The next TTL unload due, leaving out models `kept` (leased: their lease's end comes first)."""
        deadlines = [d for model in self.loaded() if not kept(model) and (d := self._ttl_deadline(model)) is not None]
        return min(deadlines, default=None)


def _decrement(counts: dict[str, int], model: str) -> None:
    remaining = counts.get(model, 0) - 1
    if remaining > 0:
        counts[model] = remaining
    else:
        counts.pop(model, None)
