"""Which scheduler worker serves which models, as a front end learns it from their announcements.

Each GPU box runs a worker for its own models, announcing them every `ANNOUNCE_S`. A front end
sends a request to the worker that last announced its model. A worker that stops announcing is
left out of the questions asked of every worker (`live()`), but its models still route to its
channel: a standby, or the same worker restarted, reads what waits there.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from scheduling.door.wire import ANNOUNCE_S, Announce

log = logging.getLogger("llamaswap.frontend")

# A worker not heard from for this long is left out of questions asked of every worker.
SILENT_AFTER_S = 3 * ANNOUNCE_S


@dataclass
class _Known:
    models: tuple[str, ...]
    worker: str
    heard: float


class WorkerDirectory:
    def __init__(self, silent_after_s: float = SILENT_AFTER_S) -> None:
        self.silent_after_s = silent_after_s
        self._workers: dict[str, _Known] = {}  # by channel
        self._routes: dict[str, str] = {}  # model -> channel
        self._changed = asyncio.Event()

    def heard(self, announce: Announce, now: float) -> bool:
        """Note an announcement; True when it is from a worker process not heard from before on its
        channel (a new one, or one that took over): a heartbeat to it at once gets its hello at once."""
        known = self._workers.get(announce.channel)
        if known is None or known.models != announce.models:
            for model in announce.models:
                other = self._routes.get(model)
                if other is not None and other != announce.channel and other in self.live(now):
                    log.warning(
                        "model %r is announced by two workers (%s, and %s): requests for it now go to the latter; "
                        "give each model to one worker's config", model, self._workers[other].worker, announce.worker,
                    )
                self._routes[model] = announce.channel
            self._changed.set()
            self._changed = asyncio.Event()
        self._workers[announce.channel] = _Known(announce.models, announce.worker, now)
        return known is None or known.worker != announce.worker

    def channel_for(self, model: str) -> str | None:
        return self._routes.get(model)

    async def wait_for(self, model: str, timeout: float) -> str | None:
        """The channel for `model`, waiting up to `timeout` for a worker to announce it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (channel := self._routes.get(model)) is None and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        return channel

    def live(self, now: float) -> list[str]:
        """The workers heard from lately: the ones to ask."""
        return [channel for channel, known in self._workers.items() if now - known.heard <= self.silent_after_s]

    def serving(self, models: list[str], now: float) -> list[str]:
        """The live workers that serve any of `models`."""
        wanted = set(models)
        return [channel for channel in self.live(now) if wanted & set(self._workers[channel].models)]
