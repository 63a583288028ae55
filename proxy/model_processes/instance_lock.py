"""One serving llamaswap per data dir and per database.

Start-up recovery treats every unfinished row and every recorded model process as left behind by
a run that died. A second service on the same data would stop the first's models, mark its rows
interrupted and hand out the ticket ids the first is using. So the serving process takes this lock
before it migrates or recovers anything and holds it for its whole life: an flock on
`llamaswap.lock` in the data dir and, when the rows live in PostgreSQL (which several data dirs may
share), a session advisory lock on a connection kept open. The kernel and the database server drop
both when the process ends, SIGKILL included, so there is nothing to clean up after a crash.

The database server also drops the advisory lock when only the connection ends (a server restart, a
failover, a terminated backend). A watchdog thread therefore checks the lock connection every few
seconds and takes the lock again on a new connection; if another service took it meanwhile, this one
shuts down rather than share the database.

Only serving takes it: `migrate`, `createsuperuser`, `serve --check` and `fakemodel` never do.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proxy.model_processes import proctable

LOCK_FILE = "llamaswap.lock"
# pg_try_advisory_lock(int4, int4) key: "llam", "swap". Advisory locks are per database.
ADVISORY_KEY = (0x6C6C616D, 0x73776170)

# How often the watchdog checks that the PostgreSQL lock connection is still there.
WATCH_INTERVAL_S = float(os.environ.get("LLAMASWAP_LOCK_CHECK_SECONDS", "2"))
# How long a standby leaves a lock that came free to an active service that may still run: three
# of its watchdog's rounds, in which it takes its lock again after a blink of the database.
TAKEOVER_GRACE_S = 3 * WATCH_INTERVAL_S
MODEL_LOCK_WAIT_S = 5.0
APPLICATION_NAME_MAX = 63  # PostgreSQL keeps this much of a connection's application_name

log = logging.getLogger("llamaswap.lock")
_held: list = []  # the open lock file and PostgreSQL connection; closing either would free the lock


class InstanceLockError(Exception):
    """Another live service holds the data dir or the database (or the database cannot be reached)."""


@dataclass(frozen=True)
class _Scope:
    """What one lock covers: the whole service, or (a worker in distributed mode) one set of models."""

    role: str
    lock_file: str
    advisory_key: tuple[int, int]
    model_keys: dict[str, tuple[int, int]] = field(default_factory=dict)  # one lock per model of the set


def _int4(text: str) -> int:
    digest = zlib.crc32(text.encode())
    return digest - (1 << 32) if digest >= 1 << 31 else digest


def _scope(role: str, models: Sequence[str] | None) -> _Scope:
    if models is None:
        return _Scope(role, LOCK_FILE, ADVISORY_KEY)
    key = _int4("\n".join(sorted(models)))
    return _Scope(
        role, f"llamaswap-{key & 0xFFFFFFFF:08x}.lock", (ADVISORY_KEY[0], key),
        {model: (ADVISORY_KEY[0] + 1, _int4(model)) for model in models},
    )


def hold_instance_lock(
    *, role: str = "serve", models: Sequence[str] | None = None, standby: Callable[[str], None] | None = None
) -> None:
    """Lock this process's data dir and database for the rest of its life. Idempotent.

    Raises InstanceLockError, naming what is held and by which process, when another service holds it;
    with `standby`, tells it so instead and waits for the other one to end (a standby worker, which
    takes over the moment the active one dies: the kernel and the database server free its locks).
    `models` are a worker's: workers of other GPU boxes share the database, but a model is never two
    workers' (each model has a lock of its own too).
    """
    if _held:
        return
    from django.conf import settings

    scope = _scope(role, models)
    lock_file = _lock_data_dir(Path(settings.DATA_DIR), scope, standby)
    try:
        connection = _lock_database(settings.DATABASES["default"], scope, standby)
    except BaseException:
        os.close(lock_file)
        raise
    _held.extend([lock_file, connection])
    if connection is not None:
        threading.Thread(
            target=_watch_database_lock, args=(settings.DATABASES["default"], scope), name="llamaswap-lock-watchdog",
            daemon=True,
        ).start()


def _watch_database_lock(database: dict, scope: _Scope) -> None:
    """Keep the advisory lock for the process's life, even when its connection is dropped under it.
    An outage is logged once when it begins and once when the lock is held again, not every round."""
    import psycopg

    stop = threading.Event()
    lost_at: float | None = None  # when the lock connection was found gone, while it is
    while not stop.wait(WATCH_INTERVAL_S):
        try:
            _held[1].execute("SELECT 1")
            continue
        except psycopg.Error as exc:
            if lost_at is None:
                lost_at = time.monotonic()
                log.warning("the connection holding the database lock was lost (%s); taking the lock again "
                            "every %gs until the database answers", exc, WATCH_INTERVAL_S)
        try:
            _held[1].close()
        except psycopg.Error:
            pass
        try:
            _held[1] = _lock_database(database, scope)
        except InstanceLockError as exc:
            if "cannot connect" in str(exc):
                continue  # the server is away: nobody else can take the lock while it is
            log.critical("lost the database lock: %s; shutting down", exc)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        log.warning("took the database lock again after %.1f s", time.monotonic() - lost_at)
        lost_at = None


def _lock_data_dir(data_dir: Path, scope: _Scope, standby: Callable[[str], None] | None) -> int:
    """flock the data dir's lock file and write our pid into it (for the message a second service prints)."""
    fd = os.open(data_dir / scope.lock_file, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by model processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        by = f" (pid {holder})" if holder.isdigit() else ""
        if standby is None:
            os.close(fd)
            raise InstanceLockError(
                f"another llamaswap{by} is already serving the data dir {data_dir}: stop it first, or give this one "
                "its own LLAMASWAP_DATA_DIR"
            ) from None
        standby(f"another llamaswap{by} is serving the data dir {data_dir}: standing by to take over when it stops")
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# The lock is held by a session: PostgreSQL ends it, and frees the lock for a standby, only once it finds the
# holder gone. Its defaults (the kernel's: two hours of silence) would keep a powered-off or cut-off worker's
# lock that long; these make the server probe the lock's connection after 5 s of silence and drop it after
# about 11 s without an answer. (A stopped process on a live machine still answers: its kernel does.)
LOCK_SESSION_OPTIONS = "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 " \
                       "-c tcp_user_timeout=10000"


def _lock_database(database: dict, scope: _Scope, standby: Callable[[str], None] | None = None):
    """With PostgreSQL, a session advisory lock on a connection of our own; None for SQLite (the file lock covers it)."""
    if database["ENGINE"] != "django.db.backends.postgresql":
        return None
    import psycopg

    params = {key: database[name] for key, name in
              (("dbname", "NAME"), ("user", "USER"), ("password", "PASSWORD"), ("host", "HOST"), ("port", "PORT"))
              if database.get(name)}
    where = f"the PostgreSQL database {database['NAME']!r} at {database.get('HOST') or 'localhost'}:{database.get('PORT') or 5432}"
    def connect():
        return psycopg.connect(
            **params, autocommit=True, connect_timeout=10, options=LOCK_SESSION_OPTIONS,
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3, tcp_user_timeout=10_000,
            application_name=f"llamaswap {scope.role} pid {os.getpid()} on {socket.gethostname()}"[:APPLICATION_NAME_MAX],
        )

    try:
        connection = connect()
    except psycopg.Error as exc:
        raise InstanceLockError(f"cannot connect to {where} (DATABASE_URL): {exc}") from None
    try:
        locked = connection.execute("SELECT pg_try_advisory_lock(%s::int4, %s::int4)", scope.advisory_key).fetchone()[0]
        holder = None if locked else _advisory_holder(connection, scope.advisory_key)
    except BaseException:
        connection.close()
        raise
    by = f" ({holder})" if holder else ""
    if not locked and standby is not None:
        standby(f"another llamaswap{by} is serving {where}: standing by to take over when it stops")
        connection = _stand_by(connection, connect, scope, where)
        locked = True
    if not locked:
        connection.close()
        raise InstanceLockError(
            f"another llamaswap{by} is already serving {where}: stop it first, or give this one its own "
            "DATABASE_URL"
        )
    # A standby woken by the dead worker's main lock may look before the server has freed the rest
    # of that worker's locks (it frees them one by one): those it waits a moment for.
    patience = time.monotonic() + (MODEL_LOCK_WAIT_S if standby is not None else 0.0)
    for model, key in scope.model_keys.items():
        while not (taken := connection.execute("SELECT pg_try_advisory_lock(%s::int4, %s::int4)", key).fetchone()[0]):
            if time.monotonic() >= patience:
                break
            time.sleep(0.1)
        if not taken:
            holder = _advisory_holder(connection, key)
            connection.close()
            raise InstanceLockError(
                f"model {model!r} is served by another worker{f' ({holder})' if holder else ''} whose config has other "
                "models: give each model to one worker's config (a standby has the same models as its worker)"
            )
    return connection


def _stand_by(connection, connect: Callable, scope: _Scope, where: str):
    """Wait on the lock until the active service ends; returns the connection that then holds it.

    The database frees the lock when the active service's connection ends, which its death and a
    blink of the database (a restart, a cut connection, a terminated backend) both do. Taking over
    after a blink would stop a live service's models and cut its streams, so a lock that comes free
    is taken only when the active service is known gone: on this machine, its pid no longer runs;
    on another (where its process cannot be seen), it has not taken the lock again within
    `TAKEOVER_GRACE_S`, its watchdog's reconnect time. A database that goes away meanwhile is waited
    out: a standby that exited then would leave nothing to take over later."""
    import psycopg

    quiet = False  # whether "standing by again" was logged since the last takeover attempt
    holder = None  # the active service's name, as last seen holding the lock
    while True:
        try:
            holder = _advisory_holder(connection, scope.advisory_key) or holder
            connection.execute("SELECT pg_advisory_lock(%s::int4, %s::int4)", scope.advisory_key)
            alive = _still_running(holder)
            if alive is False:
                return connection
            connection.execute("SELECT pg_advisory_unlock(%s::int4, %s::int4)", scope.advisory_key)
            if not quiet:
                log.warning("the lock on %s came free while %s %s: giving it %gs to take it again",
                            where, holder or "the active llamaswap", "still runs" if alive else "may still run",
                            TAKEOVER_GRACE_S)
            time.sleep(TAKEOVER_GRACE_S)
            if alive is None and connection.execute(
                    "SELECT pg_try_advisory_lock(%s::int4, %s::int4)", scope.advisory_key).fetchone()[0]:
                return connection  # on another machine and silent for the whole grace: taken for dead
            quiet = alive is True  # a live one on this machine: keep standing by, said once
            continue
        except psycopg.Error as exc:
            connection.close()
            log.warning("lost the connection to %s while standing by (%s); standing by again once it answers",
                        where, exc)
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                connection = connect()
                break
            except psycopg.Error:
                continue
        time.sleep(TAKEOVER_GRACE_S)  # the active one reconnects too, and retakes its lock first
        log.warning("%s answers again: standing by", where)


def _still_running(holder: str | None) -> bool | None:
    """Whether the service named by an advisory lock holder's application name ("llamaswap worker
    pid N on HOST") still runs; None when that cannot be seen from here (another machine, no name)."""
    match = re.fullmatch(r"llamaswap \S+ pid (\d+) on (.+)", holder or "")
    if match is None or int(match[1]) == os.getpid():
        return None
    host = socket.gethostname()
    if not (host == match[2] or len(holder) == APPLICATION_NAME_MAX and host.startswith(match[2])):
        return None
    return proctable.running(int(match[1]))  # a zombie (killed, not yet reaped) is gone


def _advisory_holder(connection, key: tuple[int, int]) -> str | None:
    """The application name of the session holding our advisory lock, e.g. "llamaswap serve pid 12 on host"."""
    row = connection.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::int8::oid AND l.objid = %s::int8::oid"
        " AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        tuple(part & 0xFFFFFFFF for part in key),  # pg_locks shows the two int4 keys as oids
    ).fetchone()
    return row[0] if row and row[0] else None
