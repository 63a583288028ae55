"""The requests waiting for a slot in the serial scheduler, with what is known of each while it waits: its place
(the queue's ranking), its turn among other keys' requests when `fairness: keys` is on (see `fairness`), and why
it was last held back while work ran."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from .decision import Decision
from .fairness import FairShare
from .mentions import of_key
from .queue import Pick, WaitQueue
from .settings import SerialSettings
from .ticket import Ticket


class WaitingRequests:
    """What waits, owned here: only these methods add, remove or re-rank a waiting request. `queue` is for
    reading (picks, tops, ranks, depths). Fair share, while on, tracks exactly the requests in the queue; a
    reason it was held back is kept for a request only while it waits."""

    def __init__(self, aging_divisor: float, fairness: str) -> None:
        self.queue = WaitQueue(aging_divisor)
        self._fair: FairShare | None = FairShare() if fairness == "keys" else None
        self._held_back: dict[int, str] = {}  # why a waiting request was last held back while work ran

    def add(self, ticket: Ticket) -> None:
        self.queue.add(ticket)
        if self._fair is not None:
            self._fair.add(ticket)

    def remove(self, ticket_id: int) -> Ticket | None:
        """Take a request out (dispatched, cancelled, refused); None if it was not waiting."""
        ticket = self.queue.remove(ticket_id)
        if ticket is not None:
            self._held_back.pop(ticket_id, None)
            if self._fair is not None:
                self._fair.remove(ticket)
        return ticket

    def remove_all(self) -> list[Ticket]:
        """Take every request out (the scheduler shuts down)."""
        tickets = self.queue.remove_all()
        for ticket in tickets if self._fair is not None else ():
            self._fair.remove(ticket)
        self._held_back.clear()
        return tickets

    def reprioritize(self, ticket_id: int, priority: int) -> Ticket | None:
        """Re-rank a waiting request (it keeps its arrival); None if it was not waiting. Re-ranked, it joins
        its new group in fair share."""
        before = self.queue.get(ticket_id)
        after = self.queue.reprioritize(ticket_id, priority)
        if after is not None and self._fair is not None:
            self._fair.remove(before)
            self._fair.add(after)
        return after

    def retune(self, settings: SerialSettings) -> None:
        """Adopt edited settings: aging, and fair share on or off; turned on, the requests waiting take turns
        as if they had just arrived, in the order they did."""
        if (settings.fairness == "keys") != (self._fair is not None):
            self._fair = FairShare() if settings.fairness == "keys" else None
            for ticket in self.queue.in_arrival_order() if self._fair is not None else ():
                self._fair.add(ticket)
        self.queue.retune(settings.aging_divisor)

    def hold_back(self, ticket_id: int, reason: str) -> None:
        self._held_back[ticket_id] = reason

    def held_back_because(self, ticket_id: int) -> str:
        return self._held_back.get(ticket_id, "")

    def take_turn(self, head: Ticket) -> Ticket:
        """The request to send in place of `head`, the best waiting one: `head` itself, or with fair
        share on the one whose turn it is among those equal to it apart from arrival."""
        if self._fair is None:
            return head
        turn = self.queue.get(self._fair.next_in(head))
        assert turn is not None, "fair share tracks exactly the waiting requests"
        self._fair.served(turn)
        return turn

    def turn_decision(self, decision: Decision, ticket: Ticket, head: Ticket, pick: Pick, now: float,
                      loaded: Collection[str], settings: SerialSettings) -> Decision:
        """`decision` for `ticket`, sent by its turn in place of `head` (whose `pick` it is): its own
        score, with `head` as the one it went ahead of."""
        terms = self.queue.terms(ticket, now, loaded, settings)
        return dataclasses.replace(
            decision, score=terms.total, terms=terms, runner_up_id=head.id, runner_up_score=pick.score,
            fair_turn=(f"#{ticket.id} ({_key_named(ticket.key)}) had its turn before #{head.id} "
                       f"({_key_named(head.key)}), which arrived earlier at the same priority for the same model"),
        )


def _key_named(key: str | None) -> str:
    """Whose a request is, as a mention: its key's name only to a reader who may see it (that key, an operator)."""
    return "without a key row" if key is None else of_key(key, f"of key {key!r}", "of another key")
