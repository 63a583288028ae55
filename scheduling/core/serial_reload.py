"""How the serial scheduler takes a reloaded config: models removed or replaced, new swap rules, new hardware."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import refusals
from .effects import Effect
from .fleet import ModelState
from .memory_book import MemoryBook
from .placement import Hardware
from .swap import SwapPolicy
from .ticket import ModelSpec


class SerialReload:
    """Part of `SerialScheduler`."""

    def reconfigure(
        self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: Iterable[str], now: float,
        hardware: Hardware | None = None,
    ) -> list[Effect]:
        """Adopt a reloaded config: new model table and swap groups from now on.

        Requests for removed models are refused; requests for restarted models (whose command
        changed, or that run on a GPU the new hardware lacks) keep waiting and start them again
        once the old process has stopped. Either
        kind of model stops at once when idle, else when its requests or start end. Ids in
        `restart` that `models` lacks are ignored. Effects come in model id order.
        """
        if self._shut_down:
            return []
        removed = self._fleet.reconfigure(models)
        self._policy = policy
        if hardware is None:
            self.memory = None
        else:
            self.memory = self.memory or MemoryBook(hardware, models)
            # A crashed model holds no memory; nor does one a start under way stops (that start took its memory).
            holding = [m for m in self._fleet.not_stopped() if self._starts.stopped_for(m) is None]
            self.memory.reconfigure(models, hardware, holding)
            restart = {*restart, *self.memory.on_retiring()}
        replaced = sorted(set(removed) | (set(restart) & models.keys()))
        effects: list[Effect] = []
        for model in replaced:
            effects += self._remove(model, now) if model in removed else self._restart(model)
        return effects + self._start_launches(now) + self._dispatch(now)

    def _remove(self, model: str, now: float) -> list[Effect]:
        """A model the reload dropped: refuse whoever waits for it, and stop it once idle. A start
        under way is cut short, since nobody is left to use it."""
        effects: list[Effect] = []
        launch = self._starts.drop(model)
        if launch is not None and launch.ticket is not None:
            effects.append(refusals.removed(launch.ticket.id, model))
            self._orphan(launch)
        for ticket in self._waiting.queue.tickets_for(model):
            self._dequeue(ticket.id, now)
            effects.append(refusals.removed(ticket.id, model))
        if self._fleet.state(model) is ModelState.STARTING or self._fleet.retire(model):
            effects.append(self._stop(model, "reload"))
        return effects

    def _restart(self, model: str) -> list[Effect]:
        """A model whose process the reload replaces. A start under way still runs on the old
        config, so the request it was for waits again, for a start with the new one."""
        launch = self._starts.of(model)
        if launch is not None and launch.started and launch.ticket is not None:
            ticket = launch.ticket
            self._orphan(launch)
            self._enqueue(ticket)
        return [self._stop(model, "reload")] if self._fleet.retire(model) else []
