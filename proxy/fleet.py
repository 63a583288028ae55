"""The model processes this service runs: one `ModelProcess` per configured model, started on demand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from proxy.logring import LogRing
from proxy.processes import ModelProcess

log = logging.getLogger("llamaswap.fleet")


class ModelFleet:
    """Carries out the scheduler's start/stop decisions and remembers pids for crash recovery."""

    def __init__(self, config, recorder, on_crash: Callable[[str], None]):
        self.config = config
        self.recorder = recorder
        self.on_crash = on_crash
        self.logs: dict[str, LogRing] = {model_id: LogRing() for model_id in config.models}
        self.processes: dict[str, ModelProcess] = {
            model_id: ModelProcess(
                model,
                health_check_timeout=config.health_check_timeout,
                log=self.logs[model_id],
                on_exit=self._exited,
            )
            for model_id, model in config.models.items()
        }
        self._recorded_pids: dict[str, int] = {}

    def upstream_url(self, model: str) -> str:
        return self.config.models[model].proxy

    def state(self, model: str) -> str:
        return self.processes[model].state

    def running(self) -> list[str]:
        return [m for m, p in self.processes.items() if p.state != "stopped"]

    async def swap_in(self, model: str, evict: tuple[str, ...]) -> None:
        """Stop the evicted models (in parallel), then start `model` and wait until it is healthy."""
        if evict:
            log.info("swapping to %s: stopping %s", model, ", ".join(evict))
            await asyncio.gather(*(self.stop(m) for m in evict))
        process = self.processes[model]
        await process.start()
        if process.pid is not None:
            self._recorded_pids[model] = process.pid
            self.recorder.process_started(model, process.pid, process.pgid or process.pid, list(process.config.cmd))

    async def stop(self, model: str) -> None:
        await self.processes[model].stop()
        self._forget_pid(model)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(m) for m in self.running()), return_exceptions=True)

    def _exited(self, process: ModelProcess, returncode: int | None) -> None:
        log.warning("model %s exited unexpectedly (status %s)", process.config.id, returncode)
        self._forget_pid(process.config.id)
        self.on_crash(process.config.id)

    def _forget_pid(self, model: str) -> None:
        pid = self._recorded_pids.pop(model, None)
        if pid is not None:
            self.recorder.process_stopped(pid)
