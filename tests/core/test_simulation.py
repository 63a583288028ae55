"""The one simulation the forecast and the replay share: what the scheduler asks for comes due after the
time the caller's timing says, in the order it was asked for, and what has no known time never does."""

from __future__ import annotations

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapPolicy, Ticket
from scheduling.core.effects import Grant
from scheduling.core.simulation import Simulation


class Timing:
    def __init__(self, jobs: dict[int, float | None], loads: dict[str, float | None]) -> None:
        self.jobs, self.loads = jobs, loads

    def job_s(self, grant: Grant, now: float) -> float | None:
        return self.jobs[grant.ticket_id]

    def load_s(self, model: str) -> float | None:
        return self.loads[model]


def scheduler():
    return SerialScheduler({m: ModelSpec(m) for m in "ab"}, SwapPolicy((), ("a", "b")), SerialSettings())


def played(sim: Simulation) -> list[tuple[float, str, object]]:
    seen = []
    while sim.next_at() is not None:
        when, event, subject = sim.pop()
        seen.append((when, event, subject))
        sim.tell(event, subject, when)
    return seen


def test_a_load_then_each_job_comes_due_after_its_time_and_a_swap_loads_after_the_job_it_waited_for():
    core = scheduler()
    sim = Simulation(core, Timing({1: 2.0, 2: 3.0}, {"a": 5.0, "b": 7.0}))
    sim.carry_out(core.submit(Ticket(1, "a", 0, 0.0), 0.0), 0.0)
    sim.carry_out(core.submit(Ticket(2, "b", 0, 0.0), 0.0), 0.0)
    assert played(sim) == [(5.0, "ready", "a"), (7.0, "finished", 1), (14.0, "ready", "b"), (17.0, "finished", 2)]


def test_what_has_no_known_time_never_comes_due():
    core = scheduler()
    sim = Simulation(core, Timing({1: None}, {"a": 1.0}))
    sim.carry_out(core.submit(Ticket(1, "a", 0, 0.0), 0.0), 0.0)
    assert played(sim) == [(1.0, "ready", "a")]
    assert core.snapshot(1.0).running, "the job is granted and runs on, its end unknown"
