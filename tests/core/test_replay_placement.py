"""The replay with `hardware:` described: the replayed scheduler places models by memory as the service
does, so a what-if can try other hardware, and a history the core placed replays exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapGroup, SwapPolicy, Ticket
from scheduling.core.placement import Hardware, MemoryNeed
from scheduling.core.replay import Recorded, Setup, fidelity, replay, waits_by_band

from .test_replay import BATCH, INTERACTIVE, NORMAL, Recording

GIB = 1024


def placed(memory: dict[str, int], gpus: int, gpu_gib: int = 24, **spec) -> Setup:
    """Models of `memory` GiB each, placed by memory alone (one group that swaps nothing) on `gpus` GPUs."""
    models = {m: ModelSpec(m, memory=MemoryNeed(gib * GIB), **spec) for m, gib in memory.items()}
    everyone = SwapGroup("(placed by memory)", tuple(models), swap=False, exclusive=False)
    return Setup("serial", models, SwapPolicy([everyone], models),
                 Hardware({str(n): gpu_gib * GIB for n in range(gpus)}))


def one_swap_group(models) -> Setup:
    return Setup("serial", {m: ModelSpec(m) for m in models}, SwapPolicy([SwapGroup("gpu", tuple(models))], models))


def test_models_that_fit_together_run_side_by_side_where_one_swap_group_makes_them_wait():
    records = [
        Recorded(1, "batch", BATCH, 0.0, service_s=100.0, load_s=10.0, dispatched_s=10.0),
        Recorded(2, "chat", INTERACTIVE, 20.0, service_s=5.0, load_s=4.0, dispatched_s=110.0),
    ]
    swapping = replay(records, one_swap_group(["batch", "chat"]), SerialSettings())
    beside = replay(records, placed({"batch": 10, "chat": 10}, gpus=1), SerialSettings())
    assert swapping.requests[2].wait_s == 94.0  # the batch job's end, then chat's load
    assert beside.requests[2].wait_s == 4.0  # chat's load alone: 20 GiB of 24 fit
    assert beside.evicted_for_memory == 0 and beside.swaps == 2


def test_a_what_if_with_a_second_gpu_cuts_swaps_and_waits():
    """Two 16 GiB models asked for in turn: on one 24 GiB GPU each start stops the other; on two they stay."""
    records = []
    for n in range(10):
        model = ("coder", "chat")[n % 2]
        records.append(Recorded(n + 1, model, INTERACTIVE, 30.0 * n, service_s=5.0, load_s=20.0,
                                dispatched_s=30.0 * n + 20.0))
    memory = {"coder": 16, "chat": 16}
    one = replay(records, placed(memory, gpus=1), SerialSettings())
    two = replay(records, placed(memory, gpus=2), SerialSettings())
    assert (one.swaps, one.evicted_for_memory, one.loading_gpu_s) == (10, 9, 200.0)
    assert (two.swaps, two.evicted_for_memory, two.loading_gpu_s) == (2, 0, 40.0)
    assert waits_by_band(one)["interactive"].max == 20.0 and waits_by_band(two)["interactive"].p50 == 0.0


def test_the_cheapest_model_to_load_again_is_the_one_stopped_even_among_those_up_when_the_window_began():
    records = [
        Recorded(1, "big", NORMAL, 0.0, service_s=1.0),
        Recorded(2, "small", NORMAL, 0.0, service_s=1.0),
        Recorded(3, "third", NORMAL, 10.0, service_s=1.0, load_s=5.0, dispatched_s=15.0),
        Recorded(4, "big", NORMAL, 20.0, service_s=1.0),
        Recorded(10, "big", NORMAL, 500.0, service_s=1.0, load_s=40.0, dispatched_s=540.0),  # its loads: 40 s
        Recorded(11, "small", NORMAL, 600.0, service_s=1.0, load_s=2.0, dispatched_s=602.0),  # 2 s
    ]
    result = replay(records, placed({"big": 10, "small": 10, "third": 10}, gpus=1), SerialSettings(),
                    warm=["big", "small"])
    assert result.requests[4].wait_s == 0.0  # small, loaded again in 2 s, made room for third; big stayed
    assert result.requests[3].wait_s == 5.0 and result.evicted_for_memory >= 1


def test_a_model_on_two_gpus_costs_its_load_on_each():
    records = [Recorded(1, "large", NORMAL, 0.0, service_s=1.0, load_s=30.0, dispatched_s=30.0)]
    models = {"large": ModelSpec("large", memory=MemoryNeed(20 * GIB, gpus=2))}
    setup = Setup("serial", models, SwapPolicy([], models), Hardware({"0": 24 * GIB, "1": 24 * GIB}))
    assert replay(records, setup, SerialSettings()).loading_gpu_s == 60.0
    assert replay(records, one_swap_group(["large"]), SerialSettings()).loading_gpu_s == 30.0  # one GPU, undescribed


MODELS = {"chat": 12, "coder": 14, "embed": 2, "vision": 10}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(list(MODELS)), st.sampled_from([BATCH, NORMAL, INTERACTIVE]),
                       st.floats(0.0, 20.0), st.floats(0.1, 30.0)), min_size=1, max_size=30),
    st.fixed_dictionaries({m: st.lists(st.floats(0.5, 10.0), min_size=1, max_size=3) for m in MODELS}),
    st.integers(1, 2),
)
def test_replaying_a_history_the_core_placed_with_its_hardware_reproduces_it(drawn, loads, gpus):
    setup = placed(MODELS, gpus=gpus)
    scheduler = SerialScheduler(setup.models, setup.policy, SerialSettings(), setup.hardware)
    arrivals, at = [], 0.0
    for n, (model, priority, gap, service) in enumerate(drawn, 1):
        at += gap
        arrivals.append((Ticket(n, model, priority, at), service))
    recording = Recording(SerialSettings(), loads, scheduler)
    recording.play(arrivals)
    records = [
        Recorded(t.id, t.model, t.priority, t.arrival, service_s=service, dispatched_s=recording.sent[t.id][0],
                 load_s=recording.sent[t.id][1])
        for t, service in arrivals
    ]
    result = replay(records, setup, SerialSettings())
    assert {rid: r.dispatched_s for rid, r in result.requests.items()} == {
        rid: sent for rid, (sent, _) in recording.sent.items()
    }
    assert fidelity(records, result).wait_error_s == 0.0


def test_a_start_held_back_by_a_min_residency_goes_when_it_ends():
    records = [
        Recorded(1, "a", NORMAL, 0.0, service_s=1.0, load_s=2.0, dispatched_s=2.0),
        Recorded(2, "b", NORMAL, 10.0, service_s=1.0, load_s=2.0, dispatched_s=102.0),
    ]
    result = replay(records, placed({"a": 16, "b": 16}, gpus=1, min_residency=100.0), SerialSettings())
    assert result.requests[2].outcome == "served" and result.requests[2].dispatched_s == 104.0  # a ready at 2 s
