"""The channel layer's own background tasks failing while Redis is away.

channels_redis starts tasks of its own (putting back a message it had read, after a receive was cancelled) that
end with Redis's ConnectionError during an outage. Nothing awaits them, so asyncio prints each as "Task exception
was never retrieved" with a whole traceback, though the outage itself is already logged, once, by whatever felt
it. This handler logs such an ending in one line and leaves every other unhandled error to asyncio's own report.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("llamaswap.wire")
_UNRETRIEVED = "Task exception was never retrieved"


def report_loop_error(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The event loop's exception handler: a layer task ended by a Redis outage is one line; the rest as usual."""
    exc = context.get("exception")
    if context.get("message") == _UNRETRIEVED and isinstance(exc, (RedisConnectionError, RedisTimeoutError)):
        log.warning("a channel layer task ended while Redis was away (%s: %s)", type(exc).__name__, exc)
        return
    loop.default_exception_handler(context)
