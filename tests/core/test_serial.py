"""SerialScheduler: one job at a time, best score next, models started and stopped around it."""

import pytest

from scheduling.core import (
    Band,
    Dequeued,
    Grant,
    SerialScheduler,
    SerialSettings,
    StartModel,
    StopModel,
    SwapGroup,
    SwapPolicy,
)

from .harness import Tickets, dequeued, grant_of, grants, one_at_a_time, refused_by, specs, starts, stops

NO_BONUS = SerialSettings(aging_divisor=60, swap_affinity_bonus=0)


@pytest.fixture
def ticket():
    return Tickets()


def serial(*models, settings=SerialSettings(), policy=None, **overrides):
    return SerialScheduler(specs(*models, **overrides), policy or one_at_a_time(*models), settings)


def loaded_with(scheduler, model, ticket, now=0.0):
    """Start `model` through a request and finish it, leaving the model ready and the GPU free."""
    first = ticket(model, arrival=now)
    scheduler.submit(first, now)
    scheduler.model_ready(model, now)
    scheduler.finished(first.id, now)


def test_first_request_starts_its_model_then_is_granted(ticket):
    scheduler = serial("a")
    t = ticket("a")
    assert scheduler.submit(t, 0.0) == [StartModel("a", evict=())]
    assert scheduler.snapshot(0.0).starting == ("a",)
    grant = grant_of(scheduler.model_ready("a", 3.0))
    assert grant.ticket_id == t.id and grant.model == "a"
    assert grant.decision.needs_swap and grant.decision.queue_wait_s == 0.0  # recorded at pick time
    assert scheduler.snapshot(3.0).running_ticket == t.id


def test_request_for_a_loaded_model_goes_through_the_scheduler_and_is_granted_at_once(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    t = ticket("a", arrival=5.0)
    effects = scheduler.submit(t, 5.0)
    assert grants(effects) == [t.id] and not starts(effects)
    assert not grant_of(effects).decision.needs_swap


def test_only_one_job_runs_at_a_time(ticket):
    scheduler = serial("a", "b", policy=SwapPolicy([SwapGroup("g", ("a", "b"), swap=False)], ["a", "b"]))
    loaded_with(scheduler, "a", ticket)
    first, second = ticket("a", arrival=1.0), ticket("a", arrival=1.0)
    assert grants(scheduler.submit(first, 1.0)) == [first.id]
    assert scheduler.submit(second, 1.0) == []
    assert scheduler.snapshot(1.0).waiting == 1
    assert grants(scheduler.finished(first.id, 2.0)) == [second.id]


def test_dispatch_is_non_preemptive_and_picks_by_priority_when_the_gpu_frees(ticket):
    scheduler = serial("a", settings=NO_BONUS)
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", priority=-100, arrival=1.0)
    scheduler.submit(running, 1.0)
    normal = ticket("a", priority=0, arrival=2.0)
    interactive = ticket("a", priority=100, arrival=3.0)
    assert scheduler.submit(normal, 2.0) == []
    assert scheduler.submit(interactive, 3.0) == []  # the batch job keeps the GPU
    assert grants(scheduler.finished(running.id, 10.0)) == [interactive.id]
    assert grants(scheduler.finished(interactive.id, 11.0)) == [normal.id]


def test_starting_a_model_evicts_what_its_group_cannot_share_the_gpu_with(ticket):
    scheduler = serial("a", "b")
    loaded_with(scheduler, "a", ticket)
    t = ticket("b", arrival=1.0)
    assert scheduler.submit(t, 1.0) == [StartModel("b", evict=("a",))]
    snapshot = scheduler.snapshot(1.0)
    assert snapshot.loaded == () and snapshot.starting == ("b",)


def test_affinity_serves_a_loaded_model_before_an_older_request_that_needs_a_swap(ticket):
    scheduler = serial("a", "b", settings=SerialSettings(60, 10))
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=0.0)
    scheduler.submit(running, 0.0)
    other = ticket("b", arrival=1.0)
    same = ticket("a", arrival=30.0)
    scheduler.submit(other, 1.0)
    scheduler.submit(same, 30.0)
    grant = grant_of(scheduler.finished(running.id, 60.0))
    assert grant.ticket_id == same.id
    decision = grant.decision
    assert decision.changed_by_affinity and not decision.changed_by_aging
    assert decision.runner_up_id == other.id
    assert decision.terms.affinity == 10 and decision.terms.aging == pytest.approx(0.5)
    assert decision.runner_up_score == pytest.approx(59 / 60)


def test_decision_records_the_pick(ticket):
    scheduler = serial("a", settings=SerialSettings(60, 10))
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=0.0)
    scheduler.submit(running, 0.0)
    batch = ticket("a", priority=-100, arrival=0.0)
    normal = ticket("a", priority=0, arrival=6000.0)
    scheduler.submit(batch, 0.0)
    scheduler.submit(normal, 6000.0)
    decision = grant_of(scheduler.finished(running.id, 6060.0)).decision
    assert decision.ticket_id == batch.id
    assert (decision.priority, decision.band, decision.scheduler) == (-100, Band.BATCH, "serial")
    assert decision.score == pytest.approx(-100 + 10 + 101)
    assert decision.queue_wait_s == 6060.0
    assert decision.runner_up_id == normal.id and decision.runner_up_score == pytest.approx(11.0)
    assert decision.changed_by_aging and not decision.changed_by_affinity
    assert decision.fifo_priority is None
    assert decision.explain() == (
        f"dispatched at score 11.0 = -100 priority + 10 affinity + 101 aging, "
        f"ahead of #{normal.id} at 11.0; aging changed the pick"
    )


def test_cancel_while_queued_never_starts_a_model(ticket):
    scheduler = serial("a", "b")
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=1.0)
    scheduler.submit(running, 1.0)
    waiting = ticket("b", arrival=2.0)
    scheduler.submit(waiting, 2.0)
    assert scheduler.cancel(waiting.id, 3.0) == [Dequeued(waiting.id)]
    assert scheduler.finished(running.id, 4.0) == []
    assert scheduler.snapshot(4.0).loaded == ("a",)


def test_cancel_while_its_model_starts_lets_the_start_finish_then_serves_the_next(ticket):
    scheduler = serial("a", "b")
    first = ticket("a", arrival=0.0)
    scheduler.submit(first, 0.0)
    second = ticket("a", arrival=1.0)
    scheduler.submit(second, 1.0)
    assert scheduler.cancel(first.id, 2.0) == [Dequeued(first.id)]  # no stop: the start carries on
    assert grants(scheduler.model_ready("a", 5.0)) == [second.id]


def test_cancel_of_the_running_request_frees_the_gpu(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    running, next_one = ticket("a"), ticket("a")
    scheduler.submit(running, 1.0)
    scheduler.submit(next_one, 1.0)
    assert grants(scheduler.cancel(running.id, 2.0)) == [next_one.id]
    assert scheduler.finished(running.id, 3.0) == []


def test_finished_and_cancel_are_idempotent_and_ignore_unknown_ids(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    t = ticket("a")
    scheduler.submit(t, 1.0)
    assert scheduler.finished(t.id, 2.0) == []
    assert scheduler.finished(t.id, 2.0) == []
    assert scheduler.cancel(t.id, 2.0) == []
    assert scheduler.cancel(12345, 2.0) == []
    assert scheduler.finished(12345, 2.0) == []


def test_failed_start_rejects_everyone_waiting_for_that_model_only(ticket):
    scheduler = serial("a", "b")
    first_a = ticket("a", arrival=0.0)
    scheduler.submit(first_a, 0.0)
    second_a, other_b = ticket("a", arrival=1.0), ticket("b", arrival=2.0)
    scheduler.submit(second_a, 1.0)
    scheduler.submit(other_b, 2.0)
    effects = scheduler.model_failed("a", "upstream command exited prematurely", 3.0)
    rejected = refused_by(effects)
    assert set(rejected) == {first_a.id, second_a.id}
    assert all(r.status == 503 and r.code == "model_start_failed" for r in rejected.values())
    assert "upstream command exited prematurely" in rejected[first_a.id].message
    assert starts(effects) == [StartModel("b", evict=())]
    assert grants(scheduler.model_ready("b", 4.0)) == [other_b.id]


def test_late_start_outcomes_for_a_stopped_model_are_ignored(ticket):
    scheduler = serial("a")
    t = ticket("a")
    scheduler.submit(t, 0.0)
    scheduler.unload(["a"], 1.0)
    assert scheduler.model_failed("a", "aborted", 1.5) == []
    assert scheduler.model_ready("a", 1.5) == []
    assert scheduler.snapshot(1.5).loaded == ()


def test_crash_of_a_loaded_model_forgets_it_and_the_next_request_restarts_it(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=1.0)
    scheduler.submit(running, 1.0)
    assert scheduler.model_stopped("a", 2.0) == []
    assert scheduler.snapshot(2.0).loaded == ()
    assert scheduler.finished(running.id, 2.1) == []  # the runtime reports the failed request
    assert scheduler.submit(ticket("a", arrival=3.0), 3.0) == [StartModel("a", evict=())]


def test_ttl_unloads_an_idle_model_after_its_idle_time(ticket):
    scheduler = serial("a", a={"ttl": 30})
    t = ticket("a")
    scheduler.submit(t, 0.0)
    scheduler.model_ready("a", 10.0)
    assert scheduler.next_deadline() is None  # serving: never unloaded mid-request
    scheduler.finished(t.id, 100.0)
    assert scheduler.next_deadline() == 130.0  # idle since the end of the last job
    assert scheduler.tick(129.0) == []
    assert scheduler.tick(130.0) == [StopModel("a", "ttl")]
    assert scheduler.next_deadline() is None
    assert scheduler.tick(200.0) == []


def test_ttl_counts_from_ready_when_no_job_ran_since(ticket):
    scheduler = serial("a", a={"ttl": 30})
    t = ticket("a")
    scheduler.submit(t, 0.0)
    scheduler.cancel(t.id, 1.0)
    scheduler.model_ready("a", 10.0)
    assert scheduler.next_deadline() == 40.0


def test_ttl_zero_never_unloads(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    assert scheduler.next_deadline() is None
    assert scheduler.tick(1e12) == []


def test_request_during_a_ttl_stop_waits_for_the_stop_then_restarts_the_model(ticket):
    scheduler = serial("a", a={"ttl": 5})
    loaded_with(scheduler, "a", ticket)
    assert scheduler.tick(5.0) == [StopModel("a", "ttl")]
    t = ticket("a", arrival=6.0)
    assert scheduler.submit(t, 6.0) == []  # starting now would race the stop
    assert scheduler.model_stopped("a", 7.0) == [StartModel("a", evict=())]
    assert grants(scheduler.model_ready("a", 8.0)) == [t.id]


def test_request_that_would_evict_a_stopping_model_waits_for_that_stop(ticket):
    scheduler = serial("a", "b", a={"ttl": 5})
    loaded_with(scheduler, "a", ticket)
    scheduler.tick(5.0)
    t = ticket("b", arrival=6.0)
    assert scheduler.submit(t, 6.0) == []
    assert scheduler.model_stopped("a", 7.0) == [StartModel("b", evict=())]


def test_cancel_while_waiting_for_a_stop_never_starts_a_model(ticket):
    scheduler = serial("a", a={"ttl": 5})
    loaded_with(scheduler, "a", ticket)
    scheduler.tick(5.0)
    t = ticket("a", arrival=6.0)
    scheduler.submit(t, 6.0)
    assert scheduler.cancel(t.id, 6.5) == [Dequeued(t.id)]
    assert scheduler.model_stopped("a", 7.0) == []


def test_unload_stops_the_starting_model_and_rejects_its_request_but_keeps_the_queue(ticket):
    scheduler = serial("a", "b")
    starting = ticket("a", arrival=0.0)
    scheduler.submit(starting, 0.0)
    queued = ticket("a", arrival=1.0)
    scheduler.submit(queued, 1.0)
    effects = scheduler.unload(["a"], 2.0)
    assert stops(effects) == [StopModel("a", "unload")]
    rejected = refused_by(effects)
    assert set(rejected) == {starting.id}
    assert (rejected[starting.id].status, rejected[starting.id].code) == (503, "model_unloaded")
    assert scheduler.snapshot(2.0).waiting == 0  # the queued one was picked next...
    assert scheduler.model_stopped("a", 3.0) == [StartModel("a", evict=())]  # ...and restarts it after the stop
    assert grants(scheduler.model_ready("a", 4.0)) == [queued.id]


def test_unload_all_stops_every_running_model_but_not_the_request_using_it(ticket):
    policy = SwapPolicy([SwapGroup("g", ("a", "b"), swap=False)], ["a", "b"])
    scheduler = serial("a", "b", policy=policy)
    loaded_with(scheduler, "a", ticket)
    loaded_with(scheduler, "b", ticket)
    running = ticket("a", arrival=1.0)
    scheduler.submit(running, 1.0)
    effects = scheduler.unload(None, 2.0)
    assert stops(effects) == [StopModel("a", "unload"), StopModel("b", "unload")]
    assert not refused_by(effects)
    assert scheduler.snapshot(2.0).running_ticket == running.id
    assert scheduler.unload(["a", "unknown-model"], 2.5) == []  # already stopping; unknown names ignored


def test_shutdown_rejects_every_waiter_and_stops_every_model(ticket):
    policy = SwapPolicy([SwapGroup("g", ("a", "b"), swap=False, exclusive=False)], ["a", "b"])
    scheduler = serial("a", "b", policy=policy)
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=1.0)
    scheduler.submit(running, 1.0)
    queued = [ticket("b", arrival=2.0), ticket("a", priority=100, arrival=3.0)]
    for t in queued:
        scheduler.submit(t, t.arrival)
    effects = scheduler.shutdown(4.0)
    rejected = refused_by(effects)
    assert set(rejected) == {t.id for t in queued}
    assert all((r.status, r.code) == (503, "shutting_down") for r in rejected.values())
    # b shares the GPU with a, so its start began beside a's job
    assert stops(effects) == [StopModel("a", "shutdown"), StopModel("b", "shutdown")]
    assert scheduler.finished(running.id, 5.0) == []
    late = ticket("a", arrival=6.0)
    assert refused_by(scheduler.submit(late, 6.0))[late.id].code == "shutting_down"
    assert scheduler.shutdown(7.0) == []


def test_shutdown_rejects_the_request_whose_model_is_starting(ticket):
    scheduler = serial("a")
    t = ticket("a")
    scheduler.submit(t, 0.0)
    effects = scheduler.shutdown(1.0)
    assert set(refused_by(effects)) == {t.id}
    assert stops(effects) == [StopModel("a", "shutdown")]
    assert scheduler.model_ready("a", 2.0) == []


def test_retune_applies_to_the_next_pick(ticket):
    scheduler = serial("a", settings=NO_BONUS)
    loaded_with(scheduler, "a", ticket)
    running = ticket("a", arrival=0.0)
    scheduler.submit(running, 0.0)
    old_batch = ticket("a", priority=-5, arrival=0.0)
    fresh = ticket("a", priority=0, arrival=100.0)
    scheduler.submit(old_batch, 0.0)
    scheduler.submit(fresh, 100.0)
    assert [t.id for t, _ in scheduler.ranked(100.0)] == [fresh.id, old_batch.id]  # -5 + 100/60 < 0
    assert scheduler.retune(SerialSettings(aging_divisor=10, swap_affinity_bonus=0), 100.0) == []
    assert [t.id for t, _ in scheduler.ranked(100.0)] == [old_batch.id, fresh.id]  # -5 + 10 > 0
    assert scheduler.snapshot(100.0).settings.aging_divisor == 10
    assert grants(scheduler.finished(running.id, 100.0)) == [old_batch.id]


def test_reprioritize_moves_a_queued_request(ticket):
    scheduler = serial("a", settings=NO_BONUS)
    loaded_with(scheduler, "a", ticket)
    running = ticket("a")
    scheduler.submit(running, 0.0)
    first, second = ticket("a", arrival=1.0), ticket("a", arrival=2.0)
    scheduler.submit(first, 1.0)
    scheduler.submit(second, 2.0)
    assert scheduler.reprioritize(second.id, 100, 3.0) == []
    assert scheduler.reprioritize(999, 100, 3.0) == []
    assert scheduler.snapshot(3.0).depth_by_band[Band.INTERACTIVE] == 1
    grant = grant_of(scheduler.finished(running.id, 4.0))
    assert grant.ticket_id == second.id and grant.decision.priority == 100
    assert grant.decision.queue_wait_s == 2.0  # arrival kept


def test_snapshot_reports_the_queue_by_band(ticket):
    scheduler = serial("a")
    loaded_with(scheduler, "a", ticket)
    running = ticket("a")
    scheduler.submit(running, 0.0)
    for priority, arrival in [(100, 10.0), (0, 4.0), (0, 8.0), (-98, 1.0)]:
        scheduler.submit(ticket("a", priority, arrival), arrival)
    snapshot = scheduler.snapshot(12.0)
    assert dict(snapshot.depth_by_band) == {Band.INTERACTIVE: 1, Band.NORMAL: 2, Band.BATCH: 1}
    assert dict(snapshot.oldest_wait_by_band) == {Band.INTERACTIVE: 2.0, Band.NORMAL: 8.0, Band.BATCH: 11.0}
    assert snapshot.waiting == 4 and snapshot.running_ticket == running.id and snapshot.running_tickets == (running.id,)
    assert snapshot.loaded == ("a",) and snapshot.starting == ()
    with pytest.raises(TypeError):
        snapshot.depth_by_band[Band.BATCH] = 0  # published to other threads: read-only


def test_empty_snapshot_has_every_band():
    snapshot = serial("a").snapshot(0.0)
    assert dict(snapshot.depth_by_band) == dict.fromkeys(Band, 0)
    assert dict(snapshot.oldest_wait_by_band) == dict.fromkeys(Band, 0.0)
    assert snapshot.running_ticket is None and snapshot.waiting == 0


def test_unknown_model_is_rejected_with_404(ticket):
    scheduler = serial("a")
    t = ticket("nope")
    rejection = refused_by(scheduler.submit(t, 0.0))[t.id]
    assert (rejection.status, rejection.code) == (404, "model_not_found")
    assert "'nope'" in rejection.message


def test_reusing_a_ticket_id_is_a_programming_error(ticket):
    scheduler = serial("a")
    t = ticket("a")
    scheduler.submit(t, 0.0)  # now starting its model
    with pytest.raises(ValueError, match="already submitted"):
        scheduler.submit(t, 1.0)


def test_grant_effects_carry_model_and_decision(ticket):
    scheduler = serial("a")
    t = ticket("a", priority=100)
    scheduler.submit(t, 0.0)
    (effect,) = scheduler.model_ready("a", 1.0)
    assert isinstance(effect, Grant) and effect.decision.band is Band.INTERACTIVE
    assert dequeued([effect]) == []


def test_a_rebuilt_queue_is_ranked_as_a_whole_before_an_idle_gpu_is_given_out(ticket):
    scheduler = serial("a", "b", settings=NO_BONUS)
    batch, interactive, unknown = ticket("a", priority=-100, arrival=0.0), ticket("b", priority=100, arrival=1.0), ticket("zz")
    effects = scheduler.submit_all([batch, interactive, unknown], 2.0)
    assert list(refused_by(effects)) == [unknown.id]
    assert starts(effects) == [StartModel("b", evict=())]  # one at a time submitted, the batch request would have taken the GPU
    assert grants(scheduler.model_ready("b", 3.0)) == [interactive.id]
    assert [t.id for t, _ in scheduler.ranked(3.0)] == [batch.id]


def test_an_unload_that_gives_up_a_swap_lets_no_lower_request_in_ahead_of_the_stopped_models_own(ticket):
    # b was stopped for a's start; the unload gives that start up. b may not start again until the given-up
    # start has ended, and the lower request for a must not take its turn meanwhile.
    scheduler = serial("a", "b", settings=SerialSettings(aging_divisor=0, swap_affinity_bonus=0))
    loaded_with(scheduler, "b", ticket)
    swap = ticket("a", priority=-100, arrival=1.0)
    assert starts(scheduler.submit(swap, 1.0)) == [StartModel("a", evict=("b",))]
    lower, higher = ticket("a", priority=-100, arrival=2.0), ticket("b", priority=-99, arrival=3.0)
    scheduler.submit(lower, 2.0)
    scheduler.submit(higher, 3.0)
    effects = scheduler.unload(None, 4.0)
    assert set(refused_by(effects)) == {swap.id}
    assert scheduler.snapshot(4.0).waiting == 2  # nobody was given a start that waits for a's stop
    assert scheduler.model_failed("a", "aborted", 5.0) == []
    assert scheduler.model_stopped("a", 6.0) == [StartModel("b", evict=())]
    assert grants(scheduler.model_ready("b", 7.0)) == [higher.id]
