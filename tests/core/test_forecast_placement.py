"""The forecast with `hardware:` described: it plays a copy of the live scheduler, memory book and all, so a
waiting request's ETA knows which models start beside the busy ones, and which must wait for a GPU to free."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapGroup, SwapPolicy
from scheduling.core.mentions import plain
from scheduling.core.placement import Hardware, MemoryNeed

from .harness import Tickets
from .test_forecast import LOAD_S, MODELS, World

GIB = 1024


def placing(memory: dict[str, int], gpus: int, gpu_gib: int = 24) -> SerialScheduler:
    """chat, coder and embed of `memory` GiB, placed by memory alone on `gpus` GPUs of `gpu_gib`."""
    models = {m: ModelSpec(m, memory=MemoryNeed(memory[m] * GIB)) for m in MODELS}
    everyone = SwapGroup("(placed by memory)", MODELS, swap=False, exclusive=False)
    return SerialScheduler(models, SwapPolicy([everyone], MODELS), SerialSettings(),
                           Hardware({str(n): gpu_gib * GIB for n in range(gpus)}))


@pytest.mark.parametrize(("chat_gib", "eta_s", "position"), [
    (12, 3.0, None),  # 12 + 10 GiB fit on 24: coder starts at once beside the batch job, its load alone
    (16, 12.0, 1),  # 16 + 10 do not: the batch job's end (9 s left), then coder's load
])
def test_a_model_that_fits_beside_a_busy_one_is_forecast_to_wait_only_for_its_load(chat_gib, eta_s, position):
    scheduler, ticket = placing({"chat": chat_gib, "coder": 10, "embed": 2}, gpus=1), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)  # chat loaded at 6 s, its batch job runs until 16 s
    coder = ticket("coder", 100, 7.0)
    world.apply(scheduler.submit(coder, 7.0), 7.0)
    outlook = world.forecast({coder.id: "coder"}, 7.0)[coder.id]
    assert (outlook.eta_s, outlook.position) == (pytest.approx(eta_s), position)
    while world.events:
        world.step()
    assert world.granted_at[coder.id] - 7.0 == pytest.approx(eta_s)


def test_a_request_waits_for_the_job_on_the_model_placement_stops_for_it():
    """chat and coder fill one GPU each with jobs; embed fits on neither, so the cheaper to load again, coder
    (3 s against 6), is stopped for it once its job ends at 14 s."""
    scheduler, ticket = placing({"chat": 20, "coder": 20, "embed": 10}, gpus=2), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    world.apply(scheduler.submit(ticket("coder", -100, 7.0), 7.0), 7.0)  # ready at 10 s, job until 14 s
    world.run_until(11.0)
    embed = ticket("embed", 100, 11.0)
    world.apply(scheduler.submit(embed, 11.0), 11.0)
    outlook = world.forecast({embed.id: "embed"}, 11.0)[embed.id]
    assert outlook.eta_s == pytest.approx(3.0 + LOAD_S["embed"]) and outlook.after.model == "coder"


def test_the_copy_places_the_starts_it_plays_ahead_by_memory_too():
    """One 24 GiB GPU. chat (12 GiB) runs a batch job until 16 s; an interactive coder request (16 GiB) waits
    for it, then loads (19 s) and runs (23 s). embed (10 GiB) would fit beside chat now, but not beside the
    coder start it would stand in the way of, nor beside coder: it goes once coder's job ends, then loads."""
    scheduler, ticket = placing({"chat": 12, "coder": 16, "embed": 10}, gpus=1), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket("chat", -100, 0.0), 0.0), 0.0)
    world.run_until(6.0)
    coder, embed = ticket("coder", 100, 7.0), ticket("embed", 0, 7.0)
    world.apply(scheduler.submit(coder, 7.0), 7.0)
    world.apply(scheduler.submit(embed, 7.0), 7.0)
    outlooks = world.forecast({coder.id: "coder", embed.id: "embed"}, 7.0)
    assert outlooks[coder.id].eta_s == pytest.approx(16.0 + 3.0 - 7.0)
    assert outlooks[embed.id].eta_s == pytest.approx(23.0 + 2.0 - 7.0)
    while world.events:
        world.step()
    assert (world.granted_at[coder.id], world.granted_at[embed.id]) == (19.0, 25.0)


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from([-100, 0, 100]), st.floats(0, 300)),
                      min_size=1, max_size=12),
    memory=st.fixed_dictionaries({m: st.integers(2, 24) for m in MODELS}),
    gpus=st.integers(1, 2),
    running=st.sampled_from(MODELS),
)
def test_with_typical_durations_the_placed_forecast_is_exactly_what_happens(requests, memory, gpus, running):
    scheduler, ticket = placing(memory, gpus), Tickets()
    world = World(scheduler)
    world.apply(scheduler.submit(ticket(running, -100, 0.0), 0.0), 0.0)
    world.run_until(LOAD_S[running])
    now = LOAD_S[running] + 0.5
    waiting = {}
    for model, priority, ago in requests:
        t = ticket(model, priority, now - ago)
        waiting[t.id] = model
        world.apply(scheduler.submit(t, now), now)
    pending = {tid: m for tid, m in waiting.items() if tid not in world.granted_at}
    outlooks = world.forecast(pending, now)
    while world.events:
        world.step()
    assert {tid: outlooks[tid].eta_s for tid in pending} == pytest.approx(
        {tid: world.granted_at[tid] - now for tid in pending}
    )


def test_a_request_only_a_pinned_models_stop_would_make_room_for_is_told_the_pin_in_its_way():
    """Nothing under way ends in room for coder: its outlook has no ETA and names what holds the GPU, as a
    Max-Wait refusal does, not just that nothing is predicted to make room."""
    models = {"chat": ModelSpec("chat", memory=MemoryNeed(20 * GIB), pinned=True),
              "coder": ModelSpec("coder", memory=MemoryNeed(20 * GIB)), "embed": ModelSpec("embed", memory=MemoryNeed(2 * GIB))}
    everyone = SwapGroup("(placed by memory)", MODELS, swap=False, exclusive=False)
    scheduler = SerialScheduler(models, SwapPolicy([everyone], MODELS), SerialSettings(), Hardware({"0": 24 * GIB}))
    ticket, world = Tickets(), World(scheduler)
    world.apply(scheduler.submit(ticket("chat", 0, 0.0), 0.0), 0.0)
    while world.events:
        world.step()  # chat loaded, its job done: idle, but pinned
    coder = ticket("coder", 100, 20.0)
    world.apply(scheduler.submit(coder, 20.0), 20.0)
    outlook = world.forecast({coder.id: "coder"}, 20.0)[coder.id]
    assert outlook.eta_s is None
    assert plain(outlook.unknown) == "model coder has room only if chat (pinned) is stopped, which is never done to make room"
