"""SerialScheduler with job slots and models that share the GPU: who gets a slot, which one, what a
pending swap keeps idle, and why a request waited while slots stood idle (the decision record)."""

import pytest

from scheduling.core import Dequeued, SerialScheduler, SerialSettings, StartModel, SwapGroup, SwapPolicy
from scheduling.core.mentions import plain, told

from .harness import Tickets, dequeued, grant_of, grants, specs, starts

MODELS = ("chat", "coder", "embed")
# llama-swap's documented layout: chat models swap on the GPU, embeddings stay up beside them.
GROUPS = [
    SwapGroup("gpu", ("chat", "coder")),
    SwapGroup("embeddings", ("embed",), swap=False, exclusive=False, persistent=True),
]


@pytest.fixture
def ticket():
    return Tickets()


def scheduler_with(slots=None) -> SerialScheduler:
    settings = SerialSettings(aging_divisor=60, swap_affinity_bonus=10, slots=slots or {})
    return SerialScheduler(specs(*MODELS), SwapPolicy(GROUPS, MODELS), settings)


def running_job(scheduler, ticket, model, priority=0, now=0.0):
    """Submit a request for `model` and start the model if needed; returns its grant."""
    t = ticket(model, priority, arrival=now)
    effects = scheduler.submit(t, now)
    if starts(effects):
        effects = scheduler.model_ready(model, now)
    grant = grant_of(effects)
    assert grant.ticket_id == t.id
    return grant


def test_persistent_embeddings_model_is_started_and_granted_while_a_batch_job_runs_on_chat(ticket):
    scheduler = scheduler_with()
    batch = running_job(scheduler, ticket, "chat", priority=-100)
    embed = ticket("embed", priority=100, arrival=1.0)
    assert scheduler.submit(embed, 1.0) == [StartModel("embed", evict=())]  # chat keeps its job
    grant = grant_of(scheduler.model_ready("embed", 2.0))
    assert grant.ticket_id == embed.id and grant.decision.slot == 1 and grant.decision.waited_because == ""
    snapshot = scheduler.snapshot(2.0)
    assert dict(snapshot.running) == {"chat": (batch.ticket_id,), "embed": (embed.id,)}
    assert snapshot.loaded == ("chat", "embed")


def test_starting_the_other_chat_model_leaves_the_persistent_embeddings_model_up(ticket):
    scheduler = scheduler_with()
    running_job(scheduler, ticket, "embed")
    chat = running_job(scheduler, ticket, "chat", now=1.0)
    scheduler.finished(chat.ticket_id, 2.0)
    assert scheduler.submit(ticket("coder", arrival=3.0), 3.0) == [StartModel("coder", evict=("chat",))]


def test_two_slots_take_two_jobs_and_the_third_waits_for_the_best_scoring_request(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    first = running_job(scheduler, ticket, "chat")
    second = running_job(scheduler, ticket, "chat", now=1.0)
    assert (first.decision.slot, second.decision.slot) == (1, 2)
    older, urgent = ticket("chat", 0, arrival=2.0), ticket("chat", 100, arrival=3.0)
    assert scheduler.submit(older, 2.0) == []
    assert scheduler.submit(urgent, 3.0) == []
    assert scheduler.snapshot(3.0).running == {"chat": (first.ticket_id, second.ticket_id)}

    grant = grant_of(scheduler.finished(first.ticket_id, 4.0))
    assert grant.ticket_id == urgent.id and grant.decision.slot == 1  # the slot just freed
    assert grant.decision.runner_up_id == older.id
    assert scheduler.finished(first.ticket_id, 4.5) == []  # a repeated report frees nothing
    assert grant_of(scheduler.finished(second.ticket_id, 5.0)).decision.slot == 2


def test_a_swap_reserves_only_the_models_it_evicts_until_its_request_is_cancelled(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    scheduler.finished(running_job(scheduler, ticket, "embed").ticket_id, 0.0)  # embed up and idle
    busy = running_job(scheduler, ticket, "chat", now=1.0)  # one of chat's two slots in use
    swap = ticket("coder", 100, arrival=2.0)
    assert scheduler.submit(swap, 2.0) == []  # coder's start stops chat, which is busy: it waits
    held, beside = ticket("chat", 0, arrival=3.0), ticket("embed", 0, arrival=4.0)
    assert scheduler.submit(held, 3.0) == []  # chat has a free slot, but the swap will evict chat
    assert grants(scheduler.submit(beside, 4.0)) == [beside.id]  # the swap leaves embed alone

    effects = scheduler.cancel(swap.id, 5.0)
    assert dequeued(effects) == [swap.id] and grants(effects) == [held.id]
    assert grant_of(effects).decision.slot == 2 and not starts(effects)
    assert scheduler.snapshot(5.0).running == {"chat": (busy.ticket_id, held.id), "embed": (beside.id,)}


def test_a_reserved_swap_goes_once_the_evicted_models_jobs_end(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    busy = running_job(scheduler, ticket, "chat")
    swap = ticket("coder", 100, arrival=1.0)
    scheduler.submit(swap, 1.0)
    scheduler.submit(ticket("chat", 0, arrival=2.0), 2.0)
    assert scheduler.finished(busy.ticket_id, 3.0) == [StartModel("coder", evict=("chat",))]
    grant = grant_of(scheduler.model_ready("coder", 4.0))
    assert grant.ticket_id == swap.id and grant.decision.needs_swap


def test_lowering_slots_keeps_running_jobs_and_takes_none_until_below_the_new_count(ticket):
    scheduler = scheduler_with(slots={"chat": 3})
    jobs = [running_job(scheduler, ticket, "chat", now=n).ticket_id for n in range(3)]
    waiting = [ticket("chat", arrival=3.0), ticket("chat", arrival=4.0)]
    for t in waiting:
        assert scheduler.submit(t, t.arrival) == []

    assert scheduler.retune(SerialSettings(60, 10, slots={"chat": 1}), 5.0) == []
    assert scheduler.snapshot(5.0).running == {"chat": tuple(jobs)}  # nothing cut
    assert scheduler.snapshot(5.0).slots["chat"] == 1
    assert scheduler.finished(jobs[0], 6.0) == []  # two jobs on one slot: still over
    assert scheduler.finished(jobs[1], 7.0) == []  # one job on one slot: full
    grant = grant_of(scheduler.finished(jobs[2], 8.0))
    assert grant.ticket_id == waiting[0].id and grant.decision.slot == 1
    assert scheduler.snapshot(8.0).waiting == 1


def test_raising_slots_grants_a_waiting_request_at_once(ticket):
    scheduler = scheduler_with()
    running = running_job(scheduler, ticket, "chat")
    waiting = ticket("chat", arrival=1.0)
    assert scheduler.submit(waiting, 1.0) == []
    grant = grant_of(scheduler.retune(SerialSettings(60, 10, slots={"chat": 2}), 2.0))
    assert grant.ticket_id == waiting.id and grant.decision.slot == 2
    assert scheduler.snapshot(2.0).running == {"chat": (running.ticket_id, waiting.id)}


def test_waited_because_is_empty_when_every_slot_was_busy(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    jobs = [running_job(scheduler, ticket, "chat", now=n).ticket_id for n in range(2)]
    waiting = ticket("chat", arrival=2.0)
    scheduler.submit(waiting, 2.0)
    decision = grant_of(scheduler.finished(jobs[1], 3.0)).decision
    assert (decision.slot, decision.waited_because) == (2, "")


def test_cancel_of_a_request_waiting_for_a_slot_is_dequeued_and_frees_no_slot(ticket):
    scheduler = scheduler_with()
    busy = running_job(scheduler, ticket, "chat")
    waiting = ticket("chat", arrival=1.0)
    scheduler.submit(waiting, 1.0)
    assert scheduler.cancel(waiting.id, 2.0) == [Dequeued(waiting.id)]
    assert scheduler.snapshot(2.0).running == {"chat": (busy.ticket_id,)}

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
    assert (decision.slot, plain(decision.waited_because)) == (2, f"reserved for #{swap.id}'s swap to coder")
    assert told(decision.waited_because, {"chat"}.__contains__) == "reserved for a swap to another model"


def test_waited_because_names_the_busy_model_a_swap_waits_for(ticket):
    scheduler = scheduler_with(slots={"chat": 2})
    busy = running_job(scheduler, ticket, "chat")
    swap = ticket("coder", 100, arrival=1.0)
    scheduler.submit(swap, 1.0)
    scheduler.finished(busy.ticket_id, 2.0)
    decision = grant_of(scheduler.model_ready("coder", 3.0)).decision
    assert plain(decision.waited_because) == "model chat was busy, and starting coder stops it"
    assert told(decision.waited_because, {"coder"}.__contains__) == "another model was busy, and starting coder stops it"
