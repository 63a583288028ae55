"""Small helpers that turn environment variables into Django settings."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit


class EnvironmentProblem(ValueError):
    """An environment variable the settings cannot use: `llamaswap` says it in one line and exits."""


def load_or_create_secret_key(path: Path, given: str = "") -> str:
    """The SECRET_KEY: `given` (LLAMASWAP_SECRET_KEY, the same for every front end behind one load balancer,
    so an admin's session is valid on each), else the install's own, generated (mode 0600) on first start."""
    if given.strip():
        return given.strip()
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(50)
    # Written to a private temp file and linked into place: two processes starting at once
    # agree on one key, and nobody ever reads a half-written one.
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    temp = Path(temp_name)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    try:
        os.link(temp, path)
    except FileExistsError:
        key = path.read_text().strip()
    finally:
        temp.unlink()
    return key


def database_from_url(url: str, sqlite_path: Path) -> dict:
    """SQLite in WAL mode with IMMEDIATE transactions by default; PostgreSQL when DATABASE_URL says so.

    IMMEDIATE + a busy timeout is what keeps concurrent writers from failing with
    "database is locked"; WAL lets the admin read while the recorder writes.
    """
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_path),
            "CONN_MAX_AGE": 0,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": str(sqlite_path.with_name("test-llamaswap.sqlite3"))},
        }
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise EnvironmentProblem(f"DATABASE_URL: unsupported scheme {parts.scheme!r}; use postgres://user@host:port/name")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "llamaswap",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
    }


# LLAMASWAP_CHANNEL_LAYER: how messages cross Redis. "lists" (channels_redis's core layer) keeps what is
# sent to a channel until it is read, through a Redis blip or a worker's restart; "pubsub" (its pub/sub
# layer) delivers only to a listener there at that moment, in fewer round trips.
CHANNEL_LAYER_BACKENDS = {
    "lists": "channels_redis.core.RedisChannelLayer",
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
}


def channel_layers_from_url(redis_url: str, database: dict, backend: str = "lists") -> dict:
    """The channel layer between front ends and scheduler workers: Redis when REDIS_URL is set.

    Distributed mode keeps every request row in one database that every front end and worker
    reaches, so it needs PostgreSQL; without REDIS_URL there is no layer at all (one process).
    """
    if not redis_url:
        return {}
    if urlsplit(redis_url).scheme not in ("redis", "rediss", "unix"):
        raise EnvironmentProblem(f"REDIS_URL: unsupported scheme in {redis_url!r}; use redis://host:port/db")
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise EnvironmentProblem(
            "REDIS_URL is set but DATABASE_URL is not a PostgreSQL database: front ends and workers on "
            "several machines must share one database — set DATABASE_URL=postgres://user@host:port/name"
        )
    if backend not in CHANNEL_LAYER_BACKENDS:
        raise EnvironmentProblem(f"LLAMASWAP_CHANNEL_LAYER={backend!r}: use {' or '.join(map(repr, CHANNEL_LAYER_BACKENDS))}")
    config: dict = {"hosts": [redis_host(redis_url)]}
    if backend == "pubsub":
        # Redis's pub/sub ignores the database index: deployments told apart by REDIS_URL's /db are told
        # apart by the layer's prefix instead (the lists layer keeps its keys in that database).
        config["prefix"] = f"llamaswap.db{redis_database(redis_url)}."
    if backend == "lists":
        # What front ends send a worker waits in its channel while none runs (a restart, a failover): room for
        # every request and heartbeat of that while, where other channels keep channels_redis's default of 100.
        config["channel_capacity"] = {"llamaswap.worker.*": WORKER_CHANNEL_CAPACITY}
    return {"default": {"BACKEND": CHANNEL_LAYER_BACKENDS[backend], "CONFIG": config}}


def redis_database(redis_url: str) -> int:
    """The database index REDIS_URL names: its path (redis://host/2) or its ?db= (unix sockets); else 0."""
    parts = urlsplit(redis_url)
    path = "" if parts.scheme == "unix" else parts.path.strip("/")
    index = path or dict(parse_qsl(parts.query)).get("db", "0")
    try:
        return int(index)
    except ValueError:
        raise EnvironmentProblem(f"REDIS_URL: the database index {index!r} in {redis_url!r} is not a number") from None


WORKER_CHANNEL_CAPACITY = 100_000
# Each send holds a pooled connection: a burst of requests on one front end needs as many at once
# (redis-py's default of 100 refused the rest with "Too many connections").
REDIS_MAX_CONNECTIONS = 2_000


# channels_redis waits for messages with a 5 s BZPOPMIN; redis-py's default read timeout is 5 s too, so a
# quiet channel would end in "Timeout reading" (and a connection left mid-command) about every 5 s.
REDIS_READ_TIMEOUT_S = 30


def redis_host(redis_url: str) -> dict:
    """channels_redis's host entry for `redis_url`, with a read timeout longer than its blocking waits."""
    return {"address": redis_url, "socket_timeout": REDIS_READ_TIMEOUT_S, "max_connections": REDIS_MAX_CONNECTIONS}

