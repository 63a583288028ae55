"""GPU memory measured where the models run: shown beside the declaration, and a model found using more than it
declared counts its measured figure from then on, its next start included; a new declaration is trusted again."""

from hypothesis import given, strategies as st

from scheduling.core import (
    ModelSpec, Refuse, SerialScheduler, SerialSettings, StartModel, StopModel, SwapGroup, SwapPolicy, Ticket,
)
from scheduling.core.memory_book import MemoryBook
from scheduling.core.placement import Hardware, MemoryNeed

from .search_effort import property_settings

ONE_4G = Hardware({"0": 4_096})
SPECS = {"small": ModelSpec("small", memory=MemoryNeed(1_024)), "other": ModelSpec("other", memory=MemoryNeed(2_048)),
         "cpu": ModelSpec("cpu", memory=MemoryNeed(1_024, gpus=0))}


def scheduler(specs=SPECS) -> SerialScheduler:
    together = SwapGroup("all", tuple(specs), swap=False, exclusive=False)  # memory alone decides
    return SerialScheduler(specs, SwapPolicy([together], specs), SerialSettings(), ONE_4G)


def run(scheduler: SerialScheduler, ticket: int, model: str, now: float) -> list:
    effects = scheduler.submit(Ticket(ticket, model, 0, now), now)
    if any(isinstance(e, StartModel) for e in effects):
        effects += scheduler.model_ready(model, now + 1)
    scheduler.finished(ticket, now + 2)
    return effects


def test_a_model_using_more_than_it_declared_is_told_once_shown_and_its_next_start_counts_the_measured_figure():
    s = scheduler()
    run(s, 1, "other", 0.0)
    assert s.room_for("small").evict == frozenset()  # declared 1 GiB fits beside other's 2 GiB
    run(s, 2, "small", 10.0)
    warning = s.memory_measured("small", {"0": 3_072})
    assert warning == ("model small uses 3072 MiB of GPU memory, more than the 1024 MiB it declared (memory:); "
                       "placement counts 3072 MiB for it from now on")
    assert s.memory_measured("small", {"0": 3_072}) is None  # said once
    assert s.memory_measured("small", {"0": 2_000}) is None  # less than its highest: nothing new
    shown = s.placement()
    assert {k: shown["models"]["small"][k] for k in ("declared_mib", "counted_mib", "measured_mib")} == {
        "declared_mib": 1_024, "counted_mib": 3_072, "measured_mib": 2_000}
    assert shown["models"]["small"]["measured_per_gpu_mib"] == {"0": 2_000}
    assert shown["models"]["other"]["measured_mib"] is None  # never measured
    assert [(g["declared_mib"], g["counted_mib"], g["measured_mib"]) for g in shown["gpus"]] == [(3_072, 5_120, 2_000)]
    s.unload(["small"], 20.0)
    s.model_stopped("small", 21.0)
    assert s.placement()["gpus"][0]["measured_mib"] is None  # what is stopped uses nothing
    assert s.room_for("small").evict == frozenset({"other"})  # counted at 3 GiB, it no longer fits beside it
    effects = s.submit(Ticket(3, "small", 0, 30.0), 30.0)
    assert [(e.model, tuple(e.evict)) for e in effects if isinstance(e, StartModel)] == [("small", ("other",))]


def test_a_use_within_the_declaration_changes_nothing_and_says_nothing():
    s = scheduler()
    run(s, 1, "small", 0.0)
    assert s.memory_measured("small", {"0": 900}) is None
    assert s.memory.need("small") == MemoryNeed(1_024)


def test_a_stopped_model_or_one_on_the_cpu_takes_no_measurement():
    s = scheduler()
    assert s.memory_measured("small", {"0": 3_072}) is None  # not running: a late figure of a process now gone
    assert s.memory.need("small") == MemoryNeed(1_024)
    run(s, 1, "cpu", 0.0)
    assert s.memory_measured("cpu", {"0": 3_072}) is None
    assert s.memory.need("cpu") == MemoryNeed(1_024, gpus=0)


def test_a_new_declaration_is_trusted_again_and_an_unchanged_one_keeps_the_measured_figure():
    book = MemoryBook(ONE_4G, SPECS)
    book.starting("small", ("0",), 0.0)
    book.measured("small", {"0": 3_072})
    book.reconfigure(SPECS, ONE_4G, ["small"])
    assert book.need("small").mib == 3_072
    book.reconfigure({**SPECS, "small": ModelSpec("small", memory=MemoryNeed(1_536))}, ONE_4G, ["small"])
    assert book.need("small").mib == 3_072  # its process still uses what was measured
    book.gone("small")
    assert book.need("small").mib == 1_536  # trusted from its next start


def BUSY(model: str) -> bool:
    return True  # a start must wait for it to stop


def test_a_reload_lowering_a_running_models_declaration_counts_the_old_figure_until_it_stops():
    book = MemoryBook(ONE_4G, SPECS)
    book.starting("small", ("0",), 0.0)
    lowered = {**SPECS, "small": ModelSpec("small", memory=MemoryNeed(512))}
    book.reconfigure(lowered, ONE_4G, ["small"])
    assert book.room("other", ["small"], BUSY).evict == frozenset()  # 1 024 + 2 048 fit in 4 096
    bigger = {**lowered, "other": ModelSpec("other", memory=MemoryNeed(3_584))}
    book.reconfigure(bigger, ONE_4G, ["small"])
    assert book.room("other", ["small"], BUSY).evict == {"small"}  # 3 584 fits beside 512, not the 1 024 held
    book.gone("small")
    book.starting("small", ("0",), 5.0)
    assert book.room("other", ["small"], BUSY).evict == frozenset()  # restarted, it counts 512


def test_fifo_places_nothing_so_measures_nothing():
    from scheduling.core import build_scheduler

    fifo = build_scheduler("fifo", SPECS, SwapPolicy([], SPECS), SerialSettings())
    assert fifo.memory_measured("small", {"0": 3_072}) is None


@property_settings(200)
@given(declared=st.integers(1, 4_096), uses=st.lists(st.dictionaries(st.sampled_from(["0", "1"]), st.integers(0, 8_192),
                                                                     max_size=2), max_size=6))
def test_what_placement_counts_is_never_below_the_declaration_nor_any_use_measured(declared, uses):
    specs = {"m": ModelSpec("m", memory=MemoryNeed(declared))}
    book = MemoryBook(Hardware({"0": 8_192, "1": 8_192}), specs)
    book.starting("m", ("0",), 0.0)
    warnings = [book.measured("m", use) for use in uses]
    highest = max([declared, *(mib for use in uses for mib in use.values())])
    assert book.need("m").mib == highest
    told, most = [], declared
    for use in uses:  # a warning each time the use is higher than the declaration and every earlier use
        told.append(max(use.values(), default=0) > most)
        most = max([most, *use.values()])
    assert [w is not None for w in warnings] == told
    book.gone("m")
    assert book.need("m").mib == highest  # the next start counts it too


def test_a_model_measured_above_every_gpu_is_refused_at_once_once_stopped_and_never_blocks_another():
    s = scheduler()
    run(s, 1, "small", 0.0)
    assert [type(e).__name__ for e in s.submit(Ticket(2, "small", 0, 10.0), 10.0)] == ["Grant"]
    assert s.submit(Ticket(3, "small", 0, 11.0), 11.0) == []  # waits for small's one slot
    s.memory_measured("small", {"0": 5_000})  # more than the 4 GiB GPU: it runs, but can never start again
    why = ("model 'small' needs 5000 MiB on a GPU, measured with nvidia-smi (it declared 1024 MiB), more than the "
           "hardware holds (the largest GPU, 0, has 4096 MiB), so it can never start here — raise the GPUs' memory "
           "under hardware.gpus if it is understated, or make the model use less (its context size), then reload")
    assert s.memory.never_fits("small") == why
    assert s.finished(2, 12.0)[0].ticket_id == 3  # loaded, it still serves
    assert s.unload(["small"], 13.0) == [StopModel("small", "unload")]  # with #3 running on it
    assert s.submit(Ticket(4, "small", 0, 14.0), 14.0) == [Refuse(4, 503, "model_too_large", why)]
    s.finished(3, 15.0)
    s.model_stopped("small", 16.0)
    assert s.submit(Ticket(5, "small", 0, 17.0), 17.0) == [Refuse(5, 503, "model_too_large", why)]
    effects = s.submit(Ticket(6, "other", 0, 18.0), 18.0)
    assert [(e.model, e.gpus) for e in effects if isinstance(e, StartModel)] == [("other", ("0",))]
    assert s.room_for("small") is None


def test_a_start_waiting_when_a_reload_leaves_too_little_memory_for_its_measured_use_is_refused():
    s = scheduler()
    run(s, 1, "small", 0.0)
    s.memory_measured("small", {"0": 3_000})
    s.unload(["small"], 3.0)
    s.model_stopped("small", 4.0)
    assert s.submit(Ticket(2, "other", 0, 5.0), 5.0)[0] == StartModel("other", (), ("0",))
    s.model_ready("other", 6.0)  # #2 runs on other
    effects = s.submit(Ticket(3, "small", 0, 7.0), 7.0)  # 3000 + 2048 > 4096: it waits for other's request
    assert not any(isinstance(e, (StartModel, Refuse)) for e in effects)
    smaller = Hardware({"0": 2_560})  # other's 2 GiB fits; small's measured 3000 MiB never does
    effects = s.reconfigure(SPECS, SwapPolicy([SwapGroup("all", tuple(SPECS), swap=False, exclusive=False)], SPECS),
                            [], 8.0, smaller)
    assert [(e.ticket_id, e.status, e.code) for e in effects if isinstance(e, Refuse)] == [(3, 503, "model_too_large")]


def test_models_measured_using_more_than_their_gpu_has_are_told_once_and_shown_until_one_stops():
    book = MemoryBook(ONE_4G, SPECS)
    book.starting("small", ("0",), 0.0)
    book.starting("other", ("0",), 0.0)
    assert book.measured("small", {"0": 1_000}) is None
    told = book.measured("other", {"0": 3_500})
    assert told.endswith("GPU 0's models are measured using 4500 MiB, more than its 4096 MiB (hardware.gpus): its "
                         "memory is overcommitted"), told
    assert book.measured("other", {"0": 3_500}) is None  # told once
    assert book.view(BUSY)["gpus"][0]["overcommitted"] is True
    book.gone("small")
    assert book.view(BUSY)["gpus"][0]["overcommitted"] is False
