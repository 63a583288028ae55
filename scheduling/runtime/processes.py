"""The engine's model processes: starts and stops the core asks for, carried out as tasks through the fleet,
each reported back to the core when it ends (a failed start included); operators' unloads; crashes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from scheduling.core import ModelState, StartModel, StopModel
from scheduling.events import Evicted, ModelLoaded, ModelStateChanged
from scheduling.tickets import Refused

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
    """Part of `SchedulerRuntime`."""

    def unload(self, models: list[str] | None = None) -> list[asyncio.Task]:
        """Stop these models now (None: every model). Requests they are serving are cut at once (see
        `Lease`); returns the stops under way for them, which end once their processes are gone."""
        now = self.now()
        self._run(lambda: self.scheduler.unload(models, now))
        return [task for model, task in self._stops.items() if models is None or model in models]

    def model_exited(self, model: str) -> None:
        """A model process died on its own (crash): the core must stop counting it as loaded."""
        now = self.now()
        self._observer(ModelStateChanged(model, ModelState.STOPPED))
        self._run(lambda: self.scheduler.model_stopped(model, now))

    def memory_measured(self, model: str, use: Mapping[str, int]) -> None:
        """What `model`'s processes use on each GPU (MiB by GPU id), measured where they run: the core shows it
        and counts it where it is more than declared, which is said here."""
        warning = self.scheduler.memory_measured(model, use)
        if warning is not None:
            log.warning("%s", warning)

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
        self._observer(ModelStateChanged(effect.model, ModelState.STARTING))
        try:
            await self.fleet.swap_in(effect.model, tuple(effect.evict), effect.gpus)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any start failure is reported to the waiting requests, never raised
            reason = str(exc) or type(exc).__name__  # the text names the cause; the model is named here
            log.warning("model %s failed to start: %s", effect.model, reason)
            self._observer(ModelStateChanged(effect.model, ModelState.STOPPED))
            self._run(lambda: self.scheduler.model_failed(effect.model, reason, self.now()))
            return
        self.durations.add_load(effect.model, self.now() - started)
        self._observer(ModelLoaded(effect.model, self.now() - started))
        self._observer(ModelStateChanged(effect.model, ModelState.READY))
        for model in effect.evict:
            self._observer(ModelStateChanged(model, ModelState.STOPPED))
            self._observer(Evicted(model, "memory" if model in effect.for_memory else "swap"))
        self._run(lambda: self.scheduler.model_ready(effect.model, self.now()))

    async def _stop_model(self, effect: StopModel) -> None:
        log.info("stopping model %s: %s", effect.model, STOP_REASONS.get(effect.reason, effect.reason))
        self._observer(ModelStateChanged(effect.model, ModelState.STOPPING))
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
            self._observer(ModelStateChanged(effect.model, ModelState.STOPPED))
            self._run(lambda: self.scheduler.model_stopped(effect.model, self.now()))

    def _cut_requests_on(self, model: str) -> None:
        """An operator unloads `model`: what it is serving ends now, each client told why."""
        reason = Refused(
            503, "model_unloaded", f"model '{model}' was unloaded by an operator while this request was running"
        )
        self._cut([ticket_id for ticket_id, (request, _, _) in self._granted.items() if request.model == model], reason)
