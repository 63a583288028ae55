"""Reloads that change the hardware under models placed on it: a GPU removed (or renamed) while a model runs there
stays in the book, retiring, with that model until it stops, nothing new goes there, and the model restarts on a
listed GPU once idle."""

from scheduling.core import (
    ModelSpec, Refuse, SerialScheduler, SerialSettings, StartModel, StopModel, SwapGroup, SwapPolicy, Ticket,
)
from scheduling.core.placement import Hardware, MemoryNeed

TWO_16 = Hardware({"0": 16_000, "1": 16_000})
ONE_16 = Hardware({"0": 16_000})


def together(specs) -> SwapPolicy:
    """Memory alone decides what runs together."""
    return SwapPolicy([SwapGroup("all", tuple(specs), swap=False, exclusive=False)], specs)


def specs(**mib) -> dict[str, ModelSpec]:
    return {model: ModelSpec(model, memory=MemoryNeed(size)) for model, size in mib.items()}


def started(effects) -> list[tuple[str, tuple[str, ...], tuple[str, ...] | None]]:
    return [(e.model, e.evict, e.gpus) for e in effects if isinstance(e, StartModel)]


def two_running(models: dict[str, ModelSpec]) -> SerialScheduler:
    """a on GPU 0 and b on GPU 1, each serving a request (#1 and #2)."""
    s = SerialScheduler(models, together(models), SerialSettings(), TWO_16)
    assert started(s.submit(Ticket(1, "a", 0, 0.0), 0.0)) == [("a", (), ("0",))]
    s.model_ready("a", 1.0)
    assert started(s.submit(Ticket(2, "b", 0, 1.0), 1.0)) == [("b", (), ("1",))]
    s.model_ready("b", 2.0)
    return s


def test_a_gpu_removed_under_a_busy_model_retires_with_it_and_the_model_restarts_on_a_listed_gpu_once_idle():
    models = specs(a=10_000, b=10_000, c=4_000)
    s = two_running(models)
    assert s.reconfigure(models, together(models), [], 3.0, ONE_16) == []  # b is busy: it runs on
    gpus = s.placement()["gpus"]
    assert [(g["id"], g["models"], g["retiring"]) for g in gpus] == [("0", ["a"], False), ("1", ["b"], True)]
    effects = s.submit(Ticket(3, "c", 0, 4.0), 4.0)  # fits beside a on GPU 0; GPU 1 is retiring
    assert started(effects) == [("c", (), ("0",))]
    s.model_ready("c", 5.0)
    assert s.submit(Ticket(4, "b", 0, 5.0), 5.0) == []  # b takes no new work on the old GPU
    assert s.finished(2, 6.0) == [StopModel("b", "reload")]
    assert s.model_stopped("b", 7.0) == []  # a holds GPU 0 (busy), c too: #4 waits for room
    assert [g["id"] for g in s.placement()["gpus"]] == ["0"]  # the retiring GPU is forgotten with its last model
    assert started(s.finished(1, 8.0)) == [("b", ("a",), ("0",))]  # c still serves #3: a, idle, makes room


def test_a_renamed_gpu_is_a_gpu_removed_and_one_added_and_nothing_fails():
    models = specs(a=10_000, b=10_000)
    s = two_running(models)
    renamed = Hardware({"0": 16_000, "gpu1": 16_000})
    s.reconfigure(models, together(models), [], 3.0, renamed)
    shown = s.placement()
    assert [(g["id"], g["models"], g["retiring"]) for g in shown["gpus"]] == [
        ("0", ["a"], False), ("gpu1", [], False), ("1", ["b"], True)]
    assert s.room_for("b").gpus == ("gpu1",)
    effects = s.finished(2, 4.0)
    assert effects == [StopModel("b", "reload")]
    s.model_stopped("b", 5.0)
    assert started(s.submit(Ticket(3, "b", 0, 5.0), 5.0)) == [("b", (), ("gpu1",))]
    assert not any(isinstance(e, Refuse) for e in effects)


def test_a_model_a_start_is_stopping_stays_out_of_the_book_through_a_reload_and_nothing_lands_beside_its_ghost():
    """A start takes the memory of the models it stops at once; a reload while they are still stopping must not put
    them back (found by the placement property machine: an 8 000 and a 12 000 MiB model on one 16 000 MiB GPU)."""
    models = specs(b=12_000, d=8_000)
    s = SerialScheduler(models, together(models), SerialSettings(), Hardware({"0": 16_000}))
    assert started(s.submit(Ticket(1, "d", -100, 0.0), 0.0)) == [("d", (), ("0",))]
    renamed = Hardware({"1": 16_000})
    assert s.reconfigure(models, together(models), [], 1.0, renamed) == []  # d's start runs on, on GPU 0
    assert started(s.model_failed("d", "exited prematurely", 2.0)) == [("d", (), ("1",))]  # #1 tries again
    s.model_ready("d", 3.0)
    assert s.submit(Ticket(2, "b", -100, 3.0), 3.0) == []  # d serves #1 and b does not fit beside it
    assert started(s.finished(1, 4.0)) == [("b", ("d",), ("1",))]
    s.reconfigure(models, together(models), [], 5.0, Hardware({"0": 16_000}))  # renamed back while d stops for b
    assert "d" not in s.memory.placed(), "the model b's start stops was put back in the book"
    assert started(s.model_failed("b", "exited prematurely", 6.0)) == [("b", (), ("0",))]
    gpus = s.placement()["gpus"]
    assert [(g["id"], g["models"], g["counted_mib"]) for g in gpus] == [("0", ["b"], 12_000)]
