"""The replay of recorded traffic: synthetic histories whose answer is known, and a history the core
itself produced, which a replay with the same settings must reproduce exactly."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import (
    Grant,
    ModelSpec,
    SerialScheduler,
    SerialSettings,
    StartModel,
    StopModel,
    SwapGroup,
    SwapPolicy,
    Ticket,
)
from scheduling.core.replay import Recorded, Setup, compare, fidelity, replay, waits_by_band

from .harness import specs

BATCH, NORMAL, INTERACTIVE = -100, 0, 100


def one_gpu(*models: str, ttl: float = 0.0) -> Setup:
    return Setup("serial", {m: ModelSpec(m, ttl=ttl) for m in models}, SwapPolicy([], models))


def waits(result) -> dict[int, float | None]:
    return {rid: r.wait_s for rid, r in result.requests.items()}


def test_interactive_requests_behind_a_batch_job_wait_for_its_end():
    records = [
        Recorded(1, "chat", BATCH, 0.0, service_s=100.0, load_s=10.0, dispatched_s=10.0),
        Recorded(2, "chat", INTERACTIVE, 20.0, service_s=5.0),
        Recorded(3, "chat", INTERACTIVE, 30.0, service_s=5.0),
    ]
    result = replay(records, one_gpu("chat"), SerialSettings())
    assert waits(result) == {1: 10.0, 2: 90.0, 3: 85.0}
    assert [result.requests[i].order for i in (1, 2, 3)] == [1, 2, 3]
    assert result.swaps == 1 and result.requests[1].needed_swap and not result.requests[2].needed_swap
    assert result.busy_share == 1.0
    by_band = waits_by_band(result)
    assert (by_band["interactive"].p50, by_band["interactive"].max, by_band["normal"].count) == (85.0, 90.0, 0)


def test_a_lower_aging_divisor_lets_an_old_batch_request_overtake_a_fresh_normal_one():
    records = [
        Recorded(1, "chat", NORMAL, 0.0, service_s=100.0),
        Recorded(2, "chat", BATCH, 1.0, service_s=10.0),
        Recorded(3, "chat", NORMAL, 90.0, service_s=10.0),
    ]
    setup = one_gpu("chat")
    before = replay(records, setup, SerialSettings(aging_divisor=60), warm=["chat"])
    after = replay(records, setup, SerialSettings(aging_divisor=0.5), warm=["chat"])
    assert waits(before) == {1: 0.0, 2: 109.0, 3: 10.0} and before.reorders_aging == 0
    assert waits(after) == {1: 0.0, 2: 99.0, 3: 20.0} and after.reorders_aging == 1
    assert before.swaps == after.swaps == 0  # chat was up when the window began
    comparison = compare(before, after)
    assert [(c.id, c.before_s, c.after_s) for c in comparison.changed_most] == [(2, 109.0, 99.0), (3, 10.0, 20.0)]
    assert comparison.bands["batch"][0].max == 109.0 and comparison.bands["batch"][1].max == 99.0


def test_swap_affinity_keeps_alternating_requests_from_swapping_at_each_one():
    records = [
        Recorded(1, "a", NORMAL, 0.0, service_s=100.0),
        Recorded(2, "b", NORMAL, 1.0, service_s=10.0, load_s=5.0, dispatched_s=105.0),
        Recorded(3, "a", NORMAL, 2.0, service_s=10.0, load_s=5.0, dispatched_s=120.0),
        Recorded(4, "b", NORMAL, 3.0, service_s=10.0),
        Recorded(5, "a", NORMAL, 4.0, service_s=10.0),
    ]
    setup = one_gpu("a", "b")
    with_bonus = replay(records, setup, SerialSettings(swap_affinity_bonus=10), warm=["a"])
    without = replay(records, setup, SerialSettings(swap_affinity_bonus=0), warm=["a"])
    assert with_bonus.swaps == 1 and with_bonus.reorders_affinity >= 1
    assert [rid for rid, _ in sorted(with_bonus.requests.items(), key=lambda kv: kv[1].order)] == [1, 3, 5, 2, 4]
    assert without.swaps == 4 and without.reorders_affinity == 0
    assert [rid for rid, _ in sorted(without.requests.items(), key=lambda kv: kv[1].order)] == [1, 2, 3, 4, 5]


def test_what_the_recording_cannot_tell_is_handled_and_counted():
    records = [
        Recorded(1, "chat", NORMAL, 0.0, service_s=100.0),
        Recorded(2, "chat", NORMAL, 10.0, left_after_s=20.0),  # left while queued, at 30 s
        Recorded(3, "chat", NORMAL, 20.0, max_wait_s=30.0),  # refused at 50 s
        Recorded(4, "chat", NORMAL, 40.0, left_after_s=100.0),  # sent at 100 s, cut at 140 s
        Recorded(5, "chat", NORMAL, 50.0),  # in flight when the window ended: the median
        Recorded(9, "chat", NORMAL, 60.0, left_after_s=500.0, ran_s=150.0),  # cut after 150 s: at least that
        Recorded(6, "gone", NORMAL, 50.0, service_s=1.0),
        Recorded(7, "chat", NORMAL, 50.0, refused="failed start"),
        Recorded(8, "chat", NORMAL, 50.0, refused="refused"),
    ]
    result = replay(records, one_gpu("chat"), SerialSettings(), warm=["chat"])
    outcomes = {rid: r.outcome for rid, r in result.requests.items()}
    assert outcomes == {1: "served", 2: "left", 3: "timed_out", 4: "served", 5: "served", 9: "served"}
    assert result.requests[5].dispatched_s == 140.0  # 4's job was cut when its client left
    assert result.requests[9].dispatched_s == 240.0  # 5 ran the median, 100 s
    handling = result.handling
    assert (handling.left, handling.timed_out, handling.unconfigured) == (1, 1, 1)
    assert (handling.failed_starts, handling.refused_recorded) == (1, 1)
    assert handling.service_assumed == 3  # 4's, cut; 5's: 100 s, the median of the one known; 9's: 150 s
    assert result.busy_share == 1.0 and result.swaps == 0
    assert handling.loads_assumed == 0


def test_a_model_never_loaded_in_the_recording_loads_in_the_median_of_all_loads_and_is_counted():
    records = [
        Recorded(1, "a", NORMAL, 0.0, service_s=1.0, load_s=4.0, dispatched_s=4.0),
        Recorded(2, "b", NORMAL, 10.0, service_s=1.0),
    ]
    result = replay(records, one_gpu("a", "b"), SerialSettings())
    assert waits(result) == {1: 4.0, 2: 4.0} and result.handling.loads_assumed == 1


def test_a_model_idle_past_its_ttl_is_unloaded_and_started_again():
    records = [
        Recorded(1, "chat", NORMAL, 0.0, service_s=1.0, load_s=2.0, dispatched_s=2.0),
        Recorded(2, "chat", NORMAL, 5.0, service_s=1.0),  # within the ttl of 10 s: no start
        Recorded(3, "chat", NORMAL, 100.0, service_s=1.0),  # unloaded at 16 s: started again
    ]
    result = replay(records, one_gpu("chat", ttl=10.0), SerialSettings())
    assert waits(result) == {1: 2.0, 2: 0.0, 3: 2.0} and result.swaps == 2


def test_fidelity_counts_only_requests_that_waited_together():
    records = [
        Recorded(1, "chat", NORMAL, 0.0, service_s=10.0, dispatched_s=0.0),
        Recorded(2, "chat", NORMAL, 1.0, service_s=10.0, dispatched_s=20.0),  # recorded after 3
        Recorded(3, "chat", NORMAL, 2.0, service_s=10.0, dispatched_s=10.0),
        Recorded(4, "chat", NORMAL, 3.0, service_s=10.0, dispatched_s=30.0),
        Recorded(5, "chat", NORMAL, 100.0, service_s=1.0, dispatched_s=100.0),  # waited with nobody
    ]
    result = replay(records, one_gpu("chat"), SerialSettings(), warm=["chat"])
    measured = fidelity(records, result)
    # 1 was sent at once. Pairs that waited together: (2,3), (2,4), (3,4); the replay sends 2 before 3.
    assert (measured.compared, measured.pairs, measured.same_order) == (5, 3, 2 / 3)
    assert measured.wait_error_s == 0.0  # 2 and 3 are 10 s off, the other three exact


# -- a history the core produced, replayed with the same settings --------------------------------

MODELS = ("chat", "coder", "embed")
GROUPS = [
    SwapGroup("gpu", ("chat", "coder")),
    SwapGroup("embeddings", ("embed",), swap=False, exclusive=False, persistent=True),
]


class Recording:
    """The scheduler run by the runtime's rules, writing down what the service's rows would hold."""

    def __init__(self, settings_: SerialSettings, loads: dict[str, list[float]], scheduler=None) -> None:
        self.scheduler = scheduler or SerialScheduler(specs(*MODELS), SwapPolicy(GROUPS, MODELS), settings_)
        self.loads = {m: list(draws) for m, draws in loads.items()}
        self.started = dict.fromkeys(loads, 0)
        self.events: list = []
        self.order = itertools.count()
        self.service: dict[int, float] = {}
        self.sent: dict[int, tuple[float, float | None]] = {}  # id -> (dispatched at, load)
        self.start_at: dict[str, tuple[float, float]] = {}  # model -> (started at, load)

    def play(self, arrivals: list[tuple[Ticket, float]]) -> None:
        pending = list(arrivals)
        while pending or self.events:
            if self.events and (not pending or self.events[0][0] <= pending[0][0].arrival):
                at, _, event, subject = heapq.heappop(self.events)
                if event == "end":
                    self.apply(self.scheduler.finished(subject, at), at)
                elif event == "ready":
                    self.apply(self.scheduler.model_ready(subject, at), at)
                else:
                    self.apply(self.scheduler.model_stopped(subject, at), at)
            else:
                ticket, service = pending.pop(0)
                self.service[ticket.id] = service
                self.apply(self.scheduler.submit(ticket, ticket.arrival), ticket.arrival)

    def apply(self, effects, now: float) -> None:
        for effect in effects:
            if isinstance(effect, Grant):
                load = self.start_at[effect.model][1] if effect.decision.needs_swap else None
                self.sent[effect.ticket_id] = (now, load)
                heapq.heappush(self.events, (now + self.service[effect.ticket_id], next(self.order), "end",
                                             effect.ticket_id))
            elif isinstance(effect, StartModel):
                draws = self.loads[effect.model]
                load = draws[self.started[effect.model] % len(draws)]
                self.started[effect.model] += 1
                self.start_at[effect.model] = (now, load)
                heapq.heappush(self.events, (now + load, next(self.order), "ready", effect.model))
            elif isinstance(effect, StopModel):
                heapq.heappush(self.events, (now, next(self.order), "stopped", effect.model))


requests = st.lists(
    st.tuples(st.sampled_from(MODELS), st.sampled_from([BATCH, -20, NORMAL, 5, INTERACTIVE]),
              st.floats(0.0, 20.0), st.floats(0.1, 30.0)),
    min_size=1, max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.fixed_dictionaries({m: st.lists(st.floats(0.5, 10.0), min_size=1, max_size=3) for m in MODELS}),
    st.sampled_from([0.0, 1.0, 15.0, 60.0]),
    st.sampled_from([0, 10, 50]),
    st.sampled_from([{}, {"chat": 2}, {"embed": 3, "coder": 2}]),
)
def test_replaying_a_history_the_core_produced_with_its_settings_reproduces_it(
    drawn, loads, divisor, bonus, slots
):
    in_force = SerialSettings(aging_divisor=divisor, swap_affinity_bonus=bonus, slots=slots)
    arrivals, at = [], 0.0
    for n, (model, priority, gap, service) in enumerate(drawn, 1):
        at += gap
        arrivals.append((Ticket(n, model, priority, at), service))
    recording = Recording(in_force, loads)
    recording.play(arrivals)
    records = [
        Recorded(t.id, t.model, t.priority, t.arrival, service_s=service, dispatched_s=recording.sent[t.id][0],
                 load_s=recording.sent[t.id][1])
        for t, service in arrivals
    ]
    setup = Setup("serial", specs(*MODELS), SwapPolicy(GROUPS, MODELS))
    result = replay(records, setup, in_force)
    assert {rid: r.dispatched_s for rid, r in result.requests.items()} == {
        rid: sent for rid, (sent, _) in recording.sent.items()
    }
    measured = fidelity(records, result)
    assert measured.same_order in (None, 1.0) and measured.wait_error_s == 0.0


def test_waits_carry_the_nearest_rank_p99():
    from scheduling.core.replay import waits

    assert waits([float(n) for n in range(1, 201)]).p99 == 198.0
    assert waits([1.0, 5.0, 2.0]).p99 == 5.0  # under 100 waits: the longest
