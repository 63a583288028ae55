"""A channel layer task ended by a Redis outage is one log line, not a traceback; other unhandled errors are
reported as asyncio always does."""

from __future__ import annotations

import asyncio
import gc
import logging

from redis.exceptions import ConnectionError as RedisConnectionError

from scheduling.door.layer_task_errors import report_loop_error


def ended_unretrieved(exc: BaseException, caplog) -> str:
    """What was logged of `exc`, raised by a task nobody awaited. Only the records about `exc` are kept: a
    collection can report tasks that other tests in this process left behind."""
    async def fails():
        raise exc

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(report_loop_error)
        task = loop.create_task(fails())
        await asyncio.sleep(0)
        del task  # dropped unawaited: asyncio reports it once it is collected

    gc.collect()  # others' leftovers reported now, before the capture
    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
        gc.collect()
    about = [r for r in caplog.records
             if (r.exc_info and r.exc_info[1] is exc) or str(exc) in r.getMessage()]
    assert about, "nothing was logged of the task's exception"
    return "\n".join(caplog.handler.format(r) for r in about)


def test_a_layer_task_ended_by_redis_away_is_one_line(caplog):
    text = ended_unretrieved(RedisConnectionError("Error 111 connecting"), caplog)
    assert "a channel layer task ended while Redis was away (ConnectionError: Error 111 connecting)" in text
    assert "Traceback" not in text and "never retrieved" not in text


def test_any_other_unretrieved_error_is_reported_as_asyncio_does(caplog):
    text = ended_unretrieved(ValueError("a real bug"), caplog)
    assert "Task exception was never retrieved" in text and "a real bug" in text
