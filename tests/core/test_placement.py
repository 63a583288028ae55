"""Placement on described hardware: where a model goes, and the least-cost set of models to stop for it,
checked against brute force over every set on small cases."""

import itertools
import math

import pytest
from hypothesis import given, strategies as st

from scheduling.core.mentions import plain, told
from scheduling.core.placement import (
    DEMAND_WINDOW_S, Demand, Hardware, MemoryNeed, Resident, assign, eviction_cost, free_memory, make_room,
)

from .search_effort import property_settings

TWO_24 = Hardware({"0": 24_576, "1": 24_576})


def test_a_model_goes_to_the_gpu_with_the_most_free_memory():
    residents = [Resident("big", ("0",), 20_000)]
    assert assign(TWO_24, MemoryNeed(4_000), residents) == ("1",)
    assert assign(TWO_24, MemoryNeed(4_000), []) == ("0",)  # a tie: the config's order
    assert assign(TWO_24, MemoryNeed(4_000, gpus=2), residents) == ("0", "1")
    assert assign(TWO_24, MemoryNeed(5_000, gpus=2), residents) is None


def test_cpu_models_count_against_the_cpus_memory_only_when_it_is_given():
    assert assign(TWO_24, MemoryNeed(10**9, gpus=0), []) == ()
    hardware = Hardware({"0": 1_000}, cpu_mib=64_000)
    assert assign(hardware, MemoryNeed(40_000, gpus=0), [Resident("c", (), 30_000)]) is None
    assert free_memory(hardware, [Resident("c", (), 30_000)]) == ({"0": 1_000}, 34_000)


def test_what_fits_evicts_nothing_and_what_never_fits_gets_no_room():
    assert make_room(TWO_24, MemoryNeed(20_000), [Resident("a", ("0",), 20_000)]).evict == frozenset()
    assert make_room(TWO_24, MemoryNeed(30_000), []) is None


def test_the_cheapest_idle_model_makes_room_and_a_busy_one_only_when_no_idle_set_does():
    residents = [Resident("slow", ("0",), 20_000, cost=120), Resident("quick", ("1",), 20_000, cost=5)]
    room = make_room(TWO_24, MemoryNeed(20_000), residents)
    assert (room.evict, room.gpus, room.cost) == (frozenset({"quick"}), ("1",), 5)
    busy = [Resident("slow", ("0",), 20_000, cost=120), Resident("quick", ("1",), 20_000, cost=5, busy=True)]
    assert make_room(TWO_24, MemoryNeed(20_000), busy).evict == frozenset({"slow"})


def test_a_model_whose_stop_frees_nothing_the_need_can_use_is_not_stopped_even_at_no_cost():
    residents = [Resident("a", ("1",), 2_000, cost=0.0), Resident("b", ("1",), 20_000, cost=10),
                 Resident("z", ("0",), 20_000, cost=5)]
    assert make_room(TWO_24, MemoryNeed(20_000), residents).evict == frozenset({"z"})
    two = TWO_24.gpus | {"2": 24_576}
    residents.append(Resident("y", ("2",), 20_000, cost=1))  # on two GPUs: the two cheapest GPUs' own sets
    assert make_room(Hardware(two), MemoryNeed(20_000, gpus=2), residents).evict == frozenset({"y", "z"})


def test_pinned_and_leased_models_are_never_stopped_and_name_themselves_when_they_block():
    residents = [Resident("pinned", ("0",), 20_000, protected="pinned"),
                 Resident("leased", ("1",), 20_000, protected="lease #3"),
                 Resident("small", ("1",), 1_000, cost=1)]
    room = make_room(TWO_24, MemoryNeed(20_000), residents)
    assert room.evict == frozenset() and room.gpus == ()
    assert room.blocked_by == ("leased", "pinned") or set(room.blocked_by) <= {"leased", "pinned"}
    assert room.blocked_by
    # a model too big for one GPU's free memory but whose stop of the unprotected one makes room
    assert make_room(TWO_24, MemoryNeed(4_000), residents).evict == frozenset()


def test_demand_weighs_priority_and_forgets_after_its_window():
    demand = Demand()
    demand.arrived("m", 0, 0.0)
    demand.arrived("m", 100, 1.0)
    demand.arrived("m", -100, 2.0)
    assert demand.per_minute("m", 3.0) == pytest.approx((1 + 2 + 0.5) * 60 / DEMAND_WINDOW_S)
    assert demand.per_minute("m", DEMAND_WINDOW_S + 0.5) == pytest.approx((2 + 0.5) * 60 / DEMAND_WINDOW_S)
    assert demand.per_minute("other", 3.0) == 0
    assert eviction_cost(40, 2) == pytest.approx(40 * (1 - math.exp(-2)))  # about 34.6: its load, likely paid again
    assert eviction_cost(40, 50) == pytest.approx(40)  # however often it is asked for, it is loaded again once
    assert eviction_cost(40, 0) == 0  # not asked for in the window: nothing to lose


def test_a_request_exactly_600_s_old_no_longer_counts_in_demand():
    demand = Demand()
    demand.arrived("m", 0, 0.0)
    demand.arrived("m", 0, 1.0)
    assert demand.per_minute("m", DEMAND_WINDOW_S) == pytest.approx(1 * 60 / DEMAND_WINDOW_S)
    assert demand.per_minute("m", DEMAND_WINDOW_S + 1.0) == 0


def test_among_sets_of_equal_cost_the_one_with_fewer_models_stops():
    """Two idle models that cost nothing are not stopped where one that costs nothing frees as much."""
    one_gpu = Hardware({"0": 24_000})
    residents = [Resident("a", ("0",), 6_000), Resident("b", ("0",), 6_000), Resident("c", ("0",), 12_000)]
    assert make_room(one_gpu, MemoryNeed(12_000), residents).evict == frozenset({"c"})


GPU_SETS = st.lists(st.sampled_from([8_000, 16_000, 24_000]), min_size=1, max_size=3)


@st.composite
def scenes(draw):
    sizes = draw(GPU_SETS)
    hardware = Hardware({str(i): size for i, size in enumerate(sizes)}, cpu_mib=draw(st.none() | st.just(32_000)))
    residents: list[Resident] = []
    for index in range(draw(st.integers(0, 6))):
        need = MemoryNeed(draw(st.sampled_from([2_000, 4_000, 8_000])), draw(st.integers(0, len(sizes))))
        gpus = assign(hardware, need, residents)
        if gpus is None:
            continue
        residents.append(Resident(
            f"m{index}", gpus, need.mib, cost=draw(st.sampled_from([0.0, 1.0, 2.5, 10.0, 40.0])),
            busy=draw(st.booleans()),
            protected=draw(st.sampled_from(["", "", "", "pinned"])),
        ))
    need = MemoryNeed(draw(st.sampled_from([2_000, 6_000, 12_000, 20_000])), draw(st.integers(0, len(sizes))))
    return hardware, residents, need


@property_settings(300)
@given(scenes())
def test_the_room_made_is_the_least_cost_set_that_fits_and_never_holds_a_protected_model(scene):
    hardware, residents, need = scene
    room = make_room(hardware, need, residents)
    if assign(hardware, need, []) is None:
        assert room is None
        return
    by_name = {r.model: r for r in residents}
    feasible = []
    for size in range(len(residents) + 1):
        for chosen in itertools.combinations(residents, size):
            names = {r.model for r in chosen}
            if assign(hardware, need, [r for r in residents if r.model not in names]) is not None:
                feasible.append(chosen)
    allowed = [c for c in feasible if not any(r.protected for r in c)]
    if not allowed:
        assert room.blocked_by and not room.evict and room.gpus == ()
        assert all(by_name[m].protected for m in room.blocked_by)
        return
    assert not room.blocked_by
    best = min((sum(r.busy for r in c), sum(r.cost for r in c)) for c in allowed)
    chosen = [by_name[m] for m in room.evict]
    assert (sum(r.busy for r in chosen), sum(r.cost for r in chosen)) == pytest.approx(best)
    staying = [r for r in residents if r.model not in room.evict]
    for model in room.evict:  # no model is stopped whose memory the start does without, even one that costs nothing
        assert assign(hardware, need, [*staying, by_name[model]]) is None, f"{model} need not stop"
    gpus, cpu = free_memory(hardware, staying)
    assert len(room.gpus) == need.gpus and all(gpus[g] >= need.mib for g in room.gpus)
    if need.gpus == 0 and cpu is not None:
        assert cpu >= need.mib


def test_with_hardware_a_group_that_would_stop_a_pinned_model_makes_the_start_wait():
    from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, StartModel, SwapGroup, SwapPolicy, Ticket

    specs = {"a": ModelSpec("a", memory=MemoryNeed(1_000)), "b": ModelSpec("b", memory=MemoryNeed(1_000), pinned=True)}
    scheduler = SerialScheduler(specs, SwapPolicy([SwapGroup("ab", ("a", "b"))], specs), SerialSettings(), TWO_24)
    assert scheduler.submit(Ticket(1, "b", 0, 0.0), 0.0) == [StartModel("b", (), ("0",))]
    scheduler.model_ready("b", 1.0)
    scheduler.finished(1, 2.0)
    assert scheduler.submit(Ticket(2, "a", 0, 3.0), 3.0) == []  # memory has room; the group would stop b
    assert "b (pinned)" in scheduler.held_back_because(2)
    assert scheduler.room_for("a").blocked_by == ("b",)


def test_the_memory_book_keeps_an_answer_only_while_nothing_it_reads_changes():
    from scheduling.core import ModelSpec
    from scheduling.core.memory_book import MemoryBook

    book = MemoryBook(TWO_24, {m: ModelSpec(m, memory=MemoryNeed(20_000)) for m in "abc"})
    book.starting("a", ("0",), 0.0)
    book.ready("a", 10.0)  # loads in 10 s
    book.starting("b", ("1",), 10.0)
    book.ready("b", 40.0)  # in 30 s
    idle = lambda model: False  # noqa: E731
    first = book.room("c", ("a", "b"), idle)
    assert first.evict == {"a"}
    assert book.room("c", ("a", "b"), idle) is first  # asked again, nothing changed: the kept answer
    assert book.room("c", ("a", "b"), lambda model: model == "a").evict == {"b"}  # who is busy is read each time
    for _ in range(20):
        book.arrived("a", 100, 40.0)  # a in demand now (time stands still): 10 s × (1 + 4) against b's 30
    assert book.room("c", ("a", "b"), idle).evict == {"b"}
    book.lease("b", "lease #1")
    assert book.room("c", ("a", "b"), idle).evict == {"a"}
    book.gone("a")
    assert book.room("c", ("a", "b"), idle).evict == frozenset()


def test_a_start_that_stops_models_for_memory_explains_each_ones_cost_in_its_decision():
    from scheduling.core import (
        Grant, ModelSpec, SerialScheduler, SerialSettings, StartModel, SwapGroup, SwapPolicy, Ticket,
    )

    one_gpu = Hardware({"0": 24_576})
    specs = {m: ModelSpec(m, memory=MemoryNeed(mib)) for m, mib in (("big", 20_000), ("a", 10_000), ("b", 10_000))}
    together = SwapGroup("(placement)", tuple(specs), swap=False, exclusive=False)  # memory alone decides
    scheduler = SerialScheduler(specs, SwapPolicy([together], specs), SerialSettings(), one_gpu)
    for ticket, model, at in ((1, "a", 0.0), (2, "b", 10.0)):
        assert scheduler.submit(Ticket(ticket, model, 0, at), at) == [StartModel(model, (), ("0",))]
        scheduler.model_ready(model, at + 4.0)  # both load in 4 s
        scheduler.finished(ticket, at + 5.0)
    for ticket in (3, 4):  # b asked for twice more: its demand is higher than a's
        scheduler.submit(Ticket(ticket, "b", 0, 16.0), 16.0)
        scheduler.finished(ticket, 17.0)
    assert scheduler.submit(Ticket(5, "big", 0, 20.0), 20.0) == [StartModel("big", ("a", "b"), ("0",), ("a", "b"))]
    [grant] = [e for e in scheduler.model_ready("big", 30.0) if isinstance(e, Grant)]
    text = plain(grant.decision.explain())
    demand_a, demand_b = 1 / 10, 3 / 10  # one and three requests at priority 0 in a 10-minute window, per minute
    assert (f"to make room on GPU 0 its start stopped a (cost {eviction_cost(4.0, demand_a):.2f} = 4.0 s load × "
            f"(1 − e^−{demand_a:.2f})) and b (cost {eviction_cost(4.0, demand_b):.2f} = 4.0 s load × "
            f"(1 − e^−{demand_b:.2f}))") in text
    assert "cost = load seconds × (1 − e^−demand)" in text
    told_to = {seen: told(grant.decision.explain(), set(seen).__contains__) for seen in (("big", "b"), ("big",))}
    assert f"its start stopped b (cost {eviction_cost(4.0, demand_b):.2f} = " in told_to[("big", "b")]
    assert f"e^−{demand_b:.2f})) and another model: the idle models" in told_to[("big", "b")]  # a's are not told
    assert "its start stopped 2 other models: the idle models" in told_to[("big",)]
    scheduler.finished(5, 35.0)
    [again] = scheduler.submit(Ticket(6, "big", 0, 40.0), 40.0)  # loaded already: nothing is stopped
    assert "make room" not in again.decision.explain()


def test_a_rebuilt_queues_requests_count_in_their_models_demand_as_submitted_ones_do():
    """A standby that takes over queues the requests still waiting with submit_all: they are demand for their model
    (its eviction cost) as much as requests sent to it one by one, or a model in use would look free to stop."""
    from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapGroup, SwapPolicy, Ticket
    from scheduling.core.memory_book import UNKNOWN_LOAD_S

    specs = {m: ModelSpec(m, memory=MemoryNeed(10_000)) for m in ("a", "b")}
    together = SwapGroup("(placement)", tuple(specs), swap=False, exclusive=False)
    one_by_one, rebuilt = (SerialScheduler(specs, SwapPolicy([together], specs), SerialSettings(), TWO_24)
                           for _ in range(2))
    tickets = [Ticket(n, "a", 0, 0.0) for n in (1, 2)]
    for ticket in tickets:
        one_by_one.submit(ticket, 0.0)
    rebuilt.submit_all(tickets, 0.0)
    expected = eviction_cost(UNKNOWN_LOAD_S, 2 * 60 / DEMAND_WINDOW_S)
    assert expected > 0
    assert one_by_one.memory.cost("a", 1.0) == rebuilt.memory.cost("a", 1.0) == pytest.approx(expected)


def test_a_model_not_loaded_yet_counts_the_mean_of_the_measured_load_times():
    from scheduling.core import ModelSpec
    from scheduling.core.memory_book import UNKNOWN_LOAD_S, MemoryBook

    book = MemoryBook(TWO_24, {m: ModelSpec(m, memory=MemoryNeed(4_000)) for m in "abc"})
    book.starting("a", ("0",), 0.0)
    assert book.view(lambda model: True)["models"]["a"]["load_s"] == UNKNOWN_LOAD_S  # none measured yet
    book.ready("a", 10.0)
    book.starting("b", ("1",), 10.0)
    book.ready("b", 30.0)
    book.starting("c", ("0",), 30.0)
    book.arrived("c", 0, 30.0)
    shown = book.view(lambda model: model == "c")["models"]["c"]
    assert shown["load_s"] == 15.0  # (10 + 20) / 2
    assert shown["eviction_cost"] == round(eviction_cost(15.0, 60 / DEMAND_WINDOW_S), 3)


def test_a_request_a_lease_holds_back_goes_at_the_instant_the_lease_ends():
    """The runtime wakes the scheduler at `next_deadline`, the lease's end: from that instant the model it leased is
    no longer protected, or nothing would wake the request again."""
    from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, StartModel, SwapGroup, SwapPolicy, Ticket

    specs = {m: ModelSpec(m, memory=MemoryNeed(20_000)) for m in "ab"}
    together = SwapGroup("(placement)", tuple(specs), swap=False, exclusive=False)  # memory alone decides
    scheduler = SerialScheduler(specs, SwapPolicy([together], specs), SerialSettings(), Hardware({"0": 24_576}))
    scheduler.submit(Ticket(1, "a", 0, 0.0), 0.0)
    scheduler.model_ready("a", 1.0)
    scheduler.finished(1, 2.0)
    scheduler.apply_leases({"a": ("lease #1", 100.0)}, 3.0)
    assert scheduler.submit(Ticket(2, "b", 0, 4.0), 4.0) == []
    assert "a (lease #1)" in scheduler.held_back_because(2)
    assert scheduler.next_deadline() == 100.0
    assert scheduler.tick(100.0) == [StartModel("b", ("a",), ("0",), ("a",))]
