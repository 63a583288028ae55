"""Database calls from threads outside Django's request cycle: executor threads, and Channels consumers' calls.

Django closes a connection a database blink broke only when a request starts or ends; a thread outside that
cycle would fail on it ("the connection is closed") until the process restarts. Each call made through
`on_fresh_connection` first closes an unusable connection, so it opens a new one once the database is back.
(Async callers use channels' `database_sync_to_async`, which does the same.)
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from django.db import close_old_connections

T = TypeVar("T")


def on_fresh_connection(fn: Callable[..., T], *args: Any) -> T:
    close_old_connections()
    return fn(*args)
