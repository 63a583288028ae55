"""llama-swap's fifo scheduler, with the priority header added to each model's configured priority.

Many requests may run at once, per model and across models that can coexist.
A request is admitted against its model's concurrency limit, then either joins
a model start already under way, runs at once (model ready, nothing to evict),
or waits in a queue sorted by effective priority. The queue is walked in order
whenever something finishes, and every request that can proceed does, so a
blocked request does not hold up the ones behind it (no strict head of line).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from . import refusals
from .decision import Decision, ScoreTerms
from .effects import Dequeued, Effect, Grant, Refuse, StartModel, StopModel
from .fleet import ModelFleet, ModelState
from .placement import Hardware, Room
from .priority import INT64_MAX, INT64_MIN, Band, band_of
from .settings import SerialSettings
from .snapshot import SchedulerSnapshot
from .swap import SwapPolicy
from .ticket import ModelSpec, Ticket


def _effective(spec: ModelSpec, priority: int) -> int:
    """The model's priority plus the header's, held within signed 64 bits: the header may already be at
    either end, and the sum goes into a 64-bit column and, from a worker, into a message to a front end."""
    return max(INT64_MIN, min(INT64_MAX, spec.fifo_priority + priority))


@dataclass(frozen=True)
class _Queued:
    ticket: Ticket
    effective_priority: int
    order: int  # submission order: keeps arrival order among equal priorities

    @property
    def sort_key(self) -> tuple[int, int]:
        return (-self.effective_priority, self.order)


@dataclass
class _Swap:
    """A model start under way, with the evictions it made and the requests waiting on it
    (kept as queued, so a reload can put them back in their place)."""

    target: str
    evict: frozenset[str]
    waiters: dict[int, tuple[_Queued, Decision]]


class FifoScheduler:
    name = "fifo"

    def __init__(self, models: Mapping[str, ModelSpec], policy: SwapPolicy, settings: SerialSettings,
                 hardware: Hardware | None = None) -> None:
        _no_placement(hardware)
        self._fleet = ModelFleet(models)
        self._policy = policy
        self._settings = settings  # unused by fifo; kept so snapshots look the same under both schedulers
        self._admitted: Counter[str] = Counter()  # queued + waiting on a start + running, per model
        self._swaps: dict[str, _Swap] = {}
        self._queue: list[_Queued] = []
        self._granted: dict[int, str] = {}
        self._order = itertools.count()
        self._shut_down = False

    # -- requests -----------------------------------------------------------------------------

    def submit(self, ticket: Ticket, now: float) -> list[Effect]:
        if self._shut_down:
            return [refusals.shutting_down(ticket.id)]
        if ticket.model not in self._fleet:
            return [refusals.unknown_model(ticket.id, ticket.model)]
        if self._holds(ticket.id):
            raise ValueError(f"ticket #{ticket.id} was already submitted; ticket ids must be unique")
        spec = self._fleet.spec(ticket.model)
        if self._admitted[ticket.model] >= spec.concurrency_limit:
            return [refusals.over_concurrency_limit(ticket.id, ticket.model, spec.concurrency_limit)]
        self._admitted[ticket.model] += 1
        item = _Queued(ticket, _effective(spec, ticket.priority), next(self._order))
        proceeded, effects = self._route(item, now)
        if not proceeded:
            self._enqueue(item)
        return effects

    def submit_all(self, tickets: Iterable[Ticket], now: float) -> list[Effect]:
        """A rebuilt queue: first come, first served, so submitting in arrival order is enough."""
        return [effect for ticket in sorted(tickets, key=lambda t: t.arrival) for effect in self.submit(ticket, now)]

    def cancel(self, ticket_id: int, now: float) -> list[Effect]:
        """The client left: free its slot wherever it waits (a start it waited on carries on).
        A running request ends as if finished. Idempotent."""
        return self.cancel_all((ticket_id,), now)

    def cancel_all(self, ticket_ids: Iterable[int], now: float) -> list[Effect]:
        """Requests that leave together (their front end is gone): each is dropped wherever it is,
        and only then is the queue walked, so none of them proceeds on the way out."""
        effects: list[Effect] = []
        drain = False
        for ticket_id in ticket_ids:
            if self._unqueue(ticket_id, now):
                effects.append(Dequeued(ticket_id))
            elif ticket_id in self._granted:
                ended, idle = self._end_job(ticket_id, now)
                effects += ended
                drain |= idle
        return effects + (self._drain(now) if drain else [])

    def _unqueue(self, ticket_id: int, now: float) -> bool:
        """Take a request out of the queue or off the start it waits on; whether it was there."""
        for index, item in enumerate(self._queue):
            if item.ticket.id == ticket_id:
                del self._queue[index]
                self._fleet.end_waiting(item.ticket.model, now)
                self._release(item.ticket.model)
                return True
        for swap in self._swaps.values():
            if swap.waiters.pop(ticket_id, None) is not None:
                self._release(swap.target)
                return True
        return False

    def finished(self, ticket_id: int, now: float) -> list[Effect]:
        if ticket_id not in self._granted:
            return []
        ended, idle = self._end_job(ticket_id, now)
        return ended + (self._drain(now) if idle else [])

    def _end_job(self, ticket_id: int, now: float) -> tuple[list[Effect], bool]:
        """A running request is over. Returns what that asks for, and whether its model went idle
        (then the queue is to be walked)."""
        model = self._granted.pop(ticket_id)
        self._release(model)
        self._fleet.end_serving(model, now)
        if self._fleet.serving(model):
            return [], False
        return self._stop_if_retired(model), True

    def reprioritize(self, ticket_id: int, priority: int, now: float) -> list[Effect]:
        """Move a queued request to its new place; among equals it keeps its arrival order."""
        for index, item in enumerate(self._queue):
            if item.ticket.id == ticket_id:
                del self._queue[index]
                spec = self._fleet.spec(item.ticket.model)
                self._insert(
                    _Queued(replace(item.ticket, priority=priority), _effective(spec, priority), item.order)
                )
                break
        return []

    # -- models -------------------------------------------------------------------------------

    def model_ready(self, model: str, now: float) -> list[Effect]:
        if self._fleet.state(model) is not ModelState.STARTING:
            return []  # a start that was unloaded or shut down meanwhile
        self._fleet.mark_ready(model, now)
        swap = self._swaps.pop(model)
        effects: list[Effect] = [self._grant(item.ticket, decision) for item, decision in swap.waiters.values()]
        return effects + self._stop_if_retired(model) + self._drain(now)

    def model_failed(self, model: str, reason: str, now: float) -> list[Effect]:
        """Every request waiting on the failed start gets the error; queued ones stay and retry.
        (A start a reload superseded has no waiters left: they went back to the queue.)"""
        if self._fleet.state(model) is not ModelState.STARTING:
            return []
        self._fleet.mark_stopped(model)
        swap = self._swaps.pop(model)
        effects: list[Effect] = [
            self._refuse(item.ticket, refusals.start_failed(item.ticket.id, model, reason))
            for item, _ in swap.waiters.values()
        ]
        return effects + self._drain(now)

    def model_stopped(self, model: str, now: float) -> list[Effect]:
        """A stop finished, or a ready model exited on its own. A start reports through
        ready/failed instead."""
        if self._fleet.state(model) in (ModelState.STOPPED, ModelState.STARTING):
            return []
        self._fleet.mark_stopped(model)
        return self._drain(now)

    def unload(self, models: Iterable[str] | None, now: float) -> list[Effect]:
        """Stop the given models (None: all). Requests waiting for them, queued or on a start,
        get "model unloaded"; requests for other models stay queued. Running requests are cut
        by the runtime when it carries out the stop."""
        if models is None:
            names = {*self._fleet.ids(), *self._fleet.departing()}
        else:
            names = {m for m in models if m in self._fleet}
        effects: list[Effect] = []
        for model in sorted(names):
            swap = self._swaps.pop(model, None)
            for item, _ in swap.waiters.values() if swap is not None else ():
                effects.append(self._refuse(item.ticket, refusals.unloaded(item.ticket.id, model)))
        staying = []
        for item in self._queue:
            if item.ticket.model in names:
                self._fleet.end_waiting(item.ticket.model, now)
                effects.append(self._refuse(item.ticket, refusals.unloaded(item.ticket.id, item.ticket.model)))
            else:
                staying.append(item)
        self._queue = staying
        for model in self._fleet.in_state(ModelState.READY, ModelState.STARTING):
            if model in names:
                effects.append(self._stop(model, "unload"))
        return effects + self._drain(now)

    def tick(self, now: float) -> list[Effect]:
        """Unload models idle for longer than their TTL."""
        return [self._stop(model, "ttl") for model in self._fleet.ttl_expired(now)]

    def next_deadline(self) -> float | None:
        return self._fleet.next_ttl_deadline()

    # -- operations ---------------------------------------------------------------------------

    def retune(self, settings: SerialSettings, now: float) -> list[Effect]:
        """Serial settings do not affect fifo; they are kept for the snapshot."""
        self._settings = settings
        return []

    def reconfigure(
        self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: Iterable[str], now: float,
        hardware: Hardware | None = None,
    ) -> list[Effect]:
        """Adopt a reloaded config: new model table (limits, TTLs, priorities for new requests)
        and swap groups from now on.

        Requests for removed models are refused; requests for restarted models (whose command
        changed) keep their place in the queue and start them again once the old process has
        stopped. Either kind of model stops at once when idle, else when its last request or
        its start ends. Ids in `restart` that `models` lacks are ignored. Effects come in model
        id order.
        """
        _no_placement(hardware)
        if self._shut_down:
            return []
        removed = set(self._fleet.reconfigure(models))
        self._policy = policy
        restarted = set(restart) & models.keys()
        orphaned: dict[str, list[_Queued]] = {model: [] for model in removed}
        staying = []
        for item in self._queue:
            if item.ticket.model in removed:
                self._fleet.end_waiting(item.ticket.model, now)
                orphaned[item.ticket.model].append(item)
            else:
                staying.append(item)
        self._queue = staying
        effects: list[Effect] = []
        for model in sorted(removed | restarted):
            effects += self._remove(model, orphaned[model]) if model in removed else self._restart(model)
        return effects + self._drain(now)

    def shutdown(self, now: float) -> list[Effect]:
        if self._shut_down:
            return []
        self._shut_down = True
        effects: list[Effect] = []
        for swap in self._swaps.values():
            for item, _ in swap.waiters.values():
                effects.append(self._refuse(item.ticket, refusals.shutting_down(item.ticket.id)))
        self._swaps.clear()
        for item in self._queue:
            self._fleet.end_waiting(item.ticket.model, now)
            effects.append(self._refuse(item.ticket, refusals.shutting_down(item.ticket.id)))
        self._queue.clear()
        effects += [
            self._stop(model, "shutdown") for model in self._fleet.in_state(ModelState.READY, ModelState.STARTING)
        ]
        return effects

    def snapshot(self, now: float) -> SchedulerSnapshot:
        depth = dict.fromkeys(Band, 0)
        oldest_wait = dict.fromkeys(Band, 0.0)
        for item in self._queue:
            band = band_of(item.ticket.priority)
            depth[band] += 1
            oldest_wait[band] = max(oldest_wait[band], now - item.ticket.arrival)
        return SchedulerSnapshot(
            depth_by_band=MappingProxyType(depth),
            oldest_wait_by_band=MappingProxyType(oldest_wait),
            running_tickets=tuple(self._granted),
            loaded=self._fleet.loaded(),
            starting=self._fleet.in_state(ModelState.STARTING),
            waiting=len(self._queue),
            settings=self._settings,
        )

    def is_queued(self, ticket_id: int) -> bool:
        return any(item.ticket.id == ticket_id for item in self._queue)

    def held_back_because(self, ticket_id: int) -> str:
        return ""  # llama-swap's order: each waits for the one ahead of it

    def placement(self) -> dict | None:
        return None  # fifo places nothing by memory (see `_no_placement`)

    def apply_leases(self, leases: Mapping[str, tuple[str, float]], now: float) -> list[Effect]:
        return []

    def memory_measured(self, model: str, use: Mapping[str, int]) -> str | None:
        return None  # nothing placed by memory, so nothing to correct

    def room_for(self, model: str) -> Room | None:
        return None

    def never_fits(self, model: str) -> str | None:
        return None

    def ranked(self, now: float) -> list[tuple[Ticket, ScoreTerms]]:
        """Queued requests in queue order, scored by effective priority."""
        return [(item.ticket, ScoreTerms(item.effective_priority, 0, 0.0)) for item in self._queue]

    # -- the decision tree --------------------------------------------------------------------

    def _route(self, item: _Queued, now: float) -> tuple[bool, list[Effect]]:
        """llama-swap's decision tree for one request: (whether it left the queue, effects)."""
        ticket = item.ticket
        model = ticket.model
        if self._fleet.is_retiring(model):
            return False, []  # a reload replaces its process: wait for the stop, then start anew
        swap = self._swaps.get(model)
        if swap is not None:  # join the start under way
            swap.waiters[ticket.id] = (item, self._decision(item, now, needs_swap=True))
            return True, []
        state = self._fleet.state(model)
        if state is ModelState.STOPPING:
            return False, []  # model_stopped drains the queue
        victims = self._policy.evictions(model, self._fleet.not_stopped())
        if state is ModelState.READY and not victims:  # fast path
            return True, [self._grant(ticket, self._decision(item, now, needs_swap=False))]
        if any(self._collides(model, victims, other) for other in self._swaps.values()):
            return False, []
        if any(self._fleet.state(v) is ModelState.STOPPING or self._fleet.serving(v) for v in victims):
            return False, []  # never cut a running request to make room
        if state is ModelState.READY:
            # Ready, but sharing the GPU with models its group evicts: stop those, then fast path.
            return False, [self._stop(victim, "evict") for victim in sorted(victims)]
        if self._fleet.departing():
            return False, []  # a model removed by a reload still holds the GPU; its stop drains
        for victim in victims:
            self._fleet.mark_stopped(victim)
        self._fleet.mark_starting(model)
        self._swaps[model] = _Swap(model, victims, {ticket.id: (item, self._decision(item, now, needs_swap=True))})
        return True, [StartModel(model, tuple(sorted(victims)))]

    @staticmethod
    def _collides(model: str, victims: frozenset[str], other: _Swap) -> bool:
        """Two starts may overlap only if neither touches what the other starts or stops."""
        return model in other.evict or other.target in victims or not victims.isdisjoint(other.evict)

    def _drain(self, now: float) -> list[Effect]:
        """Walk the queue in order and let through every request that can now proceed."""
        effects: list[Effect] = []
        staying = []
        for item in self._queue:
            proceeded, routed = self._route(item, now)
            effects += routed
            if proceeded:
                self._fleet.end_waiting(item.ticket.model, now)
            else:
                staying.append(item)
        self._queue = staying
        return effects

    # -- internals ----------------------------------------------------------------------------

    def _decision(self, item: _Queued, now: float, needs_swap: bool) -> Decision:
        ticket = item.ticket
        return Decision(
            ticket_id=ticket.id,
            model=ticket.model,
            scheduler=self.name,
            priority=ticket.priority,
            band=band_of(ticket.priority),
            score=float(item.effective_priority),
            terms=ScoreTerms(item.effective_priority, 0, 0.0),
            queue_wait_s=now - ticket.arrival,
            runner_up_id=None,
            runner_up_score=None,
            changed_by_aging=False,
            changed_by_affinity=False,
            needs_swap=needs_swap,
            fifo_priority=item.effective_priority,
        )

    def _remove(self, model: str, dequeued: list[_Queued]) -> list[Effect]:
        """A model the reload dropped: refuse the requests waiting on its start and those taken
        out of the queue for it, and stop it once idle. A start under way is cut short, since
        nobody is left to use it."""
        swap = self._swaps.pop(model, None)
        waiting = [item for item, _ in swap.waiters.values()] if swap is not None else []
        effects: list[Effect] = [
            self._refuse(item.ticket, refusals.removed(item.ticket.id, model)) for item in waiting + dequeued
        ]
        if self._fleet.state(model) is ModelState.STARTING or self._fleet.retire(model):
            effects.append(self._stop(model, "reload"))
        return effects

    def _restart(self, model: str) -> list[Effect]:
        """A model whose process the reload replaces. A start under way still runs on the old
        config, so the requests waiting on it go back to their places in the queue; the start
        stays registered so that other starts keep clear of it."""
        swap = self._swaps.get(model)
        if swap is not None:
            for item, _ in swap.waiters.values():
                self._enqueue(item)
            swap.waiters.clear()
        return [self._stop(model, "reload")] if self._fleet.retire(model) else []

    def _stop_if_retired(self, model: str) -> list[Effect]:
        """Stop a model a reload retired, now that its last request or its start has ended."""
        return [self._stop(model, "reload")] if self._fleet.due_for_retirement(model) else []

    def _enqueue(self, item: _Queued) -> None:
        self._insert(item)
        self._fleet.begin_waiting(item.ticket.model)

    def _insert(self, item: _Queued) -> None:
        bisect.insort(self._queue, item, key=lambda queued: queued.sort_key)

    def _holds(self, ticket_id: int) -> bool:
        return (
            ticket_id in self._granted
            or any(item.ticket.id == ticket_id for item in self._queue)
            or any(ticket_id in swap.waiters for swap in self._swaps.values())
        )

    def _grant(self, ticket: Ticket, decision: Decision) -> Grant:
        self._granted[ticket.id] = ticket.model
        self._fleet.begin_serving(ticket.model)
        return Grant(ticket.id, ticket.model, decision)

    def _refuse(self, ticket: Ticket, rejection: Refuse) -> Refuse:
        """Answer an admitted request with an error, freeing its slot."""
        self._release(ticket.model)
        return rejection

    def _release(self, model: str) -> None:
        self._admitted[model] -= 1
        if not self._admitted[model]:
            del self._admitted[model]

    def _stop(self, model: str, reason: str) -> StopModel:
        self._fleet.mark_stopping(model)
        return StopModel(model, reason)


def _no_placement(hardware: Hardware | None) -> None:
    """Memory placement is the serial scheduler's: llama-swap's order knows one model's start at a time."""
    if hardware is not None:
        raise ValueError("hardware placement needs the serial scheduler — set routing.scheduler.use: serial")
