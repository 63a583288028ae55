"""Where a model goes on the hardware, and which idle models stop, at least cost, when it does not fit.

The operator describes the hardware (`hardware.gpus`, each GPU's memory; optionally the CPU's memory)
and what each model needs on each GPU it uses; placement then decides what runs together, instead of
groups or a matrix listing the combinations. Pure functions of what is loaded now: the scheduler asks
at decision time, as it asks its swap policy.

The cost of stopping a model is the load time it is expected to cost again: its load time, paid again if it
is asked for within the next minute, times the chance that it is, were requests to keep arriving at random at
their recent rate:

    cost = load seconds × (1 − e^−demand),  demand = Σ 2^(priority / 100) over its requests of the last
                                                     10 minutes, per minute

so a model loaded in 40 s and asked for twice a minute at priority 0 costs 40 × (1 − e^−2) = 34.6, one loaded
in 5 s and asked for by one batch request (-100) in ten minutes 5 × (1 − e^−0.05) = 0.24, and one not asked for
in ten minutes nothing. A model in steady demand costs about its load time, however often it is asked for: it
is reloaded once, not once per request. Among the sets of models whose stop makes room, placement takes the
one with the fewest busy models (a busy one is waited for, never cut short), then the least summed cost, then
the fewest models, then the first by name. Pinned and leased models are never in a set: when
only their stop would make room, the request waits and is told which of them blocks it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

DEMAND_WINDOW_S = 600.0
SEARCH_BUDGET = 20_000  # sets one search looks at before taking the best so far (exact below ~14 models searched)


@dataclass(frozen=True)
class Hardware:
    """`hardware:`: each GPU's memory in MiB by id (in the config's order), and the CPU's for models on no
    GPU (None: not counted)."""

    gpus: Mapping[str, int]
    cpu_mib: int | None = None


@dataclass(frozen=True)
class MemoryNeed:
    """What a model takes: `mib` on each of `gpus` GPUs, or of the CPU's memory when `gpus` is 0."""

    mib: int
    gpus: int = 1


@dataclass(frozen=True)
class Resident:
    """A model holding memory now (loaded, starting or stopping), as placement sees it."""

    model: str
    gpus: tuple[str, ...]  # () on the CPU
    mib: int  # on each of its GPUs, or of the CPU's memory
    cost: float = 0.0
    busy: bool = False  # running a job, or starting: waited for, never stopped to make room
    protected: str = ""  # why it may not be stopped to make room ("pinned", "lease #3"), or ""


@dataclass(frozen=True)
class Room:
    """How a model gets its memory: stop `evict`, then start it on `gpus`. With `blocked_by`, it cannot
    start without stopping those protected models: it waits (`evict` and `gpus` are then empty)."""

    evict: frozenset[str] = frozenset()
    gpus: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()
    cost: float = 0.0


def free_memory(hardware: Hardware, residents: Iterable[Resident]) -> tuple[dict[str, int], int | None]:
    """Each GPU's free MiB, and the CPU's (None: not counted), once `residents` have theirs."""
    gpus = dict(hardware.gpus)
    cpu = hardware.cpu_mib
    for resident in residents:
        if resident.gpus:
            for gpu in resident.gpus:
                gpus[gpu] -= resident.mib
        elif cpu is not None:
            cpu -= resident.mib
    return gpus, cpu


def assign(hardware: Hardware, need: MemoryNeed, residents: Iterable[Resident]) -> tuple[str, ...] | None:
    """The GPUs `need` gets beside `residents`: the `need.gpus` with the most free memory that each hold
    `need.mib` (ties in the config's order), sorted in that order; () on the CPU; None when it does not fit."""
    return _assign_free(hardware, need, *free_memory(hardware, residents))


def _assign_free(hardware: Hardware, need: MemoryNeed, gpus: Mapping[str, int], cpu: int | None
                 ) -> tuple[str, ...] | None:
    """`assign`, given each GPU's free memory and the CPU's."""
    if need.gpus == 0:
        return () if cpu is None or cpu >= need.mib else None
    roomy = [gpu for gpu, free in gpus.items() if free >= need.mib]
    if len(roomy) < need.gpus:
        return None
    order = {gpu: index for index, gpu in enumerate(hardware.gpus)}
    roomy.sort(key=lambda gpu: (-gpus[gpu], order[gpu]))
    return tuple(sorted(roomy[:need.gpus], key=order.__getitem__))


def fits_at_all(hardware: Hardware, need: MemoryNeed) -> bool:
    """Whether `need` fits on the empty hardware (else no eviction ever helps: a config error)."""
    return assign(hardware, need, ()) is not None


def make_room(hardware: Hardware, need: MemoryNeed, residents: Iterable[Resident]) -> Room | None:
    """How `need` gets its memory beside `residents` (see the module's docstring); None when it does not fit
    even on the empty hardware."""
    residents = tuple(residents)
    gpus = assign(hardware, need, residents)
    if gpus is not None:
        return Room(gpus=gpus)
    if not fits_at_all(hardware, need):
        return None
    candidates = sorted((r for r in residents if not r.protected), key=lambda r: (r.busy, r.cost, r.model))
    best = _cheapest_set(hardware, need, residents, candidates)
    if best is None:
        protected = [r for r in residents if r.protected]
        blockers = _cheapest_set(hardware, need, residents, candidates + sorted(protected, key=lambda r: r.model))
        named = sorted(r.model for r in protected if blockers is not None and r.model in blockers)
        return Room(blocked_by=tuple(named or sorted(r.model for r in protected)))
    staying = [r for r in residents if r.model not in best]
    return Room(evict=frozenset(best), gpus=assign(hardware, need, staying) or (),
                cost=sum(r.cost for r in residents if r.model in best))


def _cheapest_set(hardware: Hardware, need: MemoryNeed, residents: tuple[Resident, ...],
                  candidates: list[Resident]) -> frozenset[str] | None:
    """The set of `candidates` whose stop lets `need` fit, least by (busy ones, summed cost, size, names).

    Only the models on a GPU free memory there. So when no candidate spans GPUs, each GPU is searched on its own
    (the CPU alone for a CPU model): the sets for different GPUs neither overlap nor interact, and the least set is
    the union of those of the `need.gpus` GPUs whose own sets are least, found looking at a few models at a time.
    A candidate on several GPUs ties them together: then one search over every candidate."""
    gpus, cpu = free_memory(hardware, residents)
    if need.gpus == 0:
        found = _least_set([r for r in candidates if not r.gpus], {None: cpu},
                           lambda free: free[None] is None or free[None] >= need.mib)
        return None if found is None else found[1]
    if all(len(r.gpus) == 1 for r in candidates if r.gpus):
        on: dict[str, list[Resident]] = {gpu: [] for gpu in hardware.gpus}
        for resident in candidates:
            if resident.gpus:
                on[resident.gpus[0]].append(resident)
        per_gpu: list[tuple[tuple, frozenset[str]]] = []  # the least so far, at most `need.gpus` of them
        for gpu in sorted(hardware.gpus, key=lambda gpu: -gpus[gpu]):  # the roomiest first: a low bound early
            bound = per_gpu[-1][0] if len(per_gpu) == need.gpus else None  # a GPU must beat the last one kept
            found = _least_set(on[gpu], {gpu: gpus[gpu]}, lambda free: min(free.values()) >= need.mib, bound)
            if found is not None:
                per_gpu = sorted([*per_gpu, found])[:need.gpus]
        return frozenset().union(*(chosen for _, chosen in per_gpu)) if len(per_gpu) == need.gpus else None
    found = _least_set(candidates, dict(gpus), lambda free: sum(f >= need.mib for f in free.values()) >= need.gpus)
    return None if found is None else found[1]


def _least_set(candidates: list[Resident], free: dict[str | None, int | None], fits: Callable[[dict], bool],
               bound: tuple | None = None) -> tuple[tuple, frozenset[str]] | None:
    """The least set of `candidates` by (busy ones, summed cost, size, names) whose stop makes `fits(free)` true, with
    that key (None: none, or none below `bound`); `free` is what each GPU (None: the CPU) has free, as the search
    stops candidates. Depth-first, a branch
    left once it cannot beat the best found. The candidates come least (busy, cost) first, so once adding one makes
    a set worse than the best, adding any later one would too: the rest of that branch's candidates are skipped."""
    best: list = [bound, None]  # (busy, cost, size, names), set
    budget = [SEARCH_BUDGET]

    def release(resident: Resident, sign: int) -> None:
        for place in resident.gpus or (None,):
            if free.get(place) is not None:
                free[place] += sign * resident.mib

    def beats(busy: int, cost: float, chosen: list[Resident]) -> bool:
        if best[0] is None or (busy, cost) < best[0][:2]:
            return True
        return (busy, cost) == best[0][:2] and (len(chosen), tuple(sorted(r.model for r in chosen))) < best[0][2:]

    def visit(start: int, chosen: list[Resident], busy: int, cost: float) -> None:
        budget[0] -= 1
        if fits(free):
            names = tuple(sorted(r.model for r in chosen))
            best[0], best[1] = (busy, cost, len(names), names), frozenset(names)
            return  # adding more only costs more
        for index in range(start, len(candidates)):
            if budget[0] <= 0:
                return
            resident = candidates[index]
            more_busy, more_cost = busy + resident.busy, cost + resident.cost
            chosen.append(resident)
            if not beats(more_busy, more_cost, chosen):
                chosen.pop()
                if best[0] is not None and (more_busy, more_cost) > best[0][:2]:
                    return  # every later candidate costs at least as much
                continue
            release(resident, +1)
            visit(index + 1, chosen, more_busy, more_cost)
            chosen.pop()
            release(resident, -1)

    visit(0, [], 0, 0.0)
    return None if best[1] is None else (best[0], best[1])


@dataclass
class Demand:
    """Each model's recent requests, for its cost: (arrival, weight) within `DEMAND_WINDOW_S`."""

    _seen: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def arrived(self, model: str, priority: int, now: float) -> None:
        seen = self._seen.setdefault(model, deque())
        seen.append((now, 2.0 ** (max(-1000, min(1000, priority)) / 100)))
        self._forget(seen, now)

    def per_minute(self, model: str, now: float) -> float:
        seen = self._seen.get(model, deque())
        self._forget(seen, now)
        return sum(weight for _, weight in seen) * 60.0 / DEMAND_WINDOW_S

    @staticmethod
    def _forget(seen: deque[tuple[float, float]], now: float) -> None:
        while seen and seen[0][0] <= now - DEMAND_WINDOW_S:
            seen.popleft()


def eviction_cost(load_s: float, demand_per_minute: float) -> float:
    """The module docstring's formula."""
    return load_s * (1.0 - math.exp(-demand_per_minute))
