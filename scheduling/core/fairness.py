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
banks turns while away nor waits behind another key's backlog. A request that leaves without its turn
(its client gone, refused, re-ranked) gives its turn back: its key's later requests move up into it, and
its key's end moves back, so a key is charged only for the turns it took. Starts are exact fractions, so
equal turns tie exactly and keep arrival order. An emptied group forgets its clock: nothing waits to owe.

A key's waiting requests follow one another in virtual time, so each group keeps, per key, only where
the first of them starts, and a heap of those firsts: a request coming, leaving or served costs a
logarithm of the keys waiting, however many requests of one key leave together.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from fractions import Fraction

from .ticket import Ticket

FAIRNESS_MODES = ("off", "keys")

# A key's first waiting request: (virtual start, arrival, ticket id); lower goes first.
_Turn = tuple[Fraction, float, int]


def fairness_problem(value: object) -> str | None:
    """What is wrong with `value` as the `fairness` setting, or None."""
    if value in FAIRNESS_MODES:
        return None
    return f"{value!r} is not a fairness mode — use keys (API keys take turns) or off (arrival order)"


@dataclass
class _KeyTurns:
    """One key's waiting requests in a group, in turn order: the first starts at `start`, each next one where
    the one before it ends (1 / weight later)."""

    start: Fraction
    tickets: OrderedDict[int, Ticket] = field(default_factory=OrderedDict)


@dataclass
class _Group:
    """Requests for one model at one priority."""

    clock: Fraction = Fraction(0)
    ends: dict[str | None, Fraction] = field(default_factory=dict)  # key -> virtual end of its last request
    keys: dict[str | None, _KeyTurns] = field(default_factory=dict)  # the keys with requests waiting
    firsts: list[_Turn] = field(default_factory=list)  # heap of each key's first, with former firsts left behind
    key_of: dict[int, str | None] = field(default_factory=dict)  # waiting ticket id -> its key

    def is_first(self, turn: _Turn) -> bool:
        """Whether `turn` is still its key's first waiting request, starting where it says."""
        start, _, ticket_id = turn
        if ticket_id not in self.key_of:
            return False
        turns = self.keys[self.key_of[ticket_id]]
        return turns.start == start and next(iter(turns.tickets)) == ticket_id

    def push_first(self, turns: _KeyTurns) -> None:
        first = next(iter(turns.tickets.values()))
        heapq.heappush(self.firsts, (turns.start, first.arrival, first.id))


def group_of(ticket: Ticket) -> tuple[str, int]:
    """The requests `ticket` is equal to apart from arrival."""
    return ticket.model, ticket.priority


class FairShare:
    """The turns of every group with requests waiting; tickets are told here as they come and go."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, int], _Group] = {}

    def add(self, ticket: Ticket) -> None:
        group = self._groups.setdefault(group_of(ticket), _Group())
        turns = group.keys.get(ticket.key)
        if turns is None:  # nothing of its key waits: it starts at the clock, or where its last turn ended
            start = max(group.clock, group.ends.get(ticket.key, group.clock))
            turns = group.keys[ticket.key] = _KeyTurns(start)
            group.ends[ticket.key] = start
        turns.tickets[ticket.id] = ticket
        group.ends[ticket.key] += Fraction(1, ticket.weight)
        group.key_of[ticket.id] = ticket.key
        if len(turns.tickets) == 1:
            group.push_first(turns)

    def remove(self, ticket: Ticket) -> None:
        """`ticket` left its group without a turn (cancelled, refused, or re-ranked): it gives its turn back."""
        group = self._groups.get(group_of(ticket))
        if group is None or ticket.id not in group.key_of:
            return
        group.ends[ticket.key] -= Fraction(1, ticket.weight)
        self._leave(group, ticket)

    def served(self, ticket: Ticket) -> None:
        """`ticket`, its key's first, took its turn: the group's clock moves to its start, and the key's next
        request starts where it ends."""
        group = self._groups.get(group_of(ticket))
        if group is None or ticket.id not in group.key_of:
            return
        turns = group.keys[ticket.key]
        assert next(iter(turns.tickets)) == ticket.id, "a key's requests take their turns in order"
        group.clock = max(group.clock, turns.start)
        turns.start += Fraction(1, ticket.weight)
        self._leave(group, ticket)

    def _leave(self, group: _Group, ticket: Ticket) -> None:
        """Take `ticket` out of `group`; a key, or a group, with nothing left waiting is forgotten."""
        del group.key_of[ticket.id]
        turns = group.keys[ticket.key]
        was_first = next(iter(turns.tickets)) == ticket.id
        del turns.tickets[ticket.id]
        if not turns.tickets:
            del group.keys[ticket.key]
            if not group.keys:
                del self._groups[group_of(ticket)]
        elif was_first:
            group.push_first(turns)

    def next_in(self, ticket: Ticket) -> int:
        """Id of the request whose turn it is in `ticket`'s group (`ticket` itself if it is not tracked)."""
        group = self._groups.get(group_of(ticket))
        if group is None:
            return ticket.id
        firsts = group.firsts
        while firsts and not group.is_first(firsts[0]):
            heapq.heappop(firsts)
        return firsts[0][2] if firsts else ticket.id
