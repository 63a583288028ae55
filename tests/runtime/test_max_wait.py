"""A caller's maximum wait (`TicketRequest.max_wait_s`): refused in time with when to retry, its place
freed; a request granted in time is left alone. And when a model's place frees, for a 429."""

from __future__ import annotations

import asyncio

import pytest

from scheduling.core.durations import JobKind
from scheduling.runtime import MAX_WAIT_RETRY_AFTER_S
from scheduling.tickets import Refused

from .fakes import DEADLINE


def learned(gpu, model: str, job_s: float) -> None:
    for _ in range(3):
        gpu.runtime.durations.add_job(JobKind(model, "other", False, "normal"), job_s)


async def refusal(client) -> Refused:
    with pytest.raises(Refused) as caught:
        await asyncio.wait_for(client.task, DEADLINE)
    return caught.value


async def test_a_request_not_granted_within_its_maximum_wait_is_refused_and_frees_its_place(gpu_for):
    gpu = gpu_for("chat")
    _, lease = await gpu.running("chat")
    impatient = await gpu.submit("chat", priority=100, max_wait_s=0.05)
    patient = await gpu.submit("chat")
    refused = await refusal(impatient)
    assert (refused.status, refused.code) == (503, "max_wait_exceeded")
    assert refused.retry_after == MAX_WAIT_RETRY_AFTER_S, "no history: no prediction to retry by"
    assert "within its maximum wait of 0.05 s" in refused.message
    row = gpu.row(impatient)
    assert (row["state"], row["status_code"], row["error"]) == ("rejected", 503, refused.message)
    assert not gpu.runtime.scheduler.is_queued(impatient.ticket_id)
    gpu.finish(lease)
    gpu.finish(await patient.lease())  # next in line once the impatient one left


async def test_the_retry_after_of_a_missed_wait_is_the_predicted_wait(gpu_for):
    gpu = gpu_for("chat")
    learned(gpu, "chat", 600.0)
    _, lease = await gpu.running("chat")
    refused = await refusal(await gpu.submit("chat", max_wait_s=0.05))
    assert 590 <= refused.retry_after <= 600, "the running job's typical 600 s, less what it has run"
    assert "it was expected to be sent in ~" in refused.message
    gpu.finish(lease)


async def test_a_request_queued_after_the_last_forecast_is_told_its_own_predicted_wait(gpu_for):
    """A forecast made before the request came knows nothing of it: its refusal asks for one that does, rather than
    telling the client the fallback."""
    gpu = gpu_for("chat")
    learned(gpu, "chat", 600.0)
    _, lease = await gpu.running("chat")
    patient = await gpu.submit("chat")
    assert patient.ticket_id in gpu.runtime.forecasting.forecast()  # a page or a stream asked meanwhile
    refused = await refusal(await gpu.submit("chat", max_wait_s=0.05))
    assert refused.retry_after >= 590, "its predicted wait, not the fallback"
    gpu.finish(lease)
    gpu.finish(await patient.lease())


async def test_a_request_granted_within_its_maximum_wait_is_left_alone(gpu_for):
    gpu = gpu_for("chat")
    _, lease = await gpu.running("chat")
    client = await gpu.submit("chat", max_wait_s=0.2)
    gpu.finish(lease)
    granted = await client.lease()
    await asyncio.sleep(0.3)  # past the limit: its timer must have gone with the grant
    assert gpu.state(client) == "dispatched" and granted.cut is None
    gpu.finish(granted)
    assert gpu.state(client) == "completed"


async def test_the_first_running_job_to_end_says_when_a_model_frees_a_place(gpu_for):
    gpu = gpu_for("chat")
    assert gpu.runtime.next_job_end_in("chat") is None, "nothing runs"
    _, lease = await gpu.running("chat")
    assert gpu.runtime.next_job_end_in("chat") is None, "no history"
    learned(gpu, "chat", 30.0)
    assert 29 <= gpu.runtime.next_job_end_in("chat") <= 30
    gpu.finish(lease)


async def test_many_waits_running_out_at_once_share_one_forecast(gpu_for, monkeypatch):
    """Each refusal changes the queue; were each to forecast the rest of it again, a few hundred limits
    running out together would hold the event loop for seconds."""
    import scheduling.runtime.forecasting as runtime_module

    runs = []
    real_forecast = runtime_module.forecast
    monkeypatch.setattr(runtime_module, "forecast", lambda *a, **k: runs.append(1) or real_forecast(*a, **k))
    gpu = gpu_for("chat")
    learned(gpu, "chat", 600.0)
    _, lease = await gpu.running("chat")
    clients = [await gpu.submit("chat", max_wait_s=0.1) for _ in range(200)]
    refused = [await refusal(client) for client in clients]
    assert {r.code for r in refused} == {"max_wait_exceeded"} and all(r.retry_after >= 590 for r in refused)
    assert len(runs) <= 3, f"{len(runs)} forecasts for 200 refusals"
    gpu.finish(lease)
