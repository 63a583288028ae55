"""Scheduler settings past their bounds, typed in the admin or written straight into the table with SQL,
in distributed mode (a real worker and front end over PostgreSQL and Redis): a Save is refused with a
message naming the setting and its range, and a stored value out of range is logged once and replaced
by the config's value, so the settings page and /api/queue keep answering."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from tests.admin.session import AdminSession, create_superuser
from tests.e2e.test_distributed import config_text, distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker

pytestmark = pytest.mark.e2e

SETTINGS = "/admin/scheduling/schedulersettings/1/change/"
BEYOND_64_BITS = 2**70
INT4_MAX = 2**31 - 1  # swapAffinityBonus's column is a PostgreSQL integer


def store(psycopg, url: str, sql: str, *params) -> None:
    with psycopg.connect(url) as connection:
        connection.execute(sql, params)


def stored_slots(psycopg, url: str):
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT slots::text FROM scheduling_schedulersettings WHERE id = 1").fetchone()
    return None if row is None or row[0] is None else json.loads(row[0])


@pytest.fixture
def deployment(tmp_path, distributed):
    """(worker, front end) factories over one database and Redis, and (psycopg, the database URL)."""
    env, psycopg = distributed
    text = config_text(tmp_path / "events.jsonl")

    def worker(name: str = "worker") -> Worker:
        return Worker(tmp_path / name, text, env)

    def front_end() -> Served:
        (tmp_path / "fe").mkdir()
        return Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")})

    return worker, front_end, psycopg, env["DATABASE_URL"]


def save(admin: AdminSession, slots: str = "", bonus: str = "", aging: str = "") -> httpx.Response:
    return admin.post(SETTINGS, {"aging_divisor": aging, "swap_affinity_bonus": bonus, "slots": slots, "_save": "Save"})


def test_a_slot_count_past_the_bound_is_refused_by_a_real_save(deployment):
    worker, front_end, psycopg, url = deployment
    with worker(), front_end() as front:
        create_superuser(front, "alice", "correct-horse-battery")
        admin = AdminSession(front, "alice", "correct-horse-battery")
        for typed in (BEYOND_64_BITS, 1025):
            response = save(admin, slots=f"chat: {typed}")
            assert response.status_code == 200, response.text[-2000:]
            assert f"chat: {typed} is above the maximum of 1024" in response.text
        assert stored_slots(psycopg, url) is None
        assert save(admin, slots="chat: 1024").status_code == 302
        assert stored_slots(psycopg, url) == {"chat": 1024}
        assert "chat: 1024" in admin.get(SETTINGS)
        assert httpx.get(front.base + "/api/queue", timeout=10).status_code == 200
        admin.close()


# (slots, swapAffinityBonus, agingDivisor) as stored, and what the log and the page then name.
STORED = [
    ({"chat": BEYOND_64_BITS, "coder": 2}, None, None, [f"slots override chat: {BEYOND_64_BITS}"]),
    ({"chat": 1025}, INT4_MAX, None, ["slots override chat: 1025", f"swapAffinityBonus override {INT4_MAX}"]),
    (None, -1, float("nan"), ["agingDivisor override nan", "swapAffinityBonus override -1"]),
    (None, None, 1e300, ["agingDivisor override 1e+300"]),
    (None, None, 1e-320, ["agingDivisor override 1e-320"]),
    ([1, 2], None, None, ["slots override [1, 2]"]),
]


def check_served_with_stored_values(front: Served, logs, ignored: list[str]) -> None:
    """The service answers, the settings page says what it ignores, and each ignored value is logged once."""
    create_superuser(front, "alice", "correct-horse-battery")
    admin = AdminSession(front, "alice", "correct-horse-battery")
    answer = httpx.post(front.base + "/v1/chat/completions", timeout=60,
                        json={"model": "chat", "messages": [], "fake": {"tokens": 2}})
    assert answer.status_code == 200, answer.text
    queue = httpx.get(front.base + "/api/queue", timeout=10)
    assert queue.status_code == 200, queue.text
    page = admin.get(SETTINGS)
    admin.close()
    assert "Not applied" in page
    for what in ignored:
        assert logs().count(f"ignoring the admin's {what}") == 1, (what, logs()[-3000:])


@pytest.mark.parametrize("slots, bonus, aging, ignored", STORED)
def test_a_value_written_with_sql_is_logged_once_and_the_config_value_used(deployment, slots, bonus, aging, ignored):
    worker, front_end, psycopg, url = deployment
    with worker("first"):  # creates the tables; the one started next is the worker after a restart
        pass
    store(psycopg, url, "INSERT INTO scheduling_schedulersettings (id, aging_divisor, swap_affinity_bonus, slots) "
                        "VALUES (1, %s, %s, %s)", aging, bonus, None if slots is None else json.dumps(slots))
    with worker("restarted") as restarted, front_end() as front:
        check_served_with_stored_values(front, restarted.log, ignored)


@pytest.mark.parametrize("bonus", [2**63 - 1, BEYOND_64_BITS])  # SQLite's integer limit, and past it (a REAL)
def test_a_value_written_with_sql_is_ignored_by_a_single_process_on_sqlite(tmp_path, bonus):
    text = config_text(tmp_path / "events.jsonl")
    with Served(tmp_path, text):  # creates the tables
        pass
    with sqlite3.connect(tmp_path / "data" / "llamaswap.sqlite3") as connection:
        connection.execute("INSERT INTO scheduling_schedulersettings (id, aging_divisor, swap_affinity_bonus, slots) "
                           "VALUES (1, NULL, ?, ?)", (bonus if bonus < 2**63 else float(bonus),
                                                      json.dumps({"chat": BEYOND_64_BITS})))
    with Served(tmp_path, text) as served:
        check_served_with_stored_values(served, served.log, [f"slots override chat: {BEYOND_64_BITS}",
                                                             "swapAffinityBonus override"])
