"""The serial scheduler: one job on the GPU at a time, the best-scoring request next.

score = priority + swap affinity + waited / agingDivisor. Dispatch is
non-preemptive: priority only matters when the GPU frees up. A dispatched
request whose model is not loaded holds the GPU while the model starts, so a
swap is never interrupted by another pick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from . import rejections
from .decision import Decision, ScoreTerms
from .effects import Dequeued, Effect, Grant, StartModel, StopModel
from .fleet import ModelFleet, ModelState
from .priority import Band, band_of
from .queue import WaitQueue
from .settings import SerialSettings
from .snapshot import SchedulerSnapshot
from .swap import SwapPolicy
from .ticket import ModelSpec, Ticket


@dataclass
class _Launch:
    """A dispatched request whose model is being brought up. `ticket` becomes None if the client
    leaves; the start still runs to completion, as in llama-swap."""

    model: str
    decision: Decision
    ticket: Ticket | None
    started: bool = False  # StartModel sent; until then it waits for conflicting stops to finish


class SerialScheduler:
    name = "serial"

    def __init__(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, settings: SerialSettings) -> None:
        self._fleet = ModelFleet(models)
        self._policy = policy
        self._settings = settings
        self._queue = WaitQueue(settings.aging_divisor)
        self._running: Ticket | None = None
        self._launch: _Launch | None = None
        self._shut_down = False

    # -- requests -----------------------------------------------------------------------------

    def submit(self, ticket: Ticket, now: float) -> list[Effect]:
        if self._shut_down:
            return [rejections.shutting_down(ticket.id)]
        if ticket.model not in self._fleet:
            return [rejections.unknown_model(ticket.id, ticket.model)]
        if self._holds(ticket.id):
            raise ValueError(f"ticket #{ticket.id} was already submitted; ticket ids must be unique")
        self._enqueue(ticket)
        return self._dispatch(now)

    def cancel(self, ticket_id: int, now: float) -> list[Effect]:
        """The client left (or an operator cancelled): drop it wherever it is. Idempotent."""
        if self._dequeue(ticket_id, now) is not None:
            return [Dequeued(ticket_id, "cancelled")]
        launch = self._launch
        if launch is not None and launch.ticket is not None and launch.ticket.id == ticket_id:
            launch.ticket = None
            effects: list[Effect] = [Dequeued(ticket_id, "cancelled")]
            if not launch.started:
                self._launch = None
                effects += self._dispatch(now)
            return effects
        return self.finished(ticket_id, now)

    def finished(self, ticket_id: int, now: float) -> list[Effect]:
        """The granted request ended, whatever the outcome. Unknown ids are ignored."""
        if self._running is None or self._running.id != ticket_id:
            return []
        model = self._running.model
        self._fleet.end_serving(model, now)
        self._running = None
        return self._stop_if_retired(model) + self._dispatch(now)

    def reprioritize(self, ticket_id: int, priority: int, now: float) -> list[Effect]:
        """Re-rank a waiting request; it keeps its arrival time, so its aging carries on."""
        self._queue.reprioritize(ticket_id, priority)
        return []

    # -- models -------------------------------------------------------------------------------

    def model_ready(self, model: str, now: float) -> list[Effect]:
        if self._fleet.state(model) is not ModelState.STARTING:
            return []  # a start that was unloaded or shut down meanwhile
        self._fleet.mark_ready(model, now)
        launch, self._launch = self._launch, None
        assert launch is not None and launch.model == model, "a model only starts for the pending launch"
        if launch.ticket is None:  # its client left during the start, or a reload replaces the model
            return self._stop_if_retired(model) + self._dispatch(now)
        return [self._grant(launch.ticket, launch.decision)]

    def model_failed(self, model: str, reason: str, now: float) -> list[Effect]:
        """The start failed: its request and every request waiting for the same model would hit
        the same failure, so all of them get it now."""
        if self._fleet.state(model) is not ModelState.STARTING:
            return []
        replaced_config = self._fleet.is_retiring(model)
        self._fleet.mark_stopped(model)
        launch, self._launch = self._launch, None
        assert launch is not None and launch.model == model, "a model only starts for the pending launch"
        effects: list[Effect] = []
        if launch.ticket is not None:
            effects.append(rejections.start_failed(launch.ticket.id, model, reason))
        if not replaced_config:  # a start with the reloaded config may well succeed: let them try
            for ticket in self._queue.tickets_for(model):
                self._dequeue(ticket.id, now)
                effects.append(rejections.start_failed(ticket.id, model, reason))
        return effects + self._dispatch(now)

    def model_stopped(self, model: str, now: float) -> list[Effect]:
        """A stop finished, or a ready model exited on its own (its request fails by itself and
        the runtime then calls `finished`). A start reports through ready/failed instead."""
        if self._fleet.state(model) in (ModelState.STOPPED, ModelState.STARTING):
            return []
        self._fleet.mark_stopped(model)
        return self._start_launch() + self._dispatch(now)

    def unload(self, models: Iterable[str] | None, now: float) -> list[Effect]:
        """Stop the given models (None: every running or starting one). A request whose model
        was starting is told so; one it was serving is cut by the runtime when it carries out the
        stop (and reported `finished`); waiting requests stay queued and will start it again."""
        active = (ModelState.READY, ModelState.STARTING)
        targets = (
            self._fleet.in_state(*active)
            if models is None
            else sorted({m for m in models if m in self._fleet and self._fleet.state(m) in active})
        )
        effects: list[Effect] = []
        for model in targets:
            effects.append(self._stop(model, "unload"))
            launch = self._launch
            if launch is not None and launch.started and launch.model == model:
                self._launch = None
                if launch.ticket is not None:
                    effects.append(rejections.unloaded(launch.ticket.id, model))
        return effects + self._dispatch(now)

    def tick(self, now: float) -> list[Effect]:
        """Unload models idle for longer than their TTL."""
        return [self._stop(model, "ttl") for model in self._fleet.ttl_expired(now)]

    def next_deadline(self) -> float | None:
        return self._fleet.next_ttl_deadline()

    # -- operations ---------------------------------------------------------------------------

    def retune(self, settings: SerialSettings, now: float) -> list[Effect]:
        """Adopt edited settings; they apply from the next pick."""
        self._settings = settings
        self._queue.retune(settings.aging_divisor)
        return []

    def reconfigure(
        self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: Iterable[str], now: float
    ) -> list[Effect]:
        """Adopt a reloaded config: new model table and swap groups from now on.

        Requests for removed models are refused; requests for restarted models (whose command
        changed) keep waiting and start them again once the old process has stopped. Either
        kind of model stops at once when idle, else when its request or start ends. Ids in
        `restart` that `models` lacks are ignored. Effects come in model id order.
        """
        if self._shut_down:
            return []
        removed = self._fleet.reconfigure(models)
        self._policy = policy
        replaced = sorted(set(removed) | (set(restart) & models.keys()))
        effects: list[Effect] = []
        for model in replaced:
            effects += self._remove(model, now) if model in removed else self._restart(model)
        return effects + self._start_launch() + self._dispatch(now)

    def shutdown(self, now: float) -> list[Effect]:
        """Refuse everything still waiting and stop every model; the running request is left
        to the runtime's drain."""
        if self._shut_down:
            return []
        self._shut_down = True
        effects: list[Effect] = []
        if self._launch is not None and self._launch.ticket is not None:
            effects.append(rejections.shutting_down(self._launch.ticket.id))
        self._launch = None
        for ticket in self._queue.remove_all():
            self._fleet.end_waiting(ticket.model, now)
            effects.append(rejections.shutting_down(ticket.id))
        effects += [
            self._stop(model, "shutdown") for model in self._fleet.in_state(ModelState.READY, ModelState.STARTING)
        ]
        return effects

    def snapshot(self, now: float) -> SchedulerSnapshot:
        oldest = self._queue.band_oldest_arrival()
        return SchedulerSnapshot(
            depth_by_band=MappingProxyType(self._queue.band_depths()),
            oldest_wait_by_band=MappingProxyType(
                {band: 0.0 if oldest[band] is None else max(0.0, now - oldest[band]) for band in Band}
            ),
            running_tickets=() if self._running is None else (self._running.id,),
            loaded=self._fleet.loaded(),
            starting=self._fleet.in_state(ModelState.STARTING),
            waiting=len(self._queue),
            settings=self._settings,
        )

    def ranked(self, now: float) -> list[tuple[Ticket, ScoreTerms]]:
        """Waiting requests best first, with the score each would get right now."""
        return self._queue.ranked(now, self._fleet.ready_for_work(), self._settings)

    # -- internals ----------------------------------------------------------------------------

    def _holds(self, ticket_id: int) -> bool:
        launch_ticket = self._launch.ticket if self._launch is not None else None
        return (
            ticket_id in self._queue
            or (self._running is not None and self._running.id == ticket_id)
            or (launch_ticket is not None and launch_ticket.id == ticket_id)
        )

    def _dispatch(self, now: float) -> list[Effect]:
        """When the GPU is free, pick the best request and grant it or start its model."""
        if self._shut_down or self._running is not None or self._launch is not None:
            return []
        loaded = self._fleet.ready_for_work()
        pick = self._queue.pick(now, loaded, self._settings)
        if pick is None:
            return []
        ticket = pick.ticket
        self._dequeue(ticket.id, now)
        ready = ticket.model in loaded
        decision = Decision(
            ticket_id=ticket.id,
            model=ticket.model,
            scheduler=self.name,
            priority=ticket.priority,
            band=band_of(ticket.priority),
            score=pick.score,
            terms=pick.terms,
            queue_wait_s=now - ticket.arrival,
            runner_up_id=None if pick.runner_up is None else pick.runner_up.id,
            runner_up_score=pick.runner_up_score,
            changed_by_aging=pick.changed_by_aging,
            changed_by_affinity=pick.changed_by_affinity,
            needs_swap=not ready,
            fifo_priority=None,
        )
        if ready:
            return [self._grant(ticket, decision)]
        self._launch = _Launch(ticket.model, decision, ticket)
        return self._start_launch()

    def _start_launch(self) -> list[Effect]:
        """Send the pending StartModel once no model it depends on is still stopping, and no
        model removed by a reload is still up."""
        launch = self._launch
        if launch is None or launch.started:
            return []
        victims = self._policy.evictions(launch.model, self._fleet.not_stopped())
        stopping = ModelState.STOPPING
        if self._fleet.state(launch.model) is stopping or any(self._fleet.state(v) is stopping for v in victims):
            return []  # model_stopped resumes the launch
        if self._fleet.departing():
            return []  # so does the stop of the last removed model
        for victim in victims:
            self._fleet.mark_stopped(victim)
        self._fleet.mark_starting(launch.model)
        launch.started = True
        return [StartModel(launch.model, tuple(sorted(victims)))]

    def _enqueue(self, ticket: Ticket) -> None:
        self._queue.add(ticket)
        self._fleet.begin_waiting(ticket.model)

    def _dequeue(self, ticket_id: int, now: float) -> Ticket | None:
        ticket = self._queue.remove(ticket_id)
        if ticket is not None:
            self._fleet.end_waiting(ticket.model, now)
        return ticket

    def _grant(self, ticket: Ticket, decision: Decision) -> Grant:
        self._running = ticket
        self._fleet.begin_serving(ticket.model)
        return Grant(ticket.id, ticket.model, decision)

    def _remove(self, model: str, now: float) -> list[Effect]:
        """A model the reload dropped: refuse whoever waits for it, and stop it once idle. A start
        under way is cut short, since nobody is left to use it."""
        effects: list[Effect] = []
        launch = self._launch
        if launch is not None and launch.model == model:
            self._launch = None
            if launch.ticket is not None:
                effects.append(rejections.removed(launch.ticket.id, model))
        for ticket in self._queue.tickets_for(model):
            self._dequeue(ticket.id, now)
            effects.append(rejections.removed(ticket.id, model))
        if self._fleet.state(model) is ModelState.STARTING or self._fleet.retire(model):
            effects.append(self._stop(model, "reload"))
        return effects

    def _restart(self, model: str) -> list[Effect]:
        """A model whose process the reload replaces. A start under way still runs on the old
        config, so the request it was for waits again, for a start with the new one."""
        launch = self._launch
        if launch is not None and launch.model == model and launch.started and launch.ticket is not None:
            self._enqueue(launch.ticket)
            launch.ticket = None
        return [self._stop(model, "reload")] if self._fleet.retire(model) else []

    def _stop_if_retired(self, model: str) -> list[Effect]:
        """Stop a model a reload retired, now that its last request or its start has ended."""
        return [self._stop(model, "reload")] if self._fleet.due_for_retirement(model) else []

    def _stop(self, model: str, reason: str) -> StopModel:
        self._fleet.mark_stopping(model)
        return StopModel(model, reason)
