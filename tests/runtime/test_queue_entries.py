"""What the caller is told about its place: queue entries from the live runtime, and operator cuts."""

from __future__ import annotations

import pytest

from scheduling.core.durations import JobKind
from scheduling.core.mentions import plain, told
from scheduling.door.queue_entries import queue_entries
from scheduling.tickets import Refused

CHAT = "/v1/chat/completions"


def learned(gpu, jobs: dict[str, float], loads: dict[str, float]) -> None:
    """Durations as a restarted service reads them back from its rows: three of each, so that what
    the test's own instant starts add does not move the median."""
    for _ in range(3):
        for model, seconds in jobs.items():
            gpu.runtime.durations.add_job(JobKind(model, "other", False, "normal"), seconds)
        for model, seconds in loads.items():
            gpu.runtime.durations.add_load(model, seconds)


async def test_waiting_requests_are_ranked_with_predicted_waits_behind_the_running_job(gpu_for):
    gpu = gpu_for("chat", "coder")
    learned(gpu, {"chat": 600.0, "coder": 30.0}, {"chat": 20.0, "coder": 10.0})
    batch, batch_lease = await gpu.running("chat")
    coder = await gpu.submit("coder", priority=100)
    chat = await gpu.submit("chat", priority=0)
    entries = {entry.ticket_id: entry for entry in queue_entries(gpu.runtime)}
    running = entries[batch.ticket_id]
    assert (running.state, running.eta_s, running.position) == ("running", 0.0, None)
    first, second = entries[coder.ticket_id], entries[chat.ticket_id]
    assert (first.state, first.position, second.position) == ("waiting", 1, 2)
    assert first.eta_s == pytest.approx(600 + 10, abs=1)  # the batch job, then loading coder
    assert second.eta_s == pytest.approx(600 + 10 + 30 + 20, abs=1)  # then coder's job, then chat again
    assert plain(first.outlook).startswith("next in the queue; ~10 min: a normal job on chat ends in ~10 min")
    assert "then loading coder takes ~10 s" in first.outlook
    assert told(first.outlook, {"coder"}.__contains__).startswith(
        "next in the queue; ~10 min: a normal job on another model ends in ~10 min")
    assert second.outlook.startswith("#2 in the queue, 1 ahead")
    gpu.finish(batch_lease)
    await gpu.fleet.start("coder")
    gpu.finish(await coder.lease())
    await gpu.fleet.start("chat")
    gpu.finish(await chat.lease())


async def test_without_history_the_entry_says_there_is_no_prediction(gpu_for):
    gpu = gpu_for("chat")
    _, lease = await gpu.running("chat")
    waiting = await gpu.submit("chat")
    (entry,) = [e for e in queue_entries(gpu.runtime) if e.ticket_id == waiting.ticket_id]
    assert entry.eta_s is None and entry.position == 1
    assert plain(entry.outlook).startswith("next in the queue; behind a normal job on chat, running for 1 s; "
                                           "no prediction: no history yet")
    gpu.finish(lease)
    gpu.finish(await waiting.lease())


async def test_the_jobs_that_end_here_teach_the_forecast(gpu_for):
    gpu = gpu_for("chat")
    _, lease = await gpu.running("chat")
    gpu.finish(lease)
    assert gpu.runtime.durations.job_s(JobKind("chat", "other", False, "normal")) is not None
    assert gpu.runtime.durations.load_s("chat") is not None


async def test_an_operator_cut_ends_a_running_request_and_tells_its_client(gpu_for):
    gpu = gpu_for("chat")
    client, lease = await gpu.running("chat")
    assert gpu.runtime.operators.cut(client.ticket_id)
    assert isinstance(lease.cut, Refused) and lease.cut.code == "cancelled_by_operator"
    assert gpu.state(client) == "cancelled" and gpu.row(client)["status_code"] == 503
    assert not gpu.runtime.operators.cut(client.ticket_id), "already ended"


async def test_a_failing_forecast_costs_the_prediction_and_nothing_else(gpu_for, monkeypatch, caplog):
    import scheduling.runtime.forecasting as runtime_module

    def broken(*args, **kwargs):
        raise AssertionError("a bug in the copy")

    monkeypatch.setattr(runtime_module, "forecast", broken)
    gpu = gpu_for("chat")
    _, lease = await gpu.running("chat")
    waiting = await gpu.submit("chat", max_wait_s=0.05)
    (entry,) = [e for e in queue_entries(gpu.runtime) if e.ticket_id == waiting.ticket_id]
    assert (entry.state, entry.position, entry.eta_s) == ("waiting", 1, None) and "the forecast failed" in entry.outlook
    with pytest.raises(Refused) as refused:  # its maximum wait still runs out, with the default Retry-After
        await waiting.lease()
    assert refused.value.code == "max_wait_exceeded"
    assert "the forecast of the queue failed" in caplog.text
    gpu.finish(lease)
