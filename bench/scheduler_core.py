"""Per-operation cost of the serial scheduler core with many requests waiting.

Mixed bands and priorities over four models: m1 is a persistent resident model
(its own non-exclusive group, never evicted) and m2..m4 swap among themselves,
m2 with two job slots. Up to three jobs run at once (m1's, and m2's two or one
on m3/m4), so a dispatch walks busy models and swap reservations as it does in
service. Prints microseconds per enqueue (submit while jobs run), per dispatch
(one running job finishes -> pick -> grant, including the model start when the
pick needs one) and per cancel of a queued request, each operation timed on its
own, then how many jobs were running when each dispatch began. Run from the
repository root: `python bench/scheduler_core.py`.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Stats, machine, stats  # noqa: E402
from scheduling.core import (  # noqa: E402
    Grant,
    ModelSpec,
    SerialScheduler,
    SerialSettings,
    StartModel,
    SwapGroup,
    SwapPolicy,
    Ticket,
)

MODELS = ("m1", "m2", "m3", "m4")
SLOTS = {"m2": 2}
PRIORITIES = (100, 101, 102, 0, 0, 0, 1, 2, -100, -100, -99, -98)
SIZES = (10, 1_000, 10_000, 100_000)
TIMED_OPERATIONS = 2_000
TARGET_US = 50.0
TARGET_WAITING = 10_000


class Bench:
    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        resident = SwapGroup("resident", ("m1",), swap=False, exclusive=False, persistent=True)
        policy = SwapPolicy([resident], MODELS)
        settings = SerialSettings(slots=SLOTS)
        self.scheduler = SerialScheduler({m: ModelSpec(m) for m in MODELS}, policy, settings)
        self.now = 0.0
        self.next_id = 1
        self.queued: list[int] = []
        self.running: dict[int, str] = {}  # granted and unfinished: ticket id -> model, in grant order
        self.jobs_at_dispatch: list[int] = []  # jobs running when each timed dispatch began
        for model in ("m1", "m2", "m2"):  # a job on every slot of m1 and m2
            self.run_effects(self.scheduler.submit(self.ticket(model), self.now))
        assert sorted(self.running.values()) == ["m1", "m2", "m2"], self.running

    def ticket(self, model: str | None = None) -> Ticket:
        self.now += 0.01
        ticket = Ticket(
            self.next_id, model or self.random.choice(MODELS), self.random.choice(PRIORITIES), self.now
        )
        self.next_id += 1
        return ticket

    def run_effects(self, effects) -> None:
        """Play the runtime: models start instantly, a grant becomes a running job."""
        while effects:
            effect, *effects = effects
            if isinstance(effect, StartModel):
                effects += self.scheduler.model_ready(effect.model, self.now)
            elif isinstance(effect, Grant):
                self.running[effect.ticket_id] = effect.model

    def enqueue(self) -> float:
        ticket = self.ticket()
        start = time.perf_counter()
        self.run_effects(self.scheduler.submit(ticket, self.now))
        elapsed = time.perf_counter() - start
        if ticket.id not in self.running:  # a free slot may take it at once
            self.queued.append(ticket.id)
        return elapsed

    def dispatch(self) -> float:
        """One running job, chosen at random, ends; whatever that frees is handed out."""
        assert self.running, "nothing runs although requests wait"
        self.jobs_at_dispatch.append(len(self.running))
        ticket_id = self.random.choice(list(self.running))
        del self.running[ticket_id]
        self.now += 0.01
        start = time.perf_counter()
        self.run_effects(self.scheduler.finished(ticket_id, self.now))
        elapsed = time.perf_counter() - start
        self.enqueue()  # keep the queue at its size
        return elapsed

    def cancel(self) -> float:
        index = self.random.randrange(len(self.queued))
        self.queued[index], self.queued[-1] = self.queued[-1], self.queued[index]
        ticket_id = self.queued.pop()
        start = time.perf_counter()
        self.run_effects(self.scheduler.cancel(ticket_id, self.now))
        elapsed = time.perf_counter() - start
        self.enqueue()
        return elapsed


@dataclass(frozen=True)
class CoreCost:
    """Microseconds per operation with `waiting` requests queued."""

    waiting: int
    enqueue: Stats
    dispatch: Stats
    cancel: Stats
    jobs: float  # mean jobs running when a timed dispatch began


def measure(size: int) -> CoreCost:
    bench = Bench(seed=size)
    enqueue = [bench.enqueue() for _ in range(size)]
    operations = min(size, TIMED_OPERATIONS)
    dispatch = [bench.dispatch() for _ in range(operations)]
    bench.queued = [t.id for t, _ in bench.scheduler.ranked(bench.now)]
    cancel = [bench.cancel() for _ in range(operations)]
    costs = (stats([s * 1e6 for s in samples]) for samples in (enqueue, dispatch, cancel))
    return CoreCost(size, *costs, statistics.fmean(bench.jobs_at_dispatch))


def verdict(costs: list[CoreCost]) -> str:
    """The target applies to a dispatch decision's median cost at 10 000 waiting."""
    at_target = next((c for c in costs if c.waiting == TARGET_WAITING), None)
    if at_target is None:
        return f"(not measured at {TARGET_WAITING:,} waiting)"
    met = at_target.dispatch.p50 <= TARGET_US
    return f"dispatch p50 ≤ {TARGET_US:g} µs at {TARGET_WAITING:,} waiting: {'met' if met else 'MISSED'}"


HEADER = ("| waiting | enqueue µs p50 | p99 | dispatch µs p50 | p99 | mean | cancel µs p50 | p99 |\n"
          "|--:|--:|--:|--:|--:|--:|--:|--:|")


def row(cost: CoreCost) -> str:
    cells = [f"{cost.waiting:,}", f"{cost.enqueue.p50:.1f}", f"{cost.enqueue.p99:.1f}",
             f"{cost.dispatch.p50:.1f}", f"{cost.dispatch.p99:.1f}", f"{cost.dispatch.mean:.1f}",
             f"{cost.cancel.p50:.1f}", f"{cost.cancel.p99:.1f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    costs = [measure(size) for size in SIZES]
    print(f"machine: {machine()}")
    print("command: .venv/bin/python bench/scheduler_core.py")
    print()
    print(HEADER)
    print("\n".join(row(cost) for cost in costs))
    print()
    print("jobs running when a dispatch began, mean: "
          + ", ".join(f"{cost.jobs:.2f} at {cost.waiting:,}" for cost in costs))
    print(verdict(costs))


if __name__ == "__main__":
    main()
