"""WaitQueue: the serial order (priority + affinity + aging) and its bookkeeping."""

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from scheduling.core import Band, SerialSettings, Ticket, WaitQueue

from .scoring import best_first, exact_score

NO_BONUS = SerialSettings(aging_divisor=60, swap_affinity_bonus=0)


def queue_of(*tickets, divisor=60.0):
    queue = WaitQueue(divisor)
    for ticket in tickets:
        queue.add(ticket)
    return queue


def picked(queue, now, loaded=(), settings=NO_BONUS):
    return queue.pick(now, loaded, settings).ticket.id


def test_empty_queue_picks_nothing():
    assert WaitQueue().pick(0.0, (), NO_BONUS) is None


def test_higher_priority_goes_first():
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "a", 100, 5.0), Ticket(3, "a", -100, 1.0))
    assert picked(queue, 5.0) == 2


def test_bonus_zero_and_uniform_priority_is_exact_fifo():
    arrivals = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    queue = queue_of(*(Ticket(i, "abc"[i % 3], 7, a) for i, a in enumerate(arrivals)))
    order = []
    while len(queue):
        order.append(picked(queue, 100.0, loaded=("a",)))
        queue.remove(order[-1])
    assert order == sorted(range(len(arrivals)), key=lambda i: arrivals[i])


def test_equal_scores_keep_arrival_order():
    # At divisor 60, p=1 arriving at 70 scores exactly what p=0 arriving at 10 scores.
    early, late = Ticket(1, "a", 0, 10.0), Ticket(2, "a", 1, 70.0)
    for now in (70.0, 100.0, 12345.0):
        assert picked(queue_of(late, early), now) == 1
    assert picked(queue_of(late, Ticket(1, "a", 0, 10.25)), 70.0) == 2


def test_batch_overtakes_normal_only_after_about_100_minutes_at_divisor_60():
    batch = Ticket(1, "a", -100, 0.0)
    for waited in (60.0, 3600.0, 5999.0):
        fresh_normal = Ticket(2, "a", 0, waited)
        assert picked(queue_of(batch, fresh_normal), waited) == 2
    # Exactly 100 minutes: equal scores, and the batch job arrived first.
    assert picked(queue_of(batch, Ticket(2, "a", 0, 6000.0)), 6000.0) == 1
    assert picked(queue_of(batch, Ticket(2, "a", 0, 6001.0)), 6001.0) == 1


def test_divisor_zero_disables_aging():
    queue = queue_of(Ticket(1, "a", -100, 0.0), Ticket(2, "a", 0, 1e9), divisor=0)
    pick = queue.pick(1e9, (), SerialSettings(aging_divisor=0, swap_affinity_bonus=0))
    assert pick.ticket.id == 2
    assert pick.terms.aging == 0.0
    assert pick.runner_up_score == -100


def test_fractional_divisor_ages_faster():
    # At 0.5 s per point, 10 s of waiting is worth 20 points.
    half = SerialSettings(aging_divisor=0.5, swap_affinity_bonus=0)
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "a", 19, 10.0), divisor=0.5)
    assert queue.pick(10.0, (), half).ticket.id == 1
    assert queue.pick(10.0, (), half).terms.aging == 20.0
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "a", 21, 10.0), divisor=0.5)
    assert queue.pick(10.0, (), half).ticket.id == 2


def test_affinity_keeps_a_same_model_request_ahead_of_an_older_one_in_the_same_band():
    older_other = Ticket(1, "b", 0, 0.0)
    newer_loaded = Ticket(2, "a", 0, 60.0)
    queue = queue_of(older_other, newer_loaded)
    pick = queue.pick(60.0, ("a",), SerialSettings(aging_divisor=60, swap_affinity_bonus=10))
    assert pick.ticket.id == 2
    assert pick.terms.affinity == 10
    assert pick.changed_by_affinity and not pick.changed_by_aging


def test_affinity_is_bounded_so_aging_eventually_wins():
    older_other = Ticket(1, "b", 0, 0.0)
    newer_loaded = Ticket(2, "a", 0, 660.0)  # 11 minutes later: more than the bonus of 10
    pick = queue_of(older_other, newer_loaded).pick(660.0, ("a",), SerialSettings(60, 10))
    assert pick.ticket.id == 1


def test_bonus_and_tier_offsets_never_lift_batch_above_interactive():
    for bonus in (0, 10, 99):
        settings = SerialSettings(aging_divisor=60, swap_affinity_bonus=bonus)
        max_batch_on_loaded_model = Ticket(1, "loaded", -100 + 2, 0.0)
        free_interactive_needing_swap = Ticket(2, "cold", 100, 0.0)
        queue = queue_of(max_batch_on_loaded_model, free_interactive_needing_swap)
        assert queue.pick(0.0, ("loaded",), settings).ticket.id == 2


def test_default_bonus_keeps_a_max_tier_batch_job_below_normal():
    queue = queue_of(Ticket(1, "loaded", -100 + 2, 0.0), Ticket(2, "cold", 0, 0.0))
    assert queue.pick(0.0, ("loaded",), SerialSettings()).ticket.id == 2


def test_pick_reports_terms_runner_up_and_which_terms_changed_it():
    settings = SerialSettings(aging_divisor=60, swap_affinity_bonus=10)
    # 1: interactive, 2 min old, model not loaded -> 100 + 0 + 2 = 102
    # 2: interactive, fresh, model loaded          -> 100 + 10 + 0 = 110
    # 3: normal, very old, model loaded            -> 0 + 10 + 120 = 130
    queue = queue_of(Ticket(1, "b", 100, 7080.0), Ticket(2, "a", 100, 7200.0), Ticket(3, "a", 0, 0.0))
    pick = queue.pick(7200.0, ("a",), settings)
    assert pick.ticket.id == 3
    assert (pick.terms.priority, pick.terms.affinity, pick.terms.aging) == (0, 10, 120.0)
    assert pick.score == 130.0
    assert pick.runner_up.id == 2 and pick.runner_up_score == 110.0
    assert pick.changed_by_aging  # without aging: 2 (110) beats 3 (10)
    assert not pick.changed_by_affinity  # without affinity: 3 (120) still beats 1 (102)


def test_runner_up_can_be_deep_in_the_overall_order():
    settings = SerialSettings(aging_divisor=60, swap_affinity_bonus=10)
    # Overall (no affinity) order: 1, 2, 3 (all model a, loaded), then 4 (model b).
    queue = queue_of(
        Ticket(1, "a", 5, 0.0), Ticket(2, "a", 4, 0.0), Ticket(3, "a", 3, 0.0), Ticket(4, "b", 2, 0.0)
    )
    pick = queue.pick(0.0, ("a",), settings)
    assert (pick.ticket.id, pick.runner_up.id) == (1, 2)
    assert not pick.changed_by_affinity and not pick.changed_by_aging


def test_single_ticket_has_no_runner_up():
    pick = queue_of(Ticket(1, "a", 0, 0.0)).pick(0.0, (), NO_BONUS)
    assert pick.runner_up is None and pick.runner_up_score is None


def test_remove_and_membership():
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "a", 5, 1.0))
    assert 2 in queue and len(queue) == 2 and queue.get(2).priority == 5
    assert queue.remove(2).id == 2
    assert queue.remove(2) is None
    assert 2 not in queue and queue.get(2) is None
    assert picked(queue, 1.0) == 1


def test_adding_a_waiting_id_twice_is_refused():
    queue = queue_of(Ticket(1, "a", 0, 0.0))
    try:
        queue.add(Ticket(1, "b", 0, 1.0))
    except ValueError as error:
        assert "#1 is already waiting" in str(error)
    else:
        raise AssertionError("duplicate id accepted")


def test_reprioritize_keeps_arrival_so_aging_carries_on():
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "a", 0, 100.0))
    assert queue.reprioritize(2, 10).priority == 10
    assert picked(queue, 100.0) == 2
    assert queue.get(2).arrival == 100.0
    queue.reprioritize(2, -10)
    assert picked(queue, 100.0) == 1
    assert queue.reprioritize(99, 5) is None


def test_retune_to_a_new_divisor_reorders_consistently():
    queue = queue_of(Ticket(1, "a", -1, 0.0), Ticket(2, "a", 0, 50.0))
    assert picked(queue, 50.0, settings=SerialSettings(60, 0)) == 2  # -1 + 50/60 < 0
    assert picked(queue, 50.0, settings=SerialSettings(10, 0)) == 1  # -1 + 5 > 0
    assert picked(queue, 50.0, settings=SerialSettings(0, 0)) == 2
    now, loaded, settings = 50.0, (), SerialSettings(10, 0)
    ranked = [t.id for t, _ in queue.ranked(now, loaded, settings)]
    assert ranked == [t.id for t in best_first([queue.get(1), queue.get(2)], now, loaded, settings)]


def test_ranked_lists_everything_best_first_with_terms():
    settings = SerialSettings(60, 10)
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "b", 100, 60.0), Ticket(3, "a", -100, 0.0))
    ranked = queue.ranked(120.0, ("a",), settings)
    assert [t.id for t, _ in ranked] == [2, 1, 3]
    assert [terms.total for _, terms in ranked] == [101.0, 12.0, -88.0]


def test_band_depths_and_oldest_arrival():
    queue = queue_of(
        Ticket(1, "a", 100, 5.0), Ticket(2, "a", 0, 3.0), Ticket(3, "a", 0, 1.0), Ticket(4, "a", -98, 2.0)
    )
    assert queue.band_depths() == {Band.INTERACTIVE: 1, Band.NORMAL: 2, Band.BATCH: 1}
    assert queue.band_oldest_arrival() == {Band.INTERACTIVE: 5.0, Band.NORMAL: 1.0, Band.BATCH: 2.0}
    queue.remove(3)
    queue.remove(1)
    assert queue.band_depths() == {Band.INTERACTIVE: 0, Band.NORMAL: 1, Band.BATCH: 1}
    assert queue.band_oldest_arrival() == {Band.INTERACTIVE: None, Band.NORMAL: 3.0, Band.BATCH: 2.0}


def test_tickets_for_a_model():
    queue = queue_of(Ticket(1, "a", 0, 0.0), Ticket(2, "b", 0, 1.0), Ticket(3, "a", 5, 2.0))
    queue.remove(1)
    assert [t.id for t in queue.tickets_for("a")] == [3]
    assert queue.tickets_for("nobody") == []


def test_remove_all_empties_the_queue_in_arrival_order():
    queue = queue_of(Ticket(1, "a", 0, 3.0), Ticket(2, "b", 100, 1.0), Ticket(3, "a", 0, 2.0))
    assert [t.id for t in queue.remove_all()] == [2, 3, 1]
    assert len(queue) == 0 and queue.pick(5.0, (), NO_BONUS) is None
    assert queue.band_depths() == dict.fromkeys(Band, 0)


def test_many_removals_keep_the_order_right():
    queue = WaitQueue(60)
    for i in range(1, 1001):
        queue.add(Ticket(i, "ab"[i % 2], i % 7, float(i)))
    for i in range(1, 1001):
        if i % 10:
            queue.remove(i)
    survivors = [queue.get(i) for i in range(10, 1001, 10)]
    expected = best_first(survivors, 2000.0, ("a",), SerialSettings(60, 10))
    assert [t for t, _ in queue.ranked(2000.0, ("a",), SerialSettings(60, 10))] == expected
    assert queue.pick(2000.0, ("a",), SerialSettings(60, 10)).ticket == expected[0]
    assert queue.band_depths()[Band.NORMAL] == 100


tickets_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([-100, -99, -98, -1, 0, 1, 2, 50, 100, 101]),
        st.integers(0, 4000).map(lambda q: q / 4),
    ),
    min_size=1,
    max_size=40,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    tickets=tickets_strategy,
    removals=st.sets(st.integers(0, 39)),
    loaded=st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=3),
    divisor=st.sampled_from([0, 0.5, 1, 60, 90]),
    bonus=st.sampled_from([0, 1, 10, 99]),
    waited=st.integers(0, 40000).map(lambda q: q / 4),
)
def test_pick_matches_brute_force(tickets, removals, loaded, divisor, bonus, waited):
    settings = SerialSettings(divisor, bonus)
    queue = WaitQueue(divisor)
    all_tickets = [Ticket(i + 1, model, priority, arrival) for i, (model, priority, arrival) in enumerate(tickets)]
    for ticket in all_tickets:
        queue.add(ticket)
    for index in removals:
        if index < len(all_tickets):
            queue.remove(index + 1)
    waiting = [t for t in all_tickets if t.id in queue]
    now = 1000.0 + waited
    pick = queue.pick(now, loaded, settings)
    if not waiting:
        assert pick is None
        return
    order = best_first(waiting, now, loaded, settings)
    assert pick.ticket == order[0]
    assert pick.score == pytest.approx(float(exact_score(order[0], now, loaded, settings)))
    if len(order) > 1:
        assert pick.runner_up == order[1]
    else:
        assert pick.runner_up is None
    no_aging = sorted(waiting, key=lambda t: (-(t.priority + (bonus if t.model in loaded else 0)), t.arrival, t.id))
    no_affinity = best_first(waiting, now, (), settings)
    assert pick.changed_by_aging == (no_aging[0] != order[0])
    assert pick.changed_by_affinity == (no_affinity[0] != order[0])
    assert [t for t, _ in queue.ranked(now, loaded, settings)] == order
