"""The model processes this service runs: one `ModelProcess` per configured model, started on demand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from proxy.model_processes.logring import LogRing
from proxy.model_processes.orphans import process_owner
from proxy.model_processes.process import STOPPED_WHILE_STARTING, ModelProcess, ModelStartError, SpawnedProcess
from scheduling.core import ModelState

log = logging.getLogger("llamaswap.fleet")


def process_changed(old, new) -> bool:
    """Whether a reloaded model entry needs a new process: what it runs, where it listens, or (with `hardware:`)
    what it takes changed, so it is placed again and started on the GPUs that gives it."""
    fields = ("cmd", "cmd_stop", "proxy", "check_endpoint", "env", "memory")
    return any(getattr(old, f) != getattr(new, f) for f in fields)


class ProcessFleet:
    """Carries out the scheduler's start/stop decisions and records each process group for crash recovery.

    A group is recorded the moment it is spawned, before its health checks, and forgotten once it
    is gone: a restart after a SIGKILL finds every group that may still run (`proxy.model_processes.orphans`).
    """

    def __init__(self, config, recorder, on_crash: Callable[[str], None]):
        self.config = config
        self.recorder = recorder
        self.on_crash = on_crash
        self.logs: dict[str, LogRing] = {}
        self.processes: dict[str, ModelProcess] = {}
        # Processes of models a reload removed or changed, kept until the scheduler stops them.
        self._retiring: dict[str, ModelProcess] = {}
        # Where GPU memory is measured: measures a model healthy as a pid before it counts as ready (`gpu_memory`).
        self.measure_started: Callable[[str, int], Awaitable[None]] | None = None
        self._add(config.models)

    def _add(self, models) -> None:
        for model_id in models:
            self.logs.setdefault(model_id, LogRing())
            self.processes[model_id] = ModelProcess(
                self.config.models[model_id],
                health_check_timeout=self.config.health_check_timeout,
                log=self.logs[model_id],
                on_exit=self._exited,
                on_spawn=self._spawned,
                on_gone=self._gone,
                owner=process_owner(),
            )

    def apply(self, config, restart: Iterable[str]) -> None:
        """Take a reloaded config: new models get processes, removed and `restart` ones retire theirs,
        and the others keep theirs under the new entry (its `unloadTimeout` and the new
        `healthCheckTimeout` apply from their next stop and start).

        A retiring process keeps running (it may be serving) until the scheduler stops it.
        """
        removed = set(self.config.models) - set(config.models)
        replaced = set(restart) | removed
        for model_id in replaced:
            process = self.processes.pop(model_id)
            if process.state != ModelState.STOPPED:
                self._retiring[model_id] = process
        self.config = config
        for model_id, process in self.processes.items():
            process.config = config.models[model_id]
            process.health_check_timeout = config.health_check_timeout
        self._add([m for m in config.models if m not in self.processes])

    def _current(self, model: str) -> ModelProcess:
        return self._retiring.get(model) or self.processes[model]

    def upstream_url(self, model: str) -> str:
        return self.config.models[model].proxy

    def state(self, model: str) -> str:
        return self._current(model).state

    def entry(self, model: str):
        """The config entry `model`'s process runs with: a retiring one (removed or replaced by a
        reload, still stopping) keeps the entry it was started with."""
        return self._current(model).config

    def running(self) -> list[str]:
        models = dict.fromkeys([*self._retiring, *self.processes])
        return [m for m in models if self._current(m).state != ModelState.STOPPED]

    def ready_pids(self) -> dict[str, int]:
        """Each ready model's process (the one started; see `proxy.model_processes.gpu_memory`), by model."""
        ready = {m: self._current(m) for m in self.running()}
        return {m: process.pid for m, process in ready.items() if process.state == ModelState.READY and process.pid}

    async def swap_in(self, model: str, evict: tuple[str, ...], gpus: tuple[str, ...] | None = None) -> None:
        """Stop the evicted models (in parallel), then start `model` and wait until it is healthy, and measured
        where GPU memory is; `gpus` (placement's, () for the CPU) become its CUDA_VISIBLE_DEVICES and its cmd's
        ${GPUS}."""
        if evict:
            log.info("swapping to %s: stopping %s", model, ", ".join(evict))
            await asyncio.gather(*(self.stop(m) for m in evict))
        process = self.processes[model]
        await process.start(gpus)
        if self.measure_started is not None and process.pid:
            await self.measure_started(model, process.pid)
            if process.state != ModelState.READY:
                raise ModelStartError(model, STOPPED_WHILE_STARTING)

    def check_exited(self, model: str) -> bool:
        """Whether `model`'s ready process has died (then reported as a crash at once)."""
        return self._current(model).check_exited()

    async def stop(self, model: str) -> None:
        retiring = self._retiring.get(model)
        process = retiring or self.processes.get(model)
        if process is None:
            return  # a removed model whose process already exited on its own: nothing left to stop
        await process.stop()
        if retiring is not None and self._retiring.get(model) is retiring:
            del self._retiring[model]

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(m) for m in self.running()), return_exceptions=True)

    def _exited(self, process: ModelProcess, returncode: int | None) -> None:
        model = process.config.id
        log.warning("model %s exited unexpectedly (status %s)", model, returncode)
        if self._retiring.get(model) is process:
            del self._retiring[model]
        self.on_crash(model)

    def _spawned(self, spawned: SpawnedProcess) -> None:
        self.recorder.process_started(
            spawned.model, spawned.pid, spawned.pid, list(spawned.cmdline),
            start_ticks=spawned.start_ticks, marker=spawned.marker,
        )

    def _gone(self, spawned: SpawnedProcess) -> None:
        self.recorder.process_stopped(spawned.marker)
