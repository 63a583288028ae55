"""FifoScheduler: llama-swap's fifo scheduler with the priority header added (reference §3.3, §5.3)."""

import pytest

from scheduling.core import (
    Band,
    Dequeued,
    FifoScheduler,
    SerialSettings,
    StartModel,
    StopModel,
    SwapGroup,
    SwapPolicy,
)

from .harness import Tickets, grant_of, grants, one_at_a_time, refused_by, specs, starts, stops


@pytest.fixture
def ticket():
    return Tickets()


def fifo(*models, policy=None, **overrides):
    return FifoScheduler(specs(*models, **overrides), policy or one_at_a_time(*models), SerialSettings())


def parallel(*models):
    """Every model may run alongside every other."""
    return SwapPolicy([SwapGroup(f"g-{m}", (m,), exclusive=False) for m in models], models)


def test_fast_path_grants_a_ready_model_at_once(ticket):
    scheduler = fifo("a")
    scheduler.submit(ticket("a"), 0.0)
    scheduler.model_ready("a", 1.0)
    t = ticket("a", arrival=2.0)
    effects = scheduler.submit(t, 2.0)
    assert grants(effects) == [t.id] and not starts(effects)


def test_on_demand_start_then_serve(ticket):
    scheduler = fifo("a")
    t = ticket("a")
    assert scheduler.submit(t, 0.0) == [StartModel("a", evict=())]
    grant = grant_of(scheduler.model_ready("a", 1.0))
    assert grant.ticket_id == t.id and grant.decision.needs_swap


def test_join_in_flight_swap(ticket):
    scheduler = fifo("a")
    first, second = ticket("a"), ticket("a")
    assert starts(scheduler.submit(first, 0.0)) == [StartModel("a", evict=())]
    assert scheduler.submit(second, 0.5) == []
    assert grants(scheduler.model_ready("a", 1.0)) == [first.id, second.id]


def test_swap_done_error_fails_all_waiters(ticket):
    scheduler = fifo("a")
    waiters = [ticket("a"), ticket("a")]
    for t in waiters:
        scheduler.submit(t, 0.0)
    rejected = refused_by(scheduler.model_failed("a", "health check timed out after 120s", 1.0))
    assert set(rejected) == {t.id for t in waiters}
    assert all((r.status, r.code) == (503, "model_start_failed") for r in rejected.values())
    assert "health check timed out" in rejected[waiters[0].id].message


def test_model_not_found(ticket):
    t = ticket("ghost")
    assert refused_by(fifo("a").submit(t, 0.0))[t.id].status == 404


def test_queue_on_eviction_collision(ticket):
    scheduler = fifo("a", "b")
    a = ticket("a")
    scheduler.submit(a, 0.0)
    b = ticket("b", arrival=0.5)
    assert scheduler.submit(b, 0.5) == []  # would evict the model being started
    assert grants(scheduler.model_ready("a", 1.0)) == [a.id]  # b still waits for a's request to drain
    assert starts(scheduler.finished(a.id, 2.0)) == [StartModel("b", evict=("a",))]
    assert grants(scheduler.model_ready("b", 3.0)) == [b.id]


def test_disjoint_swaps_run_in_parallel(ticket):
    scheduler = fifo("a", "b", policy=parallel("a", "b"))
    assert starts(scheduler.submit(ticket("a"), 0.0)) == [StartModel("a", evict=())]
    assert starts(scheduler.submit(ticket("b"), 0.0)) == [StartModel("b", evict=())]
    assert scheduler.snapshot(0.0).starting == ("a", "b")


def test_overlapping_evict_sets_do_not_run_in_parallel(ticket):
    # x (non-exclusive) is loaded; a and b are in exclusive groups, so each start would evict x.
    policy = SwapPolicy(
        [SwapGroup("x", ("x",), exclusive=False), SwapGroup("a", ("a",)), SwapGroup("b", ("b",))], ["x", "a", "b"]
    )
    scheduler = FifoScheduler(specs("x", "a", "b"), policy, SerialSettings())
    x = ticket("x")
    scheduler.submit(x, 0.0)
    scheduler.model_ready("x", 0.0)
    scheduler.finished(x.id, 0.0)
    assert starts(scheduler.submit(ticket("a"), 1.0)) == [StartModel("a", evict=("x",))]
    assert scheduler.submit(ticket("b"), 1.0) == []


def test_queue_drain_promotes_multiple(ticket):
    scheduler = fifo("a", "b", "c", policy=parallel("a", "b", "c"))
    scheduler_a = ticket("a")
    scheduler.submit(scheduler_a, 0.0)
    scheduler.model_ready("a", 0.0)
    scheduler.unload(["a"], 0.5)  # a is stopping: requests for it wait for the stop
    waiting = [ticket("a", arrival=1.0), ticket("a", arrival=1.0)]
    for t in waiting:
        assert scheduler.submit(t, 1.0) == []
    effects = scheduler.model_stopped("a", 2.0)
    assert starts(effects) == [StartModel("a", evict=())]  # one start, both requests on it
    assert grants(scheduler.model_ready("a", 3.0)) == [t.id for t in waiting]


def test_queue_collation_starts_each_model_once(ticket):
    scheduler = fifo("a", "b", "c")
    requests = [ticket(m, arrival=float(i)) for i, m in enumerate("abcabc")]
    effects = []
    for t in requests:
        effects += scheduler.submit(t, t.arrival)
    served = []
    for _ in range(3):
        (start,) = starts(effects)
        effects = scheduler.model_ready(start.model, 10.0)
        batch = grants(effects)
        served.append((start.model, batch))
        effects = []
        for ticket_id in batch:
            effects += scheduler.finished(ticket_id, 11.0)
    assert [model for model, _ in served] == ["a", "b", "c"]
    assert [len(batch) for _, batch in served] == [2, 2, 2]


def test_no_swap_while_serving(ticket):
    scheduler = fifo("a", "b")
    a1, a2 = ticket("a"), ticket("a")
    scheduler.submit(a1, 0.0)
    scheduler.submit(a2, 0.0)
    scheduler.model_ready("a", 1.0)
    b = ticket("b", arrival=2.0)
    assert scheduler.submit(b, 2.0) == []
    assert scheduler.finished(a1.id, 3.0) == []  # a still serves a2: never evicted mid-request
    assert starts(scheduler.finished(a2.id, 4.0)) == [StartModel("b", evict=("a",))]


def test_priority_queue_order(ticket):
    # Model priorities A10, B5, C5, D1; arrivals B, D, C, A -> queue order A, B, C, D (ties stable).
    models = ("busy", "A", "B", "C", "D")
    overrides = {model: {"fifo_priority": p} for model, p in {"A": 10, "B": 5, "C": 5, "D": 1}.items()}
    scheduler = FifoScheduler(specs(*models, **overrides), one_at_a_time(*models), SerialSettings())
    busy = ticket("busy")
    scheduler.submit(busy, 0.0)
    scheduler.model_ready("busy", 0.0)
    for model in "BDCA":
        scheduler.submit(ticket(model, arrival=1.0), 1.0)
    assert [t.model for t, _ in scheduler.ranked(1.0)] == ["A", "B", "C", "D"]


def test_header_priority_adds_to_the_model_priority(ticket):
    scheduler = FifoScheduler(
        specs("busy", "m", m={"fifo_priority": 10}), one_at_a_time("busy", "m"), SerialSettings()
    )
    busy = ticket("busy")
    scheduler.submit(busy, 0.0)
    scheduler.model_ready("busy", 0.0)
    batch, normal = ticket("m", priority=-100, arrival=1.0), ticket("m", priority=0, arrival=2.0)
    scheduler.submit(batch, 1.0)
    scheduler.submit(normal, 2.0)
    assert [(t.id, terms.priority) for t, terms in scheduler.ranked(2.0)] == [(normal.id, 10), (batch.id, -90)]
    start = scheduler.finished(busy.id, 3.0)
    assert starts(start) == [StartModel("m", evict=("busy",))]
    granted = scheduler.model_ready("m", 4.0)
    by_id = {g.ticket_id: g.decision for g in granted}
    assert by_id[batch.id].fifo_priority == -90 and by_id[normal.id].fifo_priority == 10


def test_grant_sets_fifo_priority_metadata(ticket):
    scheduler = FifoScheduler(specs("m", m={"fifo_priority": 10}), one_at_a_time("m"), SerialSettings())
    t = ticket("m", priority=-100)
    scheduler.submit(t, 0.0)
    decision = grant_of(scheduler.model_ready("m", 1.0)).decision
    assert decision.scheduler == "fifo" and decision.fifo_priority == -90
    assert decision.score == -90.0 and decision.terms.priority == -90 and decision.terms.aging == 0.0
    assert decision.priority == -100 and decision.band is Band.BATCH
    assert decision.runner_up_id is None and not decision.changed_by_aging and not decision.changed_by_affinity
    assert decision.activity_metadata() == {"fifo_priority": "-90"}


def test_unblocked_lower_priority_request_can_go_ahead_of_a_blocked_one(ticket):
    policy = SwapPolicy([SwapGroup("ab", ("a", "b")), SwapGroup("c", ("c",), exclusive=False)], ["a", "b", "c"])
    scheduler = FifoScheduler(specs("a", "b", "c", b={"fifo_priority": 10}), policy, SerialSettings())
    a = ticket("a")
    scheduler.submit(a, 0.0)
    scheduler.model_ready("a", 0.0)
    high_b = ticket("b", arrival=1.0)
    assert scheduler.submit(high_b, 1.0) == []  # blocked: a is serving
    low_c = ticket("c", arrival=2.0)
    assert starts(scheduler.submit(low_c, 2.0)) == [StartModel("c", evict=())]


def test_on_cancel_queued_request_never_triggers_a_load(ticket):
    scheduler = fifo("a", "b")
    a = ticket("a")
    scheduler.submit(a, 0.0)
    scheduler.model_ready("a", 0.0)
    b = ticket("b", arrival=1.0)
    scheduler.submit(b, 1.0)
    assert scheduler.cancel(b.id, 2.0) == [Dequeued(b.id)]
    assert scheduler.finished(a.id, 3.0) == []


def test_on_cancel_swap_waiter_is_not_granted_and_the_start_carries_on(ticket):
    scheduler = fifo("a")
    first, second = ticket("a"), ticket("a")
    scheduler.submit(first, 0.0)
    scheduler.submit(second, 0.0)
    assert scheduler.cancel(first.id, 0.5) == [Dequeued(first.id)]
    assert grants(scheduler.model_ready("a", 1.0)) == [second.id]
    assert scheduler.finished(first.id, 2.0) == []  # never granted, so nothing to release


def test_on_cancel_not_present_is_a_no_op(ticket):
    assert fifo("a").cancel(42, 0.0) == []
    assert fifo("a").finished(42, 0.0) == []


def test_concurrency_limit_rejects_over_limit_with_retry_after(ticket):
    scheduler = fifo("a", a={"concurrency_limit": 2})
    first, second, third = ticket("a"), ticket("a"), ticket("a")
    scheduler.submit(first, 0.0)
    scheduler.model_ready("a", 0.0)
    scheduler.submit(second, 0.0)
    rejection = refused_by(scheduler.submit(third, 0.0))[third.id]
    assert (rejection.status, rejection.code, rejection.retry_after) == (429, "concurrency_limit", 1.0)
    assert "already has 2 requests admitted" in rejection.message
    scheduler.finished(first.id, 1.0)
    fourth = ticket("a")
    assert grants(scheduler.submit(fourth, 1.0)) == [fourth.id]  # capacity returns after serve-done


def test_concurrency_limit_default_is_ten(ticket):
    scheduler = fifo("a")
    for _ in range(10):
        assert not refused_by(scheduler.submit(ticket("a"), 0.0))
    eleventh = ticket("a")
    assert refused_by(scheduler.submit(eleventh, 0.0))[eleventh.id].status == 429


def test_concurrency_limit_counts_swap_waiters(ticket):
    scheduler = fifo("a", a={"concurrency_limit": 1})
    scheduler.submit(ticket("a"), 0.0)  # waiting on the start
    late = ticket("a")
    rejection = refused_by(scheduler.submit(late, 0.0))[late.id]
    assert rejection.code == "concurrency_limit" and "already has 1 request admitted" in rejection.message


def test_concurrency_limit_counts_queued_waiters_and_cancel_releases_them(ticket):
    scheduler = fifo("a", "b", b={"concurrency_limit": 1})
    a = ticket("a")
    scheduler.submit(a, 0.0)
    scheduler.model_ready("a", 0.0)
    queued_b = ticket("b")
    assert scheduler.submit(queued_b, 0.0) == []
    over = ticket("b")
    assert refused_by(scheduler.submit(over, 0.0))[over.id].status == 429
    scheduler.cancel(queued_b.id, 1.0)
    assert scheduler.submit(ticket("b"), 1.0) == []  # the cancelled one freed its slot


def test_on_unload_releases_waiters_and_drops_queued_requests_for_those_models(ticket):
    policy = SwapPolicy([SwapGroup("ab", ("a", "b")), SwapGroup("c", ("c",), exclusive=False)], ["a", "b", "c"])
    scheduler = FifoScheduler(specs("a", "b", "c"), policy, SerialSettings())
    a = ticket("a")
    scheduler.submit(a, 0.0)  # starting a
    queued_b = ticket("b")
    scheduler.submit(queued_b, 0.0)  # collides with a's start
    c = ticket("c")
    scheduler.submit(c, 0.0)  # c starts in parallel
    effects = scheduler.unload(["a", "b"], 1.0)
    rejected = refused_by(effects)
    assert set(rejected) == {a.id, queued_b.id}
    assert all((r.status, r.code) == (503, "model_unloaded") for r in rejected.values())
    assert stops(effects) == [StopModel("a", "unload")]
    assert scheduler.model_ready("a", 2.0) == []  # the aborted start is ignored
    assert grants(scheduler.model_ready("c", 2.0)) == [c.id]


def test_on_unload_keeps_queued_requests_for_other_models(ticket):
    scheduler = fifo("a", "b")
    a = ticket("a")
    scheduler.submit(a, 0.0)
    scheduler.model_ready("a", 0.0)
    b = ticket("b")
    scheduler.submit(b, 0.0)
    effects = scheduler.unload(["a"], 1.0)
    assert stops(effects) == [StopModel("a", "unload")] and not refused_by(effects)
    scheduler.finished(a.id, 1.5)  # the stop cut it
    assert starts(scheduler.model_stopped("a", 2.0)) == [StartModel("b", evict=())]


def test_on_shutdown_fails_all_waiters(ticket):
    scheduler = fifo("a", "b")
    starting, queued = ticket("a"), ticket("b")
    scheduler.submit(starting, 0.0)
    scheduler.submit(queued, 0.0)
    effects = scheduler.shutdown(1.0)
    assert set(refused_by(effects)) == {starting.id, queued.id}
    assert all(r.code == "shutting_down" for r in refused_by(effects).values())
    assert stops(effects) == [StopModel("a", "shutdown")]
    late = ticket("a")
    assert refused_by(scheduler.submit(late, 2.0))[late.id].status == 503


def test_ready_model_sharing_the_gpu_with_an_evictable_one_stops_it_first(ticket):
    # The non-exclusive gotcha: x starts next to exclusive a; a request for a then evicts x.
    policy = SwapPolicy([SwapGroup("a", ("a",)), SwapGroup("x", ("x",), exclusive=False)], ["a", "x"])
    scheduler = FifoScheduler(specs("a", "x"), policy, SerialSettings())
    for model in ("a", "x"):
        t = ticket(model)
        scheduler.submit(t, 0.0)
        scheduler.model_ready(model, 0.0)
        scheduler.finished(t.id, 0.0)
    assert scheduler.snapshot(0.0).loaded == ("a", "x")
    a = ticket("a", arrival=1.0)
    assert scheduler.submit(a, 1.0) == [StopModel("x", "evict")]
    assert grants(scheduler.model_stopped("x", 2.0)) == [a.id]


def test_ttl_and_request_during_stop(ticket):
    scheduler = fifo("a", a={"ttl": 10})
    t = ticket("a")
    scheduler.submit(t, 0.0)
    scheduler.model_ready("a", 1.0)
    scheduler.finished(t.id, 5.0)
    assert scheduler.next_deadline() == 15.0
    assert scheduler.tick(15.0) == [StopModel("a", "ttl")]
    late = ticket("a", arrival=16.0)
    assert scheduler.submit(late, 16.0) == []
    assert starts(scheduler.model_stopped("a", 17.0)) == [StartModel("a", evict=())]


def test_reprioritize_moves_a_queued_request_stably(ticket):
    scheduler = fifo("busy", "m")
    busy = ticket("busy")
    scheduler.submit(busy, 0.0)
    scheduler.model_ready("busy", 0.0)
    first, second, third = ticket("m", arrival=1.0), ticket("m", arrival=2.0), ticket("m", arrival=3.0)
    for t in (first, second, third):
        scheduler.submit(t, t.arrival)
    scheduler.reprioritize(third.id, 5, 4.0)
    assert [t.id for t, _ in scheduler.ranked(4.0)] == [third.id, first.id, second.id]
    scheduler.reprioritize(third.id, 0, 4.0)
    assert [t.id for t, _ in scheduler.ranked(4.0)] == [first.id, second.id, third.id]  # back in arrival order
    assert scheduler.retune(SerialSettings(1, 1), 5.0) == []


def test_snapshot_counts_queued_requests_by_band(ticket):
    scheduler = fifo("busy", "m")
    busy = ticket("busy")
    scheduler.submit(busy, 0.0)
    scheduler.model_ready("busy", 0.0)
    scheduler.submit(ticket("m", priority=100, arrival=3.0), 3.0)
    scheduler.submit(ticket("m", priority=-100, arrival=1.0), 1.0)
    snapshot = scheduler.snapshot(5.0)
    assert dict(snapshot.depth_by_band) == {Band.INTERACTIVE: 1, Band.NORMAL: 0, Band.BATCH: 1}
    assert dict(snapshot.oldest_wait_by_band) == {Band.INTERACTIVE: 2.0, Band.NORMAL: 0.0, Band.BATCH: 4.0}
    assert snapshot.running_tickets == (busy.id,) and snapshot.waiting == 2


def test_a_rebuilt_queue_is_served_in_arrival_order(ticket):
    scheduler = fifo("a")
    later, earlier = ticket("a", arrival=5.0), ticket("a", arrival=1.0)
    assert scheduler.submit_all([later, earlier], 6.0) == [StartModel("a", evict=())]
    assert grants(scheduler.model_ready("a", 7.0)) == [earlier.id, later.id]  # fifo sends both to the ready model, in order
