"""The disk is full under a request: where the HTTP server spools its body (`TMPDIR`), where Django copies the body
before a view runs (`TMPDIR` too, past 2.5 MB), where an upload's file is written (`LLAMASWAP_FILES_DIR`), or under
the database a route writes its rows to. Wherever it strikes, the client gets the same answer — 507 Insufficient
Storage, OpenAI-shaped, saying the disk is full and nothing of the request was kept — the operator a log line naming
where, and the service serves on.

507 rather than 503: the disk does not empty itself in seconds, so no `Retry-After` could be honest; the operator
must free space. Clients still read it as a server error (the openai SDK retries it as it retries any 5xx)."""

from __future__ import annotations

import errno
import logging
import tempfile

from proxy.serving.errors import ProxyError

log = logging.getLogger("llamaswap.http")

FULL = frozenset({errno.ENOSPC, errno.EDQUOT})  # no space left; a disk quota exceeded
SQLITE_FULL = 13  # "database or disk is full"
POSTGRESQL_DISK_FULL = "53100"


def is_disk_full(exc: BaseException) -> bool:
    """A file's write found no room, or the database's did (Django's error, raised from the driver's: SQLite's
    SQLITE_FULL, PostgreSQL's disk_full)."""
    if isinstance(exc, OSError):
        return exc.errno in FULL
    driver = exc.__cause__
    return (getattr(driver, "sqlite_errorcode", None) == SQLITE_FULL
            or getattr(driver, "sqlstate", None) == POSTGRESQL_DISK_FULL)


def disk_full(what: str) -> ProxyError:
    """The answer to a request whose `what` could not be stored; the path stays in the log, not the answer."""
    return ProxyError(507, f"the server's disk is full: {what} could not be stored and nothing of it was kept; "
                           "retry once the operator has freed space", "disk_full")


class DiskFullAnswerer:
    """ASGI middleware in front of Django: Django reads a whole request body into a temporary file before any view
    runs, and a full disk there escapes it (daphne would answer a bare 500). Answered 507, once the rest of the body
    (still arriving from the server's own spool) is read and dropped."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        answered, body_left = False, True

        async def receiving():
            nonlocal body_left
            message = await receive()
            body_left = message["type"] == "http.request" and message.get("more_body", False)
            return message

        async def sending(message):
            nonlocal answered
            answered = True
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        except OSError as exc:
            if answered or not is_disk_full(exc):
                raise
            log.warning("%s %s answered 507: the disk is full reading its body into %s (%s)", scope["method"],
                        scope["path"], tempfile.gettempdir(), exc)
            while body_left:
                await receiving()
            refused = disk_full("the request body")
            body = refused.body()
            await send({"type": "http.response.start", "status": refused.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
