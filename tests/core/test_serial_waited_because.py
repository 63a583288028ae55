"""Decision.waited_because from the serial scheduler: why a request waited while slots stood idle,
as the decision record and the admin show it."""

import pytest

from scheduling.core import SerialScheduler, SerialSettings, SwapGroup, SwapPolicy

from .harness import Tickets, grant_of, specs, starts

MODELS = ("chat", "coder", "embed")
GROUPS = [
    SwapGroup("gpu", ("chat", "coder")),
    SwapGroup("embeddings", ("embed",), swap=False, exclusive=False, persistent=True),
]


@pytest.fixture
def ticket():
    return Tickets()


def scheduler_with(slots=None) -> SerialScheduler:
    return SerialScheduler(specs(*MODELS), SwapPolicy(GROUPS, MODELS), SerialSettings(60, 10, slots=slots or {}))


def running_job(scheduler, ticket, model, priority=0, now=0.0):
    t = ticket(model, priority, arrival=now)
    effects = scheduler.submit(t, now)
    if starts(effects):
        effects = scheduler.model_ready(model, now)
    return grant_of(effects)


def test_waited_because_names_the_full_model_while_another_model_stood_idle(ticket):
    scheduler = scheduler_with()
    scheduler.finished(running_job(scheduler, ticket, "embed").ticket_id, 0.0)  # embed up and idle
    busy = running_job(scheduler, ticket, "chat", now=1.0)
    waiting = ticket("chat", arrival=2.0)
    scheduler.submit(waiting, 2.0)
    decision = grant_of(scheduler.finished(busy.ticket_id, 3.0)).decision
    assert (decision.slot, decision.waited_because) == (1, "model chat was busy (1/1 slots)")


def test_waited_because_names_the_swap_that_reserved_the_model(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    running_job(scheduler, ticket, "chat")
    swap = ticket("coder", 100, arrival=1.0)
    scheduler.submit(swap, 1.0)
    held = ticket("chat", 0, arrival=2.0)
    scheduler.submit(held, 2.0)  # chat has a free slot, but coder's swap will evict chat
    decision = grant_of(scheduler.cancel(swap.id, 3.0)).decision
    assert (decision.slot, decision.waited_because) == (2, f"reserved for #{swap.id}'s swap to coder")


def test_waited_because_names_the_busy_model_a_swap_waits_for(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    busy = running_job(scheduler, ticket, "chat")
    swap = ticket("coder", 100, arrival=1.0)
    scheduler.submit(swap, 1.0)
    scheduler.finished(busy.ticket_id, 2.0)
    decision = grant_of(scheduler.model_ready("coder", 3.0)).decision
    assert decision.waited_because == "model chat was busy, and starting coder stops it"
