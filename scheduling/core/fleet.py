"""What the scheduler believes about each model process: lifecycle state, requests being
served, and the idle clock that drives TTL unloads.

The runtime reports transitions (ready, failed, stopped); the schedulers record
their own requests (starting, stopping, serving). Nothing here acts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

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
        self._idle_since: dict[str, float] = {}

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
        return self.in_state(ModelState.READY)

    def not_stopped(self) -> tuple[str, ...]:
        """Every model holding (or about to hold, or still releasing) GPU memory."""
        return tuple(sorted(self._state))

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

    def mark_stopped(self, model: str) -> None:
        self._state.pop(model, None)
        self._idle_since.pop(model, None)

    def begin_serving(self, model: str) -> None:
        self._serving[model] = self._serving.get(model, 0) + 1

    def end_serving(self, model: str, now: float) -> None:
        """One request on `model` ended; the idle clock restarts when the last one does."""
        remaining = self._serving.get(model, 0) - 1
        if remaining > 0:
            self._serving[model] = remaining
            return
        self._serving.pop(model, None)
        if model in self._idle_since:
            self._idle_since[model] = now

    def _ttl_deadline(self, model: str) -> float | None:
        """When an idle, ready model with a TTL should be unloaded; None if it should not."""
        ttl = self._specs[model].ttl
        if ttl <= 0 or self.state(model) is not ModelState.READY or self.serving(model):
            return None
        return self._idle_since[model] + ttl

    def ttl_expired(self, now: float) -> tuple[str, ...]:
        """Ready models that have been idle for at least their TTL."""
        return tuple(
            model
            for model in self.loaded()
            if (deadline := self._ttl_deadline(model)) is not None and deadline <= now
        )

    def next_ttl_deadline(self) -> float | None:
        deadlines = [d for model in self.loaded() if (d := self._ttl_deadline(model)) is not None]
        return min(deadlines, default=None)
