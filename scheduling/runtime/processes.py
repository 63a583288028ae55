"""The engine's model processes: starts and stops the core asks for, carried out as tasks through the fleet,
each reported back to the core when it ends (a failed start included)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Protocol

from scheduling.core import ModelState, StartModel, StopModel
from scheduling.events import Evicted, ModelLoaded, ModelStateChanged, RuntimeEvent

log = logging.getLogger("llamaswap.scheduler")


class Fleet(Protocol):
    """What the runtime needs from model-process management."""

    async def swap_in(self, model: str, evict: tuple[str, ...], gpus: tuple[str, ...] | None = None) -> None: ...  # raises on failure
    async def stop(self, model: str) -> None: ...
    def upstream_url(self, model: str) -> str: ...
    def check_exited(self, model: str) -> bool: ...  # a dead process is reported as a crash at once


# Why a model stops, as the log says it (a start's evictions are said by the fleet, naming the model starting).
STOP_REASONS = {
    "ttl": "idle for its ttl", "unload": "an operator unloaded it", "evict": "stopped for a swap",
    "reload": "a config reload changed or removed it", "shutdown": "llamaswap is shutting down",
}


class ModelProcesses:
    """The model starts and stops the core asked for, owned here as tasks: at most one start and one stop under way
    a model, each carried out through the fleet and reported to the core when it ends (ready, failed or stopped)
    through `run`; while a start runs, when it began. `SchedulerRuntime` makes one (`runtime.processes`)."""

    def __init__(self, scheduler, fleet: Fleet, durations, observer: Callable[[RuntimeEvent], None],
                 now: Callable[[], float], run: Callable[[Callable[[], list]], None],
                 spawn: Callable[[Coroutine], asyncio.Task]) -> None:
        self._scheduler = scheduler
        self._fleet = fleet
        self._durations = durations
        self._observer = observer
        self._now = now
        self._run = run
        self._spawn = spawn
        self._starts: dict[str, asyncio.Task] = {}
        self._stops: dict[str, asyncio.Task] = {}
        self._starting_since: dict[str, float] = {}

    def start(self, effect: StartModel) -> None:
        self._starts[effect.model] = self._spawn(self._start_model(effect))

    def stop(self, effect: StopModel) -> None:
        self._stops[effect.model] = self._spawn(self._stop_model(effect))

    def stops_of(self, models: list[str] | None) -> list[asyncio.Task]:
        """The stops under way for `models` (None: every model)."""
        return [task for model, task in self._stops.items() if models is None or model in models]

    def starting_since(self) -> dict[str, float]:
        """Each model starting now, with when its start began."""
        return dict(self._starting_since)

    def stopping(self) -> list[str]:
        """The models stopping now, not for a start of their own."""
        return [model for model in self._stops if model not in self._starting_since]

    async def _start_model(self, effect: StartModel) -> None:
        try:
            await self._start_and_report(effect)
        finally:
            if self._starts.get(effect.model) is asyncio.current_task():
                del self._starts[effect.model]
                self._starting_since.pop(effect.model, None)

    async def _start_and_report(self, effect: StartModel) -> None:
        started = self._starting_since[effect.model] = self._now()
        self._observer(ModelStateChanged(effect.model, ModelState.STARTING))
        try:
            await self._fleet.swap_in(effect.model, tuple(effect.evict), effect.gpus)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any start failure is reported to the waiting requests, never raised
            reason = str(exc) or type(exc).__name__  # the text names the cause; the model is named here
            log.warning("model %s failed to start: %s", effect.model, reason)
            self._observer(ModelStateChanged(effect.model, ModelState.STOPPED))
            self._run(lambda: self._scheduler.model_failed(effect.model, reason, self._now()))
            return
        self._durations.add_load(effect.model, self._now() - started)
        self._observer(ModelLoaded(effect.model, self._now() - started))
        self._observer(ModelStateChanged(effect.model, ModelState.READY))
        for model in effect.evict:
            self._observer(ModelStateChanged(model, ModelState.STOPPED))
            self._observer(Evicted(model, "memory" if model in effect.for_memory else "swap"))
        self._run(lambda: self._scheduler.model_ready(effect.model, self._now()))

    async def _stop_model(self, effect: StopModel) -> None:
        log.info("stopping model %s: %s", effect.model, STOP_REASONS.get(effect.reason, effect.reason))
        self._observer(ModelStateChanged(effect.model, ModelState.STOPPING))
        try:
            try:
                await self._fleet.stop(effect.model)
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
            self._observer(ModelStateChanged(effect.model, ModelState.STOPPED))
            self._run(lambda: self._scheduler.model_stopped(effect.model, self._now()))
