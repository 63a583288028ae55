"""Small helpers that turn environment variables into Django settings."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlsplit


def load_or_create_secret_key(path: Path) -> str:
    """Read the install's SECRET_KEY, generating it (mode 0600) on first start."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key)
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
        raise ValueError(f"DATABASE_URL: unsupported scheme {parts.scheme!r}; use postgres://user@host:port/name")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "llamaswap",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
    }
