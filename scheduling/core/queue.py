"""The serial scheduler's waiting room: best request first, in O(log n).

Every waiting request ages at the same rate, so the order by
`priority + waited / divisor` never changes while requests wait; it equals the
order by the fixed key `priority * divisor - arrival`. Multiplying instead of
dividing keeps equal scores exactly equal in floating point. Swap affinity
depends on which models are loaded at pick time, so it is added then, on the
top of each loaded model's own heap (there are only a handful of those).

Removal is lazy: a removed request's heap entries stay behind until they reach
the top or the heaps are compacted, and the per-ticket sequence number tells
live entries from stale ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection
from dataclasses import dataclass, replace

from .decision import ScoreTerms
from .priority import Band, band_of
from .settings import SerialSettings
from .ticket import Ticket

# (order key, arrival, ticket id, sequence): lower sorts first, ties go to the earlier arrival,
# then the lower id. The sequence identifies the entry's generation for lazy deletion.
_Entry = tuple[float, float, int, int]
# (score in key units, -arrival, -id): higher is better.
Rank = tuple[float, float, int]

# Compact once stale entries outnumber live ones by this many; amortised O(1) per removal.
_COMPACTION_SLACK = 64


@dataclass(frozen=True)
class Pick:
    """The best waiting request right now, the one that would have gone next, and which score
    terms made the difference."""

    ticket: Ticket
    terms: ScoreTerms
    runner_up: Ticket | None
    runner_up_score: float | None
    changed_by_aging: bool
    changed_by_affinity: bool

    @property
    def score(self) -> float:
        return self.terms.total


class WaitQueue:
    def __init__(self, aging_divisor: float = 60.0) -> None:
        self._divisor = aging_divisor
        self._tickets: dict[int, Ticket] = {}
        self._generation: dict[int, int] = {}
        self._sequence = itertools.count()
        # Full order (priority + aging), overall and per model.
        self._aged: list[_Entry] = []
        self._aged_by_model: dict[str, list[_Entry]] = {}
        # Order with aging removed (priority, then arrival), to tell whether aging changed a pick.
        self._plain: list[_Entry] = []
        self._plain_by_model: dict[str, list[_Entry]] = {}
        # Oldest arrival per band, keyed by arrival.
        self._by_arrival_in_band: dict[Band, list[_Entry]] = {band: [] for band in Band}
        self._depth_by_band: dict[Band, int] = {band: 0 for band in Band}
        self._stale = 0

    def __len__(self) -> int:
        return len(self._tickets)

    def __contains__(self, ticket_id: object) -> bool:
        return ticket_id in self._tickets

    def get(self, ticket_id: int) -> Ticket | None:
        return self._tickets.get(ticket_id)

    # -- membership ---------------------------------------------------------------------------

    def add(self, ticket: Ticket) -> None:
        if ticket.id in self._tickets:
            raise ValueError(f"ticket #{ticket.id} is already waiting; ticket ids must be unique")
        generation = next(self._sequence)
        self._tickets[ticket.id] = ticket
        self._generation[ticket.id] = generation
        self._depth_by_band[band_of(ticket.priority)] += 1
        self._push(ticket, generation)

    def remove(self, ticket_id: int) -> Ticket | None:
        """Take a request out of the queue; None if it was not waiting."""
        ticket = self._tickets.pop(ticket_id, None)
        if ticket is None:
            return None
        del self._generation[ticket_id]
        self._depth_by_band[band_of(ticket.priority)] -= 1
        self._stale += 1
        if self._stale > len(self._tickets) + _COMPACTION_SLACK:
            self._rebuild()
        return ticket

    def in_arrival_order(self) -> list[Ticket]:
        """What is waiting, earliest arrival first."""
        return sorted(self._tickets.values(), key=lambda t: (t.arrival, t.id))

    def remove_all(self) -> list[Ticket]:
        """Empty the queue, returning what was waiting in arrival order."""
        tickets = self.in_arrival_order()
        self._tickets.clear()
        self._generation.clear()
        self._depth_by_band = {band: 0 for band in Band}
        self._rebuild()
        return tickets

    def reprioritize(self, ticket_id: int, priority: int) -> Ticket | None:
        """Give a waiting request a new priority; it keeps its arrival, so aging continues."""
        ticket = self.remove(ticket_id)
        if ticket is None:
            return None
        updated = replace(ticket, priority=priority)
        self.add(updated)
        return updated

    def tickets_for(self, model: str) -> list[Ticket]:
        """Requests waiting for `model`, best first (ignoring affinity, which they share)."""
        entries = sorted(entry for entry in self._aged_by_model.get(model, ()) if self._is_live(entry))
        return [self._tickets[entry[2]] for entry in entries]

    def retune(self, aging_divisor: float) -> None:
        """Adopt a new aging divisor; the fixed keys depend on it, so the heaps are rebuilt."""
        if aging_divisor != self._divisor:
            self._divisor = aging_divisor
            self._rebuild()

    # -- choosing -----------------------------------------------------------------------------

    def pick(self, now: float, loaded: Collection[str], settings: SerialSettings) -> Pick | None:
        """The request to dispatch next; None when nothing waits. Does not remove it."""
        self.retune(settings.aging_divisor)
        if not self._tickets:
            return None
        loaded = frozenset(loaded)
        bonus = settings.swap_affinity_bonus
        bonus_in_key_units = bonus * self._divisor if self._divisor > 0 else bonus

        # The best two by full score are among the best two overall and the best two of each
        # loaded model: any other request is beaten by two of those.
        overall_top = self._top_two(self._aged)
        candidates = {entry[2]: self._rank(entry, loaded, bonus_in_key_units) for entry in overall_top}
        for model in loaded:
            for entry in self._top_two(self._aged_by_model.get(model, [])):
                candidates[entry[2]] = self._rank(entry, loaded, bonus_in_key_units)
        best_two = sorted(candidates, key=candidates.__getitem__, reverse=True)[:2]
        winner = self._tickets[best_two[0]]
        runner_up = self._tickets[best_two[1]] if len(best_two) > 1 else None
        return Pick(
            ticket=winner,
            terms=self.terms(winner, now, loaded, settings),
            runner_up=runner_up,
            runner_up_score=None if runner_up is None else self.terms(runner_up, now, loaded, settings).total,
            changed_by_aging=self._best_without_aging(loaded, bonus) != winner.id,
            changed_by_affinity=overall_top[0][2] != winner.id,
        )

    def model_tops(self, loaded: Collection[str], settings: SerialSettings) -> list[tuple[Rank, Ticket]]:
        """The best waiting request of each model with its rank (higher is better: score with
        affinity, then earlier arrival, then lower id), best first. Within a model the order never
        changes, so the next request of a model only matters once its top one has gone.
        O(models) per call."""
        loaded = frozenset(loaded)
        ranked = [top for model in list(self._aged_by_model) if (top := self.model_top(model, loaded, settings))]
        ranked.sort(key=lambda pair: pair[0], reverse=True)
        return ranked

    def model_top(self, model: str, loaded: Collection[str], settings: SerialSettings) -> tuple[Rank, Ticket] | None:
        """The best waiting request for `model` and its rank, as in `model_tops`; None if none waits."""
        self.retune(settings.aging_divisor)
        heap = self._aged_by_model.get(model)
        if heap is None:
            return None
        self._drop_stale_top(heap)
        if not heap:
            del self._aged_by_model[model]
            return None
        bonus = settings.swap_affinity_bonus
        bonus_in_key_units = bonus * self._divisor if self._divisor > 0 else bonus
        return self._rank(heap[0], loaded, bonus_in_key_units), self._tickets[heap[0][2]]

    def pick_within(self, model: str, now: float, loaded: Collection[str], settings: SerialSettings) -> Pick | None:
        """Like `pick`, but among the requests for `model` only: the competition for one of its
        slots, where affinity is the same for all."""
        self.retune(settings.aging_divisor)
        top = self._top_two(self._aged_by_model.get(model, []))
        if not top:
            return None
        loaded = frozenset(loaded)
        winner = self._tickets[top[0][2]]
        runner_up = self._tickets[top[1][2]] if len(top) > 1 else None
        plain = self._plain_by_model.get(model, [])
        self._drop_stale_top(plain)
        return Pick(
            ticket=winner,
            terms=self.terms(winner, now, loaded, settings),
            runner_up=runner_up,
            runner_up_score=None if runner_up is None else self.terms(runner_up, now, loaded, settings).total,
            changed_by_aging=bool(plain) and plain[0][2] != winner.id,
            changed_by_affinity=False,
        )

    def terms(self, ticket: Ticket, now: float, loaded: Collection[str], settings: SerialSettings) -> ScoreTerms:
        """A request's score right now, split into its three terms."""
        divisor = settings.aging_divisor
        return ScoreTerms(
            priority=ticket.priority,
            affinity=settings.swap_affinity_bonus if ticket.model in loaded else 0,
            aging=(now - ticket.arrival) / divisor if divisor > 0 else 0.0,
        )

    def ranked(self, now: float, loaded: Collection[str], settings: SerialSettings) -> list[tuple[Ticket, ScoreTerms]]:
        """Every waiting request, best first, with its score terms. O(n log n): for display only."""
        self.retune(settings.aging_divisor)
        loaded = frozenset(loaded)
        bonus = settings.swap_affinity_bonus
        bonus_in_key_units = bonus * self._divisor if self._divisor > 0 else bonus
        order = sorted(
            self._tickets.values(),
            key=lambda t: self._rank(self._aged_entry(t, 0), loaded, bonus_in_key_units),
            reverse=True,
        )
        return [(ticket, self.terms(ticket, now, loaded, settings)) for ticket in order]

    # -- metrics ------------------------------------------------------------------------------

    def band_depths(self) -> dict[Band, int]:
        return dict(self._depth_by_band)

    def band_oldest_arrival(self) -> dict[Band, float | None]:
        oldest: dict[Band, float | None] = {}
        for band, heap in self._by_arrival_in_band.items():
            self._drop_stale_top(heap)
            oldest[band] = heap[0][1] if heap else None
        return oldest

    # -- internals ----------------------------------------------------------------------------

    def _aged_entry(self, ticket: Ticket, generation: int) -> _Entry:
        if self._divisor > 0:
            key = ticket.arrival - ticket.priority * self._divisor
        else:
            key = -ticket.priority
        return (key, ticket.arrival, ticket.id, generation)

    def _push(self, ticket: Ticket, generation: int) -> None:
        aged = self._aged_entry(ticket, generation)
        plain = (-ticket.priority, ticket.arrival, ticket.id, generation)
        heapq.heappush(self._aged, aged)
        heapq.heappush(self._aged_by_model.setdefault(ticket.model, []), aged)
        heapq.heappush(self._plain, plain)
        heapq.heappush(self._plain_by_model.setdefault(ticket.model, []), plain)
        heapq.heappush(
            self._by_arrival_in_band[band_of(ticket.priority)],
            (ticket.arrival, ticket.arrival, ticket.id, generation),
        )

    def _rebuild(self) -> None:
        """Rebuild every heap from the live requests: drops stale entries, applies the divisor."""
        self._aged, self._plain = [], []
        self._aged_by_model, self._plain_by_model = {}, {}
        self._by_arrival_in_band = {band: [] for band in Band}
        for ticket in self._tickets.values():
            generation = self._generation[ticket.id]
            aged = self._aged_entry(ticket, generation)
            plain = (-ticket.priority, ticket.arrival, ticket.id, generation)
            self._aged.append(aged)
            self._aged_by_model.setdefault(ticket.model, []).append(aged)
            self._plain.append(plain)
            self._plain_by_model.setdefault(ticket.model, []).append(plain)
            self._by_arrival_in_band[band_of(ticket.priority)].append(
                (ticket.arrival, ticket.arrival, ticket.id, generation)
            )
        for heap in itertools.chain(
            (self._aged, self._plain),
            self._aged_by_model.values(),
            self._plain_by_model.values(),
            self._by_arrival_in_band.values(),
        ):
            heapq.heapify(heap)
        self._stale = 0

    def _is_live(self, entry: _Entry) -> bool:
        return self._generation.get(entry[2]) == entry[3]

    def _drop_stale_top(self, heap: list[_Entry]) -> None:
        generation = self._generation
        while heap and generation.get(heap[0][2]) != heap[0][3]:
            heapq.heappop(heap)

    def _top_two(self, heap: list[_Entry]) -> list[_Entry]:
        self._drop_stale_top(heap)
        if not heap:
            return []
        first = heapq.heappop(heap)
        self._drop_stale_top(heap)
        top = [first, *heap[:1]]
        heapq.heappush(heap, first)
        return top

    def _rank(self, entry: _Entry, loaded: frozenset[str], bonus: float) -> Rank:
        """Higher is better: the entry's key as a score, plus `bonus` when its model is loaded."""
        affinity = bonus if self._tickets[entry[2]].model in loaded else 0
        return (affinity - entry[0], -entry[1], -entry[2])

    def _best_without_aging(self, loaded: frozenset[str], bonus: float) -> int:
        """Id of the request that priority + affinity alone would pick."""
        best: tuple[Rank, int] | None = None
        for heap in (self._plain, *(self._plain_by_model.get(model, []) for model in loaded)):
            self._drop_stale_top(heap)
            if heap:
                candidate = (self._rank(heap[0], loaded, bonus), heap[0][2])
                if best is None or candidate > best:
                    best = candidate
        assert best is not None, "called on an empty queue"
        return best[1]
