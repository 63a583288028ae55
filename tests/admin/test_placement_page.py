"""The Models page's placement figures, from a `Placement` answer as the runtime gives it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from scheduling.operating.placement_page import boxes, size

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def answer(cpu_mib: int | None, measured: int | None = None) -> dict:
    placed = {"gpus": ["0"], "declared_mib": 20_480, "busy": True, "protected": "lease #4", "load_s": 41.2,
              "eviction_cost": 45.3}
    return {"box": "gpu-box-1",
            "gpus": [{"id": "0", "memory_mib": 24_576, "declared_mib": 20_480, "models": ["chat"],
                      **({} if measured is None else {"measured_mib": measured})}],
            "cpu": {"memory_mib": cpu_mib, "declared_mib": 0, "models": []},
            "models": {"chat": {**placed, **({} if measured is None else {"measured_mib": measured})}}}


def lease(pk: int, model: str, minutes: int):
    return SimpleNamespace(pk=pk, model=model, expires_at=NOW + timedelta(minutes=minutes))


def test_sizes_read_as_mib_below_a_gib_and_gib_above():
    assert [size(mib) for mib in (0, 512, 1023, 1024, 20_480, 1536)] == [
        "0 MiB", "512 MiB", "1023 MiB", "1.0 GiB", "20.0 GiB", "1.5 GiB"]


def test_the_cpu_is_a_line_only_when_counted_and_measures_only_where_the_answer_has_them():
    [uncounted] = boxes([answer(None)], [], "/leases/")
    assert [m.name for m in uncounted.memory] == ["GPU 0"]
    assert uncounted.memory[0].measured is None and uncounted.models[0].measured is None
    [counted] = boxes([answer(65_536, measured=21_000)], [], "/leases/")
    assert [(m.name, m.capacity, m.declared, m.measured) for m in counted.memory] == [
        ("GPU 0", "24.0 GiB", "20.0 GiB", "20.5 GiB"), ("CPU", "64.0 GiB", "0 MiB", None)]
    assert counted.models[0].measured == "20.5 GiB"


def test_each_box_is_numbered_and_a_model_shows_its_longest_lease_linked_in_the_lease_list():
    first, second = boxes([answer(None), answer(None)], [lease(3, "chat", 5), lease(4, "chat", 60),
                                                         lease(5, "other", 90)], "/admin/leases/")
    assert (first.number, second.number, first.name) == (1, 2, "gpu-box-1")
    chat = first.models[0]
    assert (chat.model, chat.gpus, chat.declared, chat.busy, chat.protected) == ("chat", ("0",), "20.0 GiB", True,
                                                                                 "lease #4")
    assert (chat.lease.id, chat.lease.expires_at, chat.lease.url) == (4, NOW + timedelta(minutes=60),
                                                                      "/admin/leases/?id__exact=4")


def test_a_gpu_a_reload_removed_while_models_run_on_it_says_it_is_retiring():
    shown = answer(None)
    shown["gpus"].append({"id": "1", "memory_mib": 24_576, "declared_mib": 0, "models": [], "retiring": True})
    [box] = boxes([shown], [], "/leases/")
    assert [m.name for m in box.memory] == ["GPU 0", "GPU 1 (retiring)"]
