"""What the serial scheduler keeps between its calls: each model start under way with the request it is
for, each job on a slot, and what one dispatch pass has set aside for the swaps of better requests."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .decision import Decision
from .mentions import named
from .ticket import Ticket


@dataclass
class Launch:
    """A dispatched request whose model is being brought up, on `slot` of it. `ticket` becomes
    None if the client leaves; the start still runs to completion, as in llama-swap."""

    model: str
    decision: Decision
    ticket: Ticket | None
    slot: int
    started: bool = False  # StartModel sent; until then it waits for conflicting stops to finish


@dataclass(frozen=True)
class Job:
    ticket: Ticket
    slot: int


class Starts:
    """The model starts the scheduler dispatched, owned here: at most one launch a model, in dispatch order, and
    the models a sent start stops first (its victims), each until that start has ended (`release`), whichever way
    it ends. A launch is added when its request is dispatched, is `sent` once nothing it stops still serves, and
    leaves when its model is ready or failed, is unloaded or removed, or, not sent yet, when its request leaves."""

    def __init__(self) -> None:
        self._launches: dict[str, Launch] = {}  # by model, in dispatch order
        self._evicting: dict[str, str] = {}  # victim -> the model whose start stops it

    def __iter__(self) -> Iterator[Launch]:
        return iter(self._launches.values())

    def __contains__(self, model: object) -> bool:
        return model in self._launches

    def add(self, launch: Launch) -> None:
        self._launches[launch.model] = launch

    def of(self, model: str) -> Launch | None:
        return self._launches.get(model)

    def for_ticket(self, ticket_id: int) -> Launch | None:
        return next((launch for launch in self._launches.values()
                     if launch.ticket is not None and launch.ticket.id == ticket_id), None)

    def take(self, model: str) -> Launch:
        """`model`'s launch, which leaves (its start ended): there must be one."""
        return self._launches.pop(model)

    def drop(self, model: str) -> Launch | None:
        """`model`'s launch, if any, which leaves."""
        return self._launches.pop(model, None)

    def clear(self) -> None:
        self._launches.clear()

    def sent(self, launch: Launch, victims: frozenset[str]) -> None:
        """`launch`'s StartModel goes out: `victims` stop first, and stay its until `release`."""
        for victim in victims:
            self._evicting[victim] = launch.model
        launch.started = True

    def stopped_for(self, model: str) -> str | None:
        """The model whose start under way stops `model` first."""
        return self._evicting.get(model)

    def release(self, model: str) -> list[str]:
        """`model`'s start has ended: what it stopped first is no longer its. Returns those models."""
        victims = [victim for victim, target in self._evicting.items() if target == model]
        for victim in victims:
            del self._evicting[victim]
        return victims


class Slots:
    """The models' job slots, owned here: which request holds each. A slot is held by a job (granted, until it
    `end`s) or by a launch (taken for a request whose model starts, `free`d when the launch is granted, then
    taken again by its job, or given up). Only these methods change who holds a slot."""

    def __init__(self) -> None:
        self._jobs: dict[int, Job] = {}  # granted and unfinished, in grant order
        self._held: dict[str, dict[int, int]] = {}  # model -> {slot: ticket id} of jobs and launches

    def take(self, model: str, ticket_id: int) -> int:
        """The lowest free slot of `model`, now held by `ticket_id`."""
        slots = self._held.setdefault(model, {})
        slot = next(n for n in range(1, len(slots) + 2) if n not in slots)
        slots[slot] = ticket_id
        return slot

    def free(self, model: str, slot: int) -> None:
        slots = self._held.get(model)
        if slots is not None:
            slots.pop(slot, None)
            if not slots:
                del self._held[model]

    def grant(self, ticket: Ticket, slot: int) -> None:
        """`ticket` runs as a job on `slot` of its model."""
        self._jobs[ticket.id] = Job(ticket, slot)
        self._held.setdefault(ticket.model, {})[slot] = ticket.id

    def end(self, ticket_id: int) -> Job:
        """A job is over: its slot is free."""
        job = self._jobs.pop(ticket_id)
        self.free(job.ticket.model, job.slot)
        return job

    def is_running(self, ticket_id: int) -> bool:
        return ticket_id in self._jobs

    def running(self) -> tuple[int, ...]:
        """The jobs' ticket ids, in grant order."""
        return tuple(self._jobs)

    def used(self, model: str) -> int:
        return len(self._held.get(model, ()))

    def models(self) -> list[str]:
        """The models with a slot held."""
        return list(self._held)

    def by_model(self) -> dict[str, tuple[int, ...]]:
        """Each model with a slot held: the ticket ids holding its slots, in slot order."""
        return {model: tuple(ticket_id for _, ticket_id in sorted(slots.items()))
                for model, slots in sorted(self._held.items()) if slots}


class Round:
    """What one pass over the waiting requests has set aside so far, best request first: the
    models swaps will evict (no new work for them) and the models those swaps will start."""

    def __init__(self) -> None:
        self.reserved: dict[str, tuple[int, str]] = {}  # model -> (ticket id, swap target)
        self.targets: list[tuple[str, int]] = []  # (swap target, ticket id), best first

    def reserve(self, ticket_id: int, target: str, victims: Iterable[str]) -> None:
        for victim in victims:
            self.reserved.setdefault(victim, (ticket_id, target))
        self.targets.append((target, ticket_id))


def reserved_for(ticket_id: int, target: str) -> str:
    """Why a request waits for a better one's swap: "reserved for #4's swap to coder", or to a model its reader
    may not see, "reserved for a swap to another model"."""
    swap = f"#{ticket_id}'s swap to {target}"
    return f"reserved for {named(target, swap, 'a swap to another model')}"
