"""How the serial scheduler shares a slot among API keys when `fairness: keys` is on (see `fairness`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from .decision import Decision
from .fairness import FairShare
from .mentions import of_key
from .queue import Pick
from .ticket import Ticket


class SerialFairness:
    """Part of `SerialScheduler` (its `_fair` is a `FairShare`, or None with fairness off)."""

    def _adopt_fairness(self, fairness: str) -> None:
        """Turn fair share on or off; turned on, the requests waiting take turns as if they had just
        arrived, in the order they did."""
        if (fairness == "keys") == (self._fair is not None):
            return
        self._fair = FairShare() if fairness == "keys" else None
        for ticket in self._queue.in_arrival_order() if self._fair is not None else ():
            self._fair.add(ticket)

    def _fair_requeued(self, left: Ticket | None, came: Ticket | None) -> None:
        """A request `left` the queue, or `came` to it, or both (re-ranked: it joins its new group)."""
        if self._fair is not None:
            if left is not None:
                self._fair.remove(left)
            if came is not None:
                self._fair.add(came)

    def _take_turn(self, head: Ticket) -> Ticket:
        """The request to send in place of `head`, the best waiting one: `head` itself, or with fair
        share on the one whose turn it is among those equal to it apart from arrival."""
        if self._fair is None:
            return head
        turn = self._queue.get(self._fair.next_in(head))
        assert turn is not None, "fair share tracks exactly the waiting requests"
        self._fair.served(turn)
        return turn

    def _turn_decision(self, decision: Decision, ticket: Ticket, head: Ticket, pick: Pick, now: float,
                       loaded: Collection[str]) -> Decision:
        """`decision` for `ticket`, sent by its turn in place of `head` (whose `pick` it is): its own
        score, with `head` as the one it went ahead of."""
        terms = self._queue.terms(ticket, now, loaded, self._settings)
        return dataclasses.replace(
            decision, score=terms.total, terms=terms, runner_up_id=head.id, runner_up_score=pick.score,
            fair_turn=(f"#{ticket.id} ({_key_named(ticket.key)}) had its turn before #{head.id} "
                       f"({_key_named(head.key)}), which arrived earlier at the same priority for the same model"),
        )


def _key_named(key: str | None) -> str:
    """Whose a request is, as a mention: its key's name only to a reader who may see it (that key, an operator)."""
    return "without a key row" if key is None else of_key(key, f"of key {key!r}", "of another key")
