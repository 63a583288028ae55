"""Database calls from threads outside Django's request cycle: executor threads, and Channels consumers' calls.

Django closes a connection a database blink broke only when a request starts or ends; a thread outside that
cycle would fail on it ("the connection is closed") until the process restarts. Each call made through
`on_fresh_connection` first closes an unusable connection, so it opens a new one once the database is back.
(Async callers use channels' `database_sync_to_async`, which does the same.)

With CONN_MAX_AGE 0 that also closes a usable connection, so each call opens one (most of a short query's cost).
Threads that are a caller's own (an executor only it uses) keep theirs with `on_kept_connection` instead.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from django.db import DatabaseError, close_old_connections, connection

T = TypeVar("T")


def on_fresh_connection(fn: Callable[..., T], *args: Any) -> T:
    close_old_connections()
    return fn(*args)


def on_kept_connection(fn: Callable[..., T], *args: Any) -> T:
    """Call `fn` on this thread's open connection; a call that failed on the database closes it, so the next one
    opens a new connection (the database blinked) rather than failing on the broken one."""
    try:
        return fn(*args)
    except DatabaseError:
        connection.close()
        raise
