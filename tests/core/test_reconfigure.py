"""A config reload (SIGHUP / --watch-config) applied to a running scheduler: removed models lose
their waiting requests and stop once idle, restarted models get a fresh process without losing
their queue, new models, limits, TTLs and swap groups apply at once."""

import pytest

from scheduling.core import (
    FifoScheduler,
    Grant,
    Refuse,
    SerialScheduler,
    SerialSettings,
    StartModel,
    StopModel,
    SwapGroup,
    SwapPolicy,
)

from .harness import Tickets, grant_of, grants, one_at_a_time, refused_by, specs

SCHEDULERS = [SerialScheduler, FifoScheduler]


@pytest.fixture
def ticket():
    return Tickets()


def build(cls, *models, policy=None, settings=SerialSettings(), **overrides):
    return cls(specs(*models, **overrides), policy or one_at_a_time(*models), settings)


def reload(scheduler, *models, now, restart=(), policy=None, **overrides):
    """Reconfigure to `models`, one at a time on the GPU unless `policy` says otherwise."""
    return scheduler.reconfigure(specs(*models, **overrides), policy or one_at_a_time(*models), restart, now)


def serving(scheduler, ticket, model, now=0.0):
    """Start `model` for a request and grant it; returns that request."""
    running = ticket(model, arrival=now)
    assert scheduler.submit(running, now) == [StartModel(model, ())]
    assert grants(scheduler.model_ready(model, now)) == [running.id]
    return running


def idle(scheduler, ticket, model, now=0.0):
    """Leave `model` ready with nothing running on it."""
    scheduler.finished(serving(scheduler, ticket, model, now).id, now)


def removed(ticket_id, model):
    return Refuse(ticket_id, 404, "model_removed", f"model {model!r} was removed from the config by a reload")


def side_by_side(*models):
    return SwapPolicy([SwapGroup("together", models, swap=False)], models)


# -- removed models ------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_removed_idle_models_stop_at_once_in_id_order_and_are_forgotten(cls, ticket):
    scheduler = build(cls, "a", "b", "c", policy=side_by_side("a", "b", "c"))
    idle(scheduler, ticket, "b")
    idle(scheduler, ticket, "a")
    assert reload(scheduler, "c", now=1.0) == [StopModel("a", "reload"), StopModel("b", "reload")]
    scheduler.model_stopped("b", 2.0)
    scheduler.model_stopped("a", 2.0)
    snapshot = scheduler.snapshot(2.0)
    assert snapshot.loaded == () and snapshot.starting == ()


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_new_requests_for_a_removed_model_get_the_usual_unknown_model_404(cls, ticket):
    scheduler = build(cls, "a", "b")
    serving(scheduler, ticket, "a")
    reload(scheduler, "b", now=1.0)
    (reject,) = scheduler.submit(late := ticket("a", arrival=2.0), 2.0)
    assert (reject.ticket_id, reject.status, reject.code) == (late.id, 404, "model_not_found")


def test_serial_removed_model_refuses_its_queue_and_stops_after_its_running_request(ticket):
    scheduler = build(SerialScheduler, "a", "b")
    running = serving(scheduler, ticket, "a")
    queued_a, queued_b = ticket("a", arrival=1.0), ticket("b", arrival=2.0)
    scheduler.submit(queued_a, 1.0)
    scheduler.submit(queued_b, 2.0)

    effects = reload(scheduler, "b", now=3.0)
    assert effects == [removed(queued_a.id, "a")]
    assert effects[0].message == "model 'a' was removed from the config by a reload"
    assert scheduler.snapshot(3.0).running_ticket == running.id  # it keeps serving

    assert scheduler.finished(running.id, 4.0) == [StopModel("a", "reload")]
    assert scheduler.model_stopped("a", 5.0) == [StartModel("b", ())]  # only once a is gone
    assert grants(scheduler.model_ready("b", 6.0)) == [queued_b.id]
    assert scheduler.snapshot(6.0).loaded == ("b",)


def test_fifo_removed_model_refuses_its_queue_in_queue_order(ticket):
    scheduler = build(FifoScheduler, "a", "b")
    running = serving(scheduler, ticket, "a")
    first, second = ticket("b", priority=0, arrival=1.0), ticket("b", priority=5, arrival=2.0)
    assert scheduler.submit(first, 1.0) == scheduler.submit(second, 2.0) == []  # b must evict a, which serves
    assert reload(scheduler, "a", now=3.0) == [removed(second.id, "b"), removed(first.id, "b")]
    assert scheduler.snapshot(3.0).waiting == 0
    assert scheduler.finished(running.id, 4.0) == []  # nothing left to start; a stays loaded
    assert scheduler.snapshot(4.0).loaded == ("a",)


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_removed_model_that_was_starting_refuses_its_requests_and_is_stopped(cls, ticket):
    scheduler = build(cls, "a", "b")
    starting = ticket("a")
    assert scheduler.submit(starting, 0.0) == [StartModel("a", ())]
    other = ticket("b", arrival=1.0)
    scheduler.submit(other, 1.0)
    assert reload(scheduler, "b", now=2.0) == [removed(starting.id, "a"), StopModel("a", "reload")]
    # The runtime reports the start it cut short, then the stop; b starts after that.
    assert scheduler.model_failed("a", "stopped", 3.0) == []
    assert scheduler.model_stopped("a", 3.0) == [StartModel("b", ())]
    assert grants(scheduler.model_ready("b", 4.0)) == [other.id]


def test_fifo_removed_model_still_serving_blocks_new_starts_but_not_ready_models(ticket):
    scheduler = build(FifoScheduler, "a", "b", "c", policy=SwapPolicy([SwapGroup("ab", ("a", "b"), swap=False)], "abc"))
    running_a = serving(scheduler, ticket, "a")
    idle(scheduler, ticket, "b")
    new_policy = SwapPolicy([SwapGroup("b", ("b",), swap=False)], "bc")
    assert reload(scheduler, "b", "c", now=1.0, policy=new_policy) == []

    assert grants(scheduler.submit(for_b := ticket("b", arrival=2.0), 2.0)) == [for_b.id]
    for_c = ticket("c", arrival=3.0)
    assert scheduler.submit(for_c, 3.0) == []  # c evicts b, which is serving
    assert scheduler.finished(for_b.id, 4.0) == []  # b is idle, but a removed model still holds the GPU
    assert scheduler.finished(running_a.id, 5.0) == [StopModel("a", "reload")]
    assert scheduler.model_stopped("a", 6.0) == [StartModel("c", ("b",))]


def test_serial_nothing_starts_while_a_removed_model_that_exited_still_has_a_request_running(ticket):
    scheduler = build(SerialScheduler, "a", "b")
    running_b = serving(scheduler, ticket, "b")
    assert scheduler.model_stopped("b", 1.0) == []  # b exited; its request fails on its own, soon
    for_a = ticket("a", arrival=2.0)
    assert scheduler.submit(for_a, 2.0) == []  # a's start evicts b, whose request still runs
    assert reload(scheduler, "a", now=3.0) == []  # b is gone from the config, its request is not
    assert scheduler.finished(running_b.id, 4.0) == [StartModel("a", ())]


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_unload_all_also_stops_a_removed_model_still_serving(cls, ticket):
    scheduler = build(cls, "a", "b")
    running = serving(scheduler, ticket, "a")
    reload(scheduler, "b", now=1.0)
    assert scheduler.unload(None, 2.0) == [StopModel("a", "unload")]
    assert scheduler.finished(running.id, 3.0) == []  # already stopping: no second stop
    assert scheduler.model_stopped("a", 4.0) == []
    assert scheduler.snapshot(4.0).loaded == ()


# -- restarted models ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_restarted_idle_model_is_stopped_at_once_then_started_again_for_the_next_request(cls, ticket):
    scheduler = build(cls, "a")
    idle(scheduler, ticket, "a")
    assert reload(scheduler, "a", now=1.0, restart=["a"]) == [StopModel("a", "reload")]
    later = ticket("a", arrival=2.0)
    assert scheduler.submit(later, 2.0) == []  # waits for the old process to go
    assert scheduler.model_stopped("a", 3.0) == [StartModel("a", ())]
    assert grants(scheduler.model_ready("a", 4.0)) == [later.id]


def test_serial_restarted_model_finishes_its_request_then_restarts_and_loses_affinity(ticket):
    scheduler = build(SerialScheduler, "a", "b", settings=SerialSettings(aging_divisor=60, swap_affinity_bonus=10))
    running = serving(scheduler, ticket, "a")
    older_b, newer_a = ticket("b", arrival=1.0), ticket("a", arrival=2.0)
    scheduler.submit(older_b, 1.0)
    scheduler.submit(newer_a, 2.0)
    assert [t.id for t, _ in scheduler.ranked(3.0)] == [newer_a.id, older_b.id]  # affinity for loaded a

    assert reload(scheduler, "a", "b", now=3.0, restart=["a"]) == []
    ranked = scheduler.ranked(3.0)
    assert [t.id for t, _ in ranked] == [older_b.id, newer_a.id]
    assert all(terms.affinity == 0 for _, terms in ranked)

    assert scheduler.finished(running.id, 4.0) == [StopModel("a", "reload")]  # no grant on the old process
    assert scheduler.model_stopped("a", 5.0) == [StartModel("b", ())]
    scheduler.model_ready("b", 6.0)
    assert scheduler.finished(older_b.id, 7.0) == [StartModel("a", ("b",))]
    grant = grant_of(scheduler.model_ready("a", 8.0))
    assert grant.ticket_id == newer_a.id and grant.decision.queue_wait_s == 5.0  # waited since arrival at 2


def test_fifo_restarted_model_finishes_its_requests_then_restarts(ticket):
    scheduler = build(FifoScheduler, "a")
    first = serving(scheduler, ticket, "a")
    assert grants(scheduler.submit(second := ticket("a"), 0.0)) == [second.id]
    assert reload(scheduler, "a", now=1.0, restart=["a"]) == []
    later = ticket("a", arrival=2.0)
    assert scheduler.submit(later, 2.0) == []  # ready, but not for new work
    assert scheduler.finished(first.id, 3.0) == []
    assert scheduler.finished(second.id, 4.0) == [StopModel("a", "reload")]
    assert scheduler.model_stopped("a", 5.0) == [StartModel("a", ())]
    assert grants(scheduler.model_ready("a", 6.0)) == [later.id]


def test_serial_restart_during_a_start_lets_it_finish_then_replaces_it(ticket):
    scheduler = build(SerialScheduler, "a")
    starting, queued = ticket("a"), ticket("a", arrival=1.0)
    scheduler.submit(starting, 0.0)
    scheduler.submit(queued, 1.0)
    assert reload(scheduler, "a", now=2.0, restart=["a"]) == []
    assert [t.id for t, _ in scheduler.ranked(2.0)] == [starting.id, queued.id]  # both wait again
    assert scheduler.model_ready("a", 3.0) == [StopModel("a", "reload")]
    assert scheduler.model_stopped("a", 4.0) == [StartModel("a", ())]
    assert grants(scheduler.model_ready("a", 5.0)) == [starting.id]
    assert grants(scheduler.finished(starting.id, 6.0)) == [queued.id]


def test_fifo_restart_during_a_start_puts_its_waiters_back_in_the_queue(ticket):
    scheduler = build(FifoScheduler, "a")
    first, second = ticket("a"), ticket("a", arrival=1.0)
    assert scheduler.submit(first, 0.0) == [StartModel("a", ())]
    assert scheduler.submit(second, 1.0) == []  # joins the start
    assert reload(scheduler, "a", now=2.0, restart=["a"]) == []
    assert [t.id for t, _ in scheduler.ranked(2.0)] == [first.id, second.id]
    third = ticket("a", arrival=2.5)
    assert scheduler.submit(third, 2.5) == []  # does not join the superseded start
    assert scheduler.model_ready("a", 3.0) == [StopModel("a", "reload")]
    assert scheduler.model_stopped("a", 4.0) == [StartModel("a", ())]
    assert grants(scheduler.model_ready("a", 5.0)) == [first.id, second.id, third.id]


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_failure_of_a_superseded_start_refuses_nobody_and_starts_the_new_config(cls, ticket):
    scheduler = build(cls, "a")
    starting, queued = ticket("a"), ticket("a", arrival=1.0)
    scheduler.submit(starting, 0.0)
    scheduler.submit(queued, 1.0)
    reload(scheduler, "a", now=2.0, restart=["a"])
    assert scheduler.model_failed("a", "old command crashed", 3.0) == [StartModel("a", ())]
    assert starting.id in grants(scheduler.model_ready("a", 4.0))


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_restart_of_a_stopped_model_or_of_an_unconfigured_id_does_nothing(cls, ticket):
    scheduler = build(cls, "a", "b")
    assert reload(scheduler, "a", "b", now=0.0, restart=["b", "nonexistent"]) == []
    assert scheduler.submit(t := ticket("b"), 1.0) == [StartModel("b", ())]
    assert grants(scheduler.model_ready("b", 2.0)) == [t.id]


# -- what carries over, what changes -------------------------------------------------------------


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_a_new_model_is_usable_at_once(cls, ticket):
    scheduler = build(cls, "a")
    assert reload(scheduler, "a", "b", now=0.0) == []
    assert scheduler.submit(t := ticket("b"), 1.0) == [StartModel("b", ())]
    assert grants(scheduler.model_ready("b", 2.0)) == [t.id]


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_a_changed_ttl_counts_from_when_the_model_went_idle(cls, ticket):
    scheduler = build(cls, "a", "b")
    idle(scheduler, ticket, "a", now=0.0)
    assert scheduler.next_deadline() is None  # ttl 0: never unloads
    reload(scheduler, "a", "b", now=5.0, a={"ttl": 10})
    assert scheduler.next_deadline() == 10.0
    assert scheduler.tick(9.0) == []
    assert scheduler.tick(10.0) == [StopModel("a", "ttl")]


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_a_reload_keeps_waiting_requests_with_their_ids_arrivals_and_order(cls, ticket):
    scheduler = build(cls, "a", "b", "c")
    serving(scheduler, ticket, "a")
    waiting = [ticket(m, priority=p, arrival=t) for m, p, t in [("b", 0, 1.0), ("c", 100, 2.0), ("b", -100, 3.0)]]
    for t in waiting:
        scheduler.submit(t, t.arrival)
    before = [t for t, _ in scheduler.ranked(4.0)]
    reload(scheduler, "a", "b", "c", "d", now=4.0, restart=["b"], c={"fifo_priority": 50})
    assert [t for t, _ in scheduler.ranked(4.0)] == before


def test_fifo_changed_concurrency_limit_applies_to_new_requests_and_keeps_admitted_ones(ticket):
    scheduler = build(FifoScheduler, "a", a={"concurrency_limit": 1})
    first = serving(scheduler, ticket, "a")
    assert refused_by(scheduler.submit(over := ticket("a"), 0.0))[over.id].status == 429
    reload(scheduler, "a", now=1.0, a={"concurrency_limit": 2})
    assert grants(scheduler.submit(second := ticket("a"), 1.0)) == [second.id]
    reload(scheduler, "a", now=2.0, a={"concurrency_limit": 1})
    assert refused_by(scheduler.submit(over := ticket("a"), 2.0))[over.id].status == 429  # both keep running
    scheduler.finished(first.id, 3.0)
    assert refused_by(scheduler.submit(over := ticket("a"), 3.0))[over.id].status == 429
    scheduler.finished(second.id, 4.0)
    assert grants(scheduler.submit(fits := ticket("a"), 4.0)) == [fits.id]


def test_fifo_changed_model_priority_applies_to_new_requests(ticket):
    scheduler = build(FifoScheduler, "a", "b", "c")
    running = serving(scheduler, ticket, "a")
    queued_b, queued_c = ticket("b", arrival=1.0), ticket("c", arrival=2.0)
    scheduler.submit(queued_b, 1.0)
    scheduler.submit(queued_c, 2.0)
    reload(scheduler, "a", "b", "c", now=3.0, c={"fifo_priority": 10})
    urgent_c = ticket("c", arrival=4.0)
    scheduler.submit(urgent_c, 4.0)
    assert [t.id for t, _ in scheduler.ranked(4.0)] == [urgent_c.id, queued_b.id, queued_c.id]
    assert scheduler.finished(running.id, 5.0) == [StartModel("c", ("a",))]
    granted = [e for e in scheduler.model_ready("c", 6.0) if isinstance(e, Grant)]
    assert [(g.ticket_id, g.decision.fifo_priority) for g in granted] == [(urgent_c.id, 10), (queued_c.id, 0)]


def test_serial_new_swap_groups_decide_the_next_eviction(ticket):
    scheduler = build(SerialScheduler, "a", "b", "c", policy=side_by_side("a", "b", "c"))
    idle(scheduler, ticket, "a")
    reload(scheduler, "a", "b", "c", now=1.0)  # one model at a time from now on
    assert scheduler.submit(ticket("b", arrival=2.0), 2.0) == [StartModel("b", ("a",))]


def test_fifo_new_swap_groups_decide_the_next_eviction(ticket):
    scheduler = build(FifoScheduler, "a", "b", policy=side_by_side("a", "b"))
    idle(scheduler, ticket, "a")
    idle(scheduler, ticket, "b")
    reload(scheduler, "a", "b", now=1.0)  # one model at a time from now on
    for_a = ticket("a", arrival=2.0)
    assert scheduler.submit(for_a, 2.0) == [StopModel("b", "evict")]
    assert grants(scheduler.model_stopped("b", 3.0)) == [for_a.id]


@pytest.mark.parametrize("cls", SCHEDULERS)
def test_a_reload_after_shutdown_does_nothing(cls, ticket):
    scheduler = build(cls, "a")
    serving(scheduler, ticket, "a")
    scheduler.shutdown(1.0)
    assert reload(scheduler, now=2.0) == []
