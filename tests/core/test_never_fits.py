"""Whether a model can ever be loaded as configured (a lease for one that cannot is refused): only a pin's stop
would make room, or it fits on no GPU; a leased model in the way is waited for, not a reason to refuse."""

from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapPolicy, Ticket
from scheduling.core.mentions import plain
from scheduling.core.placement import Hardware, MemoryNeed

ONE_24 = Hardware({"0": 24_576})


def scheduler_with(*pinned: str) -> SerialScheduler:
    specs = {m: ModelSpec(m, memory=MemoryNeed(20_000), pinned=m in pinned) for m in "ab"}
    scheduler = SerialScheduler(specs, SwapPolicy([], specs), SerialSettings(), ONE_24)
    scheduler.submit(Ticket(1, "a", 0, 0.0), 0.0)
    scheduler.model_ready("a", 1.0)
    scheduler.finished(1, 2.0)
    return scheduler


def test_a_model_only_a_pins_stop_would_make_room_for_never_fits_and_says_which():
    assert plain(scheduler_with("a").never_fits("b")) == (
        "model b has room only if a (pinned) is stopped, which is never done to make room")


def test_a_leased_or_idle_model_in_the_way_is_no_reason():
    scheduler = scheduler_with()
    assert scheduler.never_fits("b") is None
    scheduler.apply_leases({"a": ("lease #1", 100.0)}, 3.0)
    assert scheduler.never_fits("b") is None
    assert scheduler.room_for("b").blocked_by == ("a",)  # it waits for the lease instead


def test_a_model_bigger_than_every_gpu_never_fits_and_without_hardware_nothing_is_said():
    specs = {"huge": ModelSpec("huge", memory=MemoryNeed(30_000))}
    why = SerialScheduler(specs, SwapPolicy([], specs), SerialSettings(), ONE_24).never_fits("huge")
    assert why.startswith("model 'huge' needs 30000 MiB on a GPU, as it declared (memory:), more than the hardware "
                          "holds (the largest GPU,"), why
    assert SerialScheduler(specs, SwapPolicy([], specs), SerialSettings()).never_fits("huge") is None
