"""A batch whose run fails unexpectedly, again and again: its lines at the model are let finish (not cut, to be
sent again next round), it is taken up again less and less often, and the cause is logged once."""

from __future__ import annotations

import asyncio
import logging

from proxy.batches import runner


def test_repeated_unexpected_failures_let_lines_finish_back_off_and_log_once(monkeypatch, caplog):
    async def rows(fn, *args):
        return {"batch_state": ("in_progress",), "reclaim_lines": 0}[fn.__name__]

    monkeypatch.setattr(runner, "_db", rows)
    batch_runner = runner.BatchRunner(None, sole=True)
    finished: list[str] = []

    async def send_lines(batch_id, lines):
        async def at_model():
            answered = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.05, answered.set_result, None)
            await answered
            finished.append(batch_id)

        lines.in_flight.add(asyncio.get_running_loop().create_task(at_model()))
        raise RuntimeError("the same cause")

    waited: list[float] = []

    async def backed_off(batch_id, seconds):  # the wait itself (ended early by a cancel or expiry) is tested end to end
        waited.append(seconds)

    monkeypatch.setattr(batch_runner, "_send_lines", send_lines)
    monkeypatch.setattr(batch_runner, "_back_off", backed_off)

    async def rounds():
        for _ in range(8):
            await batch_runner._run_batch("batch_x")

    with caplog.at_level(logging.ERROR, "llamaswap.batches"):
        asyncio.run(rounds())
    assert finished == ["batch_x"] * 8  # each round's line at the model ended on its own
    assert waited == [1, 2, 4, 8, 16, 32, 60, 60]
    assert [r.getMessage().count("the same cause") for r in caplog.records] == [1]


def test_a_back_off_waits_its_delay_unless_the_batch_is_cancelled_meanwhile(monkeypatch):
    """The wait between runs of a failing batch lasts its delay, and ends within a poll once the batch is cancelled
    (its lines end, the batch is finalized) rather than after the delay, which may be a minute."""
    status = {"batch_x": "in_progress"}
    finalized: list[tuple[str, str]] = []
    far = runner.timezone.now() + runner.timedelta(days=1)

    async def rows(fn, *args):
        if fn.__name__ == "finalize":
            finalized.append((args[0], args[2]))
        return {"batch_state": (status[args[0]], far), "reclaim_lines": 0, "end_pending": 0}.get(fn.__name__)

    monkeypatch.setattr(runner, "_db", rows)
    batch_runner = runner.BatchRunner(None, sole=True)

    async def timed(delay):
        loop = asyncio.get_running_loop()
        began = loop.time()
        await batch_runner._back_off("batch_x", delay)
        return loop.time() - began

    async def waits():
        whole = await timed(0.3)
        assert finalized == []
        asyncio.get_running_loop().call_later(0.1, status.update, {"batch_x": "cancelling"})
        return whole, await timed(60)

    whole, cut_short = asyncio.run(waits())
    assert whole >= 0.3
    assert cut_short < runner.POLL_S + 1
    assert finalized == [("batch_x", "cancelled")]
