"""What the fault and load tests share: configs, the request table, the process table.

Every fault test ends the same way — the service still answers, and no request row is left
queued or dispatched — so the checks for that live here.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import httpx
import yaml

from tests.e2e.conftest import db_rows
from tests.served import model_ports, wait_until

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "rejected", "interrupted"})


def serial_config(models: dict[str, dict]) -> str:
    """A llama-swap config.yaml with the serial scheduler; each model gets `proxy` on its ${PORT}."""
    return yaml.safe_dump({
        "healthCheckTimeout": 20,
        "startPort": model_ports(len(models)),
        "models": {name: {"proxy": "http://127.0.0.1:${PORT}", **keys} for name, keys in models.items()},
        "routing": {"scheduler": {"use": "serial"}},
    }, sort_keys=False)


def chat(base: str, model: str, *, timeout: float = 60, **fake) -> httpx.Response:
    """A chat completion; `fake` holds the fake model's per-request overrides (id, delay, tokens…)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "fake": fake}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=timeout)


def all_rows_terminal(data_dir: Path, expected: int | None, timeout: float = 15.0) -> list[dict]:
    """Wait until `expected` rows (None: any number) exist and none is queued or dispatched; return them.

    Rows are written behind the data path, so the last changes may land a moment after the
    responses; a row that stays unfinished past `timeout` fails with the rows that are stuck.
    """
    def settled():
        rows = db_rows(data_dir)
        counted = expected is None or len(rows) == expected
        return rows if counted and all(r["state"] in TERMINAL_STATES for r in rows) else None

    try:
        return wait_until(settled, timeout, 0.05, f"{expected} rows in terminal states")
    except AssertionError:
        rows = db_rows(data_dir)
        stuck = [(r["id"], r["model"], r["state"]) for r in rows if r["state"] not in TERMINAL_STATES]
        raise AssertionError(f"{len(rows)} rows (expected {expected}); not terminal: {stuck}") from None


def model_pgid(data_dir: Path, model: str, *, previous: int | None = None) -> int:
    """The process group the service recorded for `model` (written behind, so polled).

    `previous`: a group recorded for an earlier process of the model, to wait past.
    """
    path = data_dir / "llamaswap.sqlite3"

    def recorded():
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            row = con.execute("SELECT pgid FROM scheduling_modelprocessrecord WHERE model = ?", (model,)).fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            con.close()
        return row and row[0] != previous and row[0]

    return wait_until(recorded, what=f"a new process record of model {model!r}")


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in a process group, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return sorted(members)


def integrity_check(database: Path) -> str:
    """SQLite's own verdict on the file ("ok" when intact), read with the WAL as a restart would."""
    con = sqlite3.connect(database, timeout=5)
    try:
        return "\n".join(row[0] for row in con.execute("PRAGMA integrity_check"))
    finally:
        con.close()
