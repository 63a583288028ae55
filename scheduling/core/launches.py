"""What the serial scheduler keeps between its calls: each model start under way with the request it is
for, each job on a slot, and what one dispatch pass has set aside for the swaps of better requests."""

from __future__ import annotations

from collections.abc import Iterable
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
