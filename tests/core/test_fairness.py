"""Fair share between API keys (`fairness: keys`): keys take weighted turns among requests for the
same model at the same priority; every other ordering is the scheduler's without it."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from scheduling.core import SerialScheduler, SerialSettings, Ticket
from scheduling.core.mentions import plain, told

from .harness import grant_of, grants, one_at_a_time, specs
from .scoring import best_first
from .search_effort import property_settings

FAIR = SerialSettings(fairness="keys")


def busy(settings=FAIR, models=("a",)):
    """A scheduler whose model `a` is ready and running ticket #1 (key None), so what follows queues."""
    scheduler = SerialScheduler(specs(*models), one_at_a_time(*models), settings)
    scheduler.submit(Ticket(1, "a", 0, 0.0), 0.0)
    scheduler.model_ready("a", 0.0)
    return scheduler


def served_in_turn(scheduler, first_running=1, now=10.0):
    """Finish the running request, then each granted one, until nothing waits: ids in grant order."""
    order, running = [], first_running
    while True:
        granted = grants(scheduler.finished(running, now))
        if not granted:
            return order
        (running,) = granted
        order.append(running)


def test_with_a_model_busy_four_of_key_a_then_two_of_key_b_run_a_b_a_b_a_a():
    scheduler = busy()
    keys = {}
    for ticket_id, key in enumerate(["a"] * 4 + ["b"] * 2, start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key), float(ticket_id))
        keys[ticket_id] = key
    assert [keys[t] for t in served_in_turn(scheduler)] == ["a", "b", "a", "b", "a", "a"]


def test_without_fairness_the_same_requests_run_in_arrival_order():
    scheduler = busy(SerialSettings())
    for ticket_id, key in enumerate(["a"] * 4 + ["b"] * 2, start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key), float(ticket_id))
    assert served_in_turn(scheduler) == [2, 3, 4, 5, 6, 7]


def test_a_key_of_weight_two_gets_two_turns_to_one():
    scheduler = busy()
    keys = {}
    for ticket_id, (key, weight) in enumerate([("a", 1)] * 4 + [("b", 2)] * 4, start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key, weight=weight), float(ticket_id))
        keys[ticket_id] = key
    assert "".join(keys[t] for t in served_in_turn(scheduler)) == "abbabbaa"


def test_requests_without_a_key_row_take_turns_as_one_key():
    scheduler = busy()
    keys = {}
    for ticket_id, key in enumerate([None, None, None, "a"], start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key), float(ticket_id))
        keys[ticket_id] = key
    assert [keys[t] for t in served_in_turn(scheduler)] == [None, "a", None, None]


def test_fairness_never_reorders_across_priorities():
    scheduler = busy()
    scheduler.submit(Ticket(2, "a", 0, 1.0, key="a"), 1.0)
    scheduler.submit(Ticket(3, "a", 0, 2.0, key="a"), 2.0)
    scheduler.submit(Ticket(4, "a", 1, 3.0, key="a"), 3.0)  # a tier offset inside the band still counts
    scheduler.submit(Ticket(5, "a", 0, 4.0, key="b"), 4.0)
    assert served_in_turn(scheduler, now=4.0) == [4, 2, 5, 3]


def test_the_decision_names_the_fair_turn_and_the_older_request_it_went_before():
    scheduler = busy()
    scheduler.submit(Ticket(2, "a", 0, 1.0, key="a"), 1.0)
    scheduler.submit(Ticket(3, "a", 0, 2.0, key="a"), 2.0)
    scheduler.submit(Ticket(4, "a", 0, 3.0, key="b"), 3.0)
    first = grant_of(scheduler.finished(1, 4.0)).decision
    assert first.ticket_id == 2 and not first.changed_by_fairness and "fair share" not in first.explain()
    turn = grant_of(scheduler.finished(2, 4.0)).decision
    assert turn.ticket_id == 4 and turn.changed_by_fairness
    assert turn.runner_up_id == 3 and turn.runner_up_score > turn.score  # #3 waited longer
    assert "fair share between API keys: #4 (of key 'b') had its turn before #3 (of key 'a')" in plain(turn.explain())
    as_b = told(turn.explain(), lambda model: True, {"b"}.__contains__)  # the key of the request: only its own name
    assert "fair share between API keys: #4 (of key 'b') had its turn before #3 (of another key)" in as_b


def test_turning_fairness_on_while_requests_wait_gives_them_turns_in_arrival_order():
    scheduler = busy(SerialSettings())
    keys = {}
    for ticket_id, key in enumerate(["a", "a", "a", "b"], start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key), float(ticket_id))
        keys[ticket_id] = key
    scheduler.retune(FAIR, 6.0)
    assert [keys[t] for t in served_in_turn(scheduler)] == ["a", "b", "a", "a"]


def test_a_cancelled_or_reprioritized_request_gives_up_its_turn():
    scheduler = busy()
    for ticket_id, key in enumerate(["a", "a", "b", "b"], start=2):
        scheduler.submit(Ticket(ticket_id, "a", 0, float(ticket_id), key=key), float(ticket_id))
    scheduler.cancel(4, 6.0)  # b's first
    scheduler.reprioritize(3, -1, 6.0)  # a's second, now below the rest
    assert served_in_turn(scheduler, now=6.0) == [2, 5, 3]


class KeyedQueue:
    """Requests of named keys queued behind the busy model's #1, served one at a time as each ends."""

    def __init__(self) -> None:
        self.scheduler, self.keys, self.running, self.now = busy(), {}, 1, 1.0

    def send(self, key: str, count: int = 1) -> list[int]:
        sent = []
        for _ in range(count):
            ticket_id = len(self.keys) + 2
            self.now += 1
            self.keys[ticket_id] = key
            self.scheduler.submit(Ticket(ticket_id, "a", 0, self.now, key=key), self.now)
            sent.append(ticket_id)
        return sent

    def leave(self, ticket_ids) -> None:
        self.now += 1
        self.scheduler.cancel_all(ticket_ids, self.now)

    def serve(self, turns: int | None = None) -> str:
        """The keys of the next `turns` requests served (all that wait when None), in order."""
        order = ""
        while turns is None or len(order) < turns:
            self.now += 1
            granted = grants(self.scheduler.finished(self.running, self.now))
            if not granted:
                break
            (self.running,) = granted
            order += self.keys[self.running]
        return order


def test_requests_that_leave_without_their_turn_cost_their_key_nothing():
    """Key b's three requests leave: its next one goes as soon as if they had never been sent."""
    never_sent = KeyedQueue()
    never_sent.send("a", 4)
    never_sent.send("b")
    assert never_sent.serve() == "abaaa"
    left = KeyedQueue()
    left.send("a", 4)
    left.leave(left.send("b", 3))
    left.send("b")
    assert left.serve() == "abaaa"


def test_a_request_leaving_from_the_middle_of_its_keys_backlog_moves_the_later_ones_up():
    first_left = KeyedQueue()
    first_left.send("a", 4)
    b_first, *_ = first_left.send("b", 3)
    first_left.leave([b_first])
    assert first_left.serve() == "ababaa"  # as if b had sent two


def test_a_key_back_after_being_away_takes_turns_with_the_others_not_several_in_a_row():
    """Away, a key banks no turns: it starts at the group's clock, where the turns being taken are, not where its
    last turn ended long ago, nor where the clock stood when the group began."""
    queue = KeyedQueue()
    queue.send("a", 8)
    queue.send("b")
    assert queue.serve(5) == "abaaa"
    queue.send("b", 4)
    assert queue.serve() == "babababa"


def test_a_weight_below_one_is_refused():
    with pytest.raises(ValueError, match="weight 0 is below 1"):
        Ticket(1, "a", 0, 0.0, key="a", weight=0)


# -- properties ---------------------------------------------------------------------------------

KEYS = st.sampled_from([None, "a", "b", "c"])
WEIGHTS = {None: 1, "a": 1, "b": 2, "c": 5}
# Steps: ("arrive", key, priority) or ("finish",); time moves on a whole second each step.
STEPS = st.lists(
    st.one_of(st.tuples(st.just("arrive"), KEYS, st.sampled_from([-100, -1, 0, 0, 0, 1, 100])),
              st.tuples(st.just("finish"))),
    max_size=60,
)


def drive(settings, steps, keyed=True, check=None):
    """Run `steps` on one model with one slot: ids in grant order. `check(granted, waiting, now)` sees
    each grant with what was waiting just before it."""
    scheduler = busy(settings)
    waiting: dict[int, Ticket] = {}
    running, order = 1, []

    def granted(effects, now, before):
        nonlocal running
        for ticket_id in grants(effects):
            running = ticket_id
            order.append(ticket_id)
            if check is not None:
                check(before[ticket_id], list(before.values()), now)
            waiting.pop(ticket_id)

    for step, action in enumerate(steps + [("finish",)] * len(steps), start=1):
        now = float(step)
        if action[0] == "arrive":
            _, key, priority = action
            ticket = Ticket(step + 1, "a", priority, now, key=key if keyed else None,
                            weight=WEIGHTS[key] if keyed else 1)
            waiting[ticket.id] = ticket
            granted(scheduler.submit(ticket, now), now, dict(waiting))
        elif running is not None:
            finishing, running = running, None
            granted(scheduler.finished(finishing, now), now, dict(waiting))
    assert not waiting
    return order


@property_settings(300)
@given(steps=STEPS, divisor=st.sampled_from([0, 1, 60]))
def test_with_fairness_off_the_order_is_exactly_that_of_the_scheduler_without_the_setting(steps, divisor):
    absent = drive(SerialSettings(aging_divisor=divisor), steps, keyed=False)
    off = drive(SerialSettings(aging_divisor=divisor, fairness="off"), steps)
    assert off == absent


@property_settings(300)
@given(steps=STEPS, divisor=st.sampled_from([0, 1, 60]))
def test_fair_share_never_lets_a_lower_priority_overtake_only_equal_requests_trade_places(steps, divisor):
    settings = SerialSettings(aging_divisor=divisor, fairness="keys")

    def check(granted, waiting, now):
        best = best_first(waiting, now, {"a"}, settings)[0]
        assert granted.priority == best.priority, f"#{granted.id} went before #{best.id}, which scored higher"

    drive(settings, steps, check=check)


@property_settings(300)
@given(steps=STEPS)
def test_no_key_starves_each_other_key_goes_at_most_its_share_of_turns_before_it(steps):
    """While a request is its key's oldest waiting one in its group, each other key j is served at
    most ⌊w_j / w_k⌋ + 1 times before it (start-time fair queueing's bound); aging is off, so only
    fair share orders the group."""
    settings = SerialSettings(aging_divisor=0, fairness="keys")
    served_since: dict[int, dict] = {}  # a key's oldest waiting request -> other keys' grants since

    def check(granted, waiting, now):
        heads = {}
        for ticket in sorted(waiting, key=lambda t: t.arrival):
            heads.setdefault((ticket.priority, ticket.key), ticket)
        for head in heads.values():
            counts = served_since.setdefault(head.id, {})
            if head.id != granted.id and head.priority == granted.priority and head.key != granted.key:
                counts[granted.key] = counts.get(granted.key, 0) + 1
                limit = WEIGHTS[granted.key] // WEIGHTS[head.key] + 1
                assert counts[granted.key] <= limit, (
                    f"key {granted.key!r} went {counts[granted.key]} times before #{head.id} of key {head.key!r}")

    drive(settings, steps, check=check)


# ("arrive", key, priority, leaves) or ("finish",): a request that leaves does so at the next finish, before it, so
# no grant is decided while it waits.
LEAVING_STEPS = st.lists(
    st.one_of(st.tuples(st.just("arrive"), st.sampled_from(["a", "b", "c"]), st.sampled_from([0, 0, 0, 1]),
                        st.booleans()),
              st.tuples(st.just("finish"))),
    max_size=40,
)


def drive_leaving(steps, sent_only: bool) -> list[int]:
    """Run `steps` (`LEAVING_STEPS`) with fair share on: ids in grant order. With `sent_only`, a request that would
    leave is never sent at all."""
    scheduler, running, order, leaving = busy(), 1, [], []
    for step, action in enumerate(steps + [("finish",)] * len(steps), start=1):
        now = float(step)
        if action[0] == "arrive":
            _, key, priority, leaves = action
            if leaves and running is not None and sent_only:
                continue  # it would queue, then leave
            granted = grants(scheduler.submit(Ticket(step + 1, "a", priority, now, key=key, weight=WEIGHTS[key]), now))
            if leaves and running is not None:
                leaving.append(step + 1)
        else:
            scheduler.cancel_all(leaving, now)
            leaving.clear()
            granted = grants(scheduler.finished(running, now)) if running is not None else []
            running = None
        for ticket_id in granted:
            running = ticket_id
            order.append(ticket_id)
    return order


@property_settings(300)
@given(steps=LEAVING_STEPS)
@example(steps=[("arrive", "c", 0, False)] * 3 + [("arrive", "b", 0, False), ("finish",), ("finish",),
                ("arrive", "b", 0, True), ("finish",), ("arrive", "b", 0, False)])  # b's leaving one gives back ½
def test_requests_that_leave_without_their_turn_change_no_one_elses_turn_whatever_the_weights(steps):
    """A key is charged only for the turns it took: requests that queue and leave before their turn (keys of weights
    1, 2 and 5) leave every other request served in the order it would have been had they never been sent."""
    assert drive_leaving(steps, sent_only=False) == drive_leaving(steps, sent_only=True)
