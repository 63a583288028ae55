"""Fair share between API keys (`fairness: keys`): which of several equal requests goes first.

Requests are equal apart from arrival when they ask for the same model at the same priority: their
priority and swap affinity are the same, and aging, which grows with the wait alone, only restates
their arrival order. Such a group keeps its place among all waiting requests by its oldest request,
exactly as without fairness; when the group's turn comes, the keys in it take turns instead of the
oldest going first.

The turns are start-time fair queueing, per group. The group has a virtual clock; each key in it the
virtual time its last queued request ends. A request arriving starts at the later of the two and
moves its key's end on by 1 / weight; the lowest start goes first (then the earlier arrival, then the
lower id), and the clock moves to it. A key that had nothing waiting starts at the clock: it neither
banks turns while away nor waits behind another key's backlog. Starts are exact fractions, so equal
turns tie exactly and keep arrival order. An emptied group forgets its clock: nothing waits to owe.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from fractions import Fraction

from .ticket import Ticket

FAIRNESS_MODES = ("off", "keys")

# (virtual start, arrival, ticket id): lower goes first.
_Turn = tuple[Fraction, float, int]


def fairness_problem(value: object) -> str | None:
    """What is wrong with `value` as the `fairness` setting, or None."""
    if value in FAIRNESS_MODES:
        return None
    return f"{value!r} is not a fairness mode — use keys (API keys take turns) or off (arrival order)"


@dataclass
class _Group:
    """Requests for one model at one priority."""

    clock: Fraction = Fraction(0)
    ends: dict[str | None, Fraction] = field(default_factory=dict)  # key -> virtual end of its last request
    turns: list[_Turn] = field(default_factory=list)  # heap, with entries of departed requests left behind
    waiting: dict[int, Fraction] = field(default_factory=dict)  # ticket id -> its virtual start


def group_of(ticket: Ticket) -> tuple[str, int]:
    """The requests `ticket` is equal to apart from arrival."""
    return ticket.model, ticket.priority


class FairShare:
    """The turns of every group with requests waiting; tickets are told here as they come and go."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, int], _Group] = {}

    def add(self, ticket: Ticket) -> None:
        group = self._groups.setdefault(group_of(ticket), _Group())
        start = max(group.clock, group.ends.get(ticket.key, group.clock))
        group.ends[ticket.key] = start + Fraction(1, ticket.weight)
        group.waiting[ticket.id] = start
        heapq.heappush(group.turns, (start, ticket.arrival, ticket.id))

    def remove(self, ticket: Ticket) -> None:
        """`ticket` left its group without a turn (cancelled, refused, or re-ranked)."""
        group = self._groups.get(group_of(ticket))
        if group is None or group.waiting.pop(ticket.id, None) is None:
            return
        if not group.waiting:
            del self._groups[group_of(ticket)]

    def served(self, ticket: Ticket) -> None:
        """`ticket` took its turn: the group's clock moves to its start."""
        group = self._groups.get(group_of(ticket))
        if group is not None and ticket.id in group.waiting:
            group.clock = max(group.clock, group.waiting[ticket.id])
        self.remove(ticket)

    def next_in(self, ticket: Ticket) -> int:
        """Id of the request whose turn it is in `ticket`'s group (`ticket` itself if it is not tracked)."""
        group = self._groups.get(group_of(ticket))
        if group is None:
            return ticket.id
        turns = group.turns
        while turns and group.waiting.get(turns[0][2]) != turns[0][0]:
            heapq.heappop(turns)
        return turns[0][2] if turns else ticket.id
