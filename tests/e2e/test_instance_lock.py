"""One serving llamaswap per data dir and per database: a second one refuses to start and touches nothing.

Start-up recovery would otherwise stop the first service's models, mark its rows interrupted and
reuse its ticket ids.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from proxy.model_processes.instance_lock import ADVISORY_KEY
from tests.e2e.conftest import db_rows
from tests.served import REPO, Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e


def config() -> str:
    return f"""
        models:
          m:
            cmd: {fake_cmd("m")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """


def second_serve(first: Served, env: dict) -> tuple[int, str]:
    """`llamaswap serve` of the same config on another port, expected to refuse: (exit status, stderr)."""
    second = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "serve", "--config", str(first.config_path),
         "--listen", f"127.0.0.1:{model_ports(1)}"],
        cwd=REPO, env={**first.env, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        _, stderr = second.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        second.terminate()
        second.communicate(timeout=30)
        raise AssertionError("a second service started on data another one is serving") from None
    return second.returncode, stderr


class Stream:
    """A streaming chat request that has received its first event and is still going."""

    def __init__(self, served: Served):
        self._context = httpx.stream(
            "POST", served.base + "/v1/chat/completions", timeout=60,
            json={"model": "m", "stream": True, "messages": [], "fake": {"tokens": 60, "tps": 20}},
        )
        response = self._context.__enter__()
        assert response.status_code == 200
        self._lines = response.iter_lines()
        self.events = [self._next_event()]

    def _next_event(self) -> str:
        for line in self._lines:
            if line.startswith("data:"):
                return line[5:].strip()
        raise AssertionError("the stream ended without [DONE]")

    def finish(self) -> list[str]:
        """Read to the end; every event the stream carried."""
        try:
            while self.events[-1] != "[DONE]":
                self.events.append(self._next_event())
        finally:
            self._context.__exit__(None, None, None)
        return self.events


def assert_uninterrupted(stream: Stream) -> None:
    chunks = [json.loads(e) for e in stream.finish()[:-1]]
    assert not [c for c in chunks if "error" in c], "the running stream was cut"
    words = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([w for w in words if w]) == 60 and chunks[-1]["usage"]["completion_tokens"] == 60


def test_a_second_service_on_the_same_data_dir_refuses_to_start_and_leaves_the_first_alone(tmp_path):
    (tmp_path / "first").mkdir()
    first = Served(tmp_path / "first", config()).start()
    try:
        stream = Stream(first)
        status, stderr = second_serve(first, {})
        assert status != 0
        assert stderr.strip().splitlines()[-1] == (
            f"CommandError: another llamaswap (pid {first.proc.pid}) is already serving the data dir "
            f"{first.data_dir}: stop it first, or give this one its own LLAMASWAP_DATA_DIR"
        ), stderr
        assert_uninterrupted(stream)
        # Only serving takes the lock: checking the config and the management commands work meanwhile.
        for command in (("serve", "--config", str(first.config_path), "--check"), ("migrate",),
                        ("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com")):
            done = subprocess.run([sys.executable, str(REPO / "manage.py"), *command], cwd=REPO, timeout=60,
                                  env={**first.env, "DJANGO_SUPERUSER_PASSWORD": "correct-horse-battery"},
                                  capture_output=True, text=True)
            assert done.returncode == 0, (command, done.stderr)
        answer = httpx.post(first.base + "/v1/chat/completions", timeout=30,
                            json={"model": "m", "messages": [{"role": "user", "content": "still there?"}]})
        assert answer.status_code == 200
        rows = first.check_settled("m")
        assert [(r["id"], r["state"]) for r in rows] == [(1, "completed"), (2, "completed"), (3, "completed")]
    finally:
        first.kill()

    # The lock dies with its holder: after SIGKILL a new service starts on the data dir at once.
    (tmp_path / "next").mkdir()
    following = Served(tmp_path / "next", config(), env={"LLAMASWAP_DATA_DIR": str(first.data_dir)}).start()
    try:
        answer = httpx.post(following.base + "/v1/chat/completions", timeout=30,
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
        wait_until(lambda: [r["state"] for r in db_rows(first.data_dir)] == ["completed"] * 4,
                   what="the new service's row after the three of the first")
    finally:
        following.stop()


def test_two_data_dirs_on_one_postgresql_database_get_one_service(tmp_path, postgres):
    url, psycopg = postgres
    name = url.rsplit("/", 1)[1]
    (tmp_path / "first").mkdir()
    first = Served(tmp_path / "first", config(), env={"DATABASE_URL": url}).start()
    try:
        stream = Stream(first)
        status, stderr = second_serve(first, {"LLAMASWAP_DATA_DIR": str(tmp_path / "other-data")})
        assert status != 0
        assert (f"another llamaswap (llamaswap serve pid {first.proc.pid} on " in stderr
                and f"is already serving the PostgreSQL database '{name}' at 127.0.0.1:5432" in stderr), stderr
        assert_uninterrupted(stream)

        def rows():
            with psycopg.connect(url) as con:
                return con.execute("SELECT id, state FROM scheduling_queuedrequest ORDER BY id").fetchall()

        wait_until(lambda: rows() == [(1, "completed")], what="the stream's row, completed")
    finally:
        first.kill()

    def advisory_locks() -> int:
        with psycopg.connect(url) as con:
            return con.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]

    # The server drops the lock with the killed service's connection; then a service of another data dir starts.
    wait_until(lambda: advisory_locks() == 0, what="PostgreSQL to drop the killed service's lock")
    (tmp_path / "next").mkdir()
    following = Served(tmp_path / "next", config(), env={"DATABASE_URL": url}).start()
    try:
        answer = httpx.post(following.base + "/v1/chat/completions", timeout=30,
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
        wait_until(lambda: rows() == [(1, "completed"), (2, "completed")], what="the new service's row")
    finally:
        following.stop()


def terminate_lock_session(url: str, psycopg, pid: int) -> None:
    """Drop the service's lock connection at the server, as a PostgreSQL restart or failover would."""
    with psycopg.connect(url, autocommit=True) as con:
        ended = con.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name LIKE %s) AS ended", (f"llamaswap serve pid {pid} on %",),
        ).fetchone()[0]
    assert ended == 1


def test_a_dropped_lock_connection_is_taken_again_before_another_service_can_start(tmp_path, postgres):
    url, psycopg = postgres
    lock_check = {"DATABASE_URL": url, "LLAMASWAP_LOCK_CHECK_SECONDS": "0.2"}
    first = Served(tmp_path, config(), env=lock_check).start()
    try:
        terminate_lock_session(url, psycopg, first.proc.pid)
        wait_until(lambda: "took the database lock again" in first.log(), what="the service to take its lock again")
        status, stderr = second_serve(first, {"LLAMASWAP_DATA_DIR": str(tmp_path / "other-data")})
        assert status != 0 and "is already serving the PostgreSQL database" in stderr, stderr
        answer = httpx.post(first.base + "/v1/chat/completions", timeout=30,
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
    finally:
        first.stop()


def test_a_service_whose_lock_another_took_meanwhile_shuts_down(tmp_path, postgres):
    url, psycopg = postgres
    first = Served(tmp_path, config(), env={"DATABASE_URL": url, "LLAMASWAP_LOCK_CHECK_SECONDS": "1"}).start()
    try:
        with psycopg.connect(url, autocommit=True) as thief:
            terminate_lock_session(url, psycopg, first.proc.pid)
            # pg_terminate_backend only signals: the lock is free once that backend has exited, a moment
            # later, and well before the service's next check (1 s) would take it again.
            take = "SELECT pg_try_advisory_lock(%s::int4, %s::int4)"
            wait_until(lambda: thief.execute(take, ADVISORY_KEY).fetchone()[0], timeout=0.8, interval=0.01,
                       what="the terminated session to let go of the lock")
            assert first.proc.wait(30) is not None
        assert "lost the database lock" in first.log()
    finally:
        first.kill()


def test_a_model_id_beyond_its_column_still_gets_its_process_recorded(tmp_path, postgres):
    """Without its record, a restart after SIGKILL could not find and stop the model's process."""
    url, psycopg = postgres
    long_id = "L" * 300
    text = f"""
        models:
          {long_id}:
            cmd: {fake_cmd("m")}
            proxy: http://127.0.0.1:${{PORT}}
    """
    with Served(tmp_path, text, env={"DATABASE_URL": url}) as served:
        answer = httpx.post(served.base + "/v1/chat/completions", timeout=30,
                            json={"model": long_id, "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200

        def records():
            with psycopg.connect(url) as con:
                return con.execute("SELECT model, pgid FROM scheduling_modelprocessrecord").fetchall()

        recorded = wait_until(records, what="the model's process record")
        assert recorded[0][0] == long_id[:255]
        assert "could not record" not in served.log()


def test_the_lock_session_is_probed_so_a_powered_off_holder_frees_it_in_seconds_not_hours(postgres):
    """The server itself probes the lock's connection (its kernel default would wait two hours), so a standby
    takes over from a worker whose box lost power about 11 s after it went silent."""
    from urllib.parse import urlsplit

    from proxy.model_processes.instance_lock import _lock_database, _scope

    url, _ = postgres
    parts = urlsplit(url)
    database = {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"), "HOST": parts.hostname,
                "PORT": parts.port or 5432, "USER": parts.username or "postgres"}
    connection = _lock_database(database, _scope("worker", ["m"]))
    try:
        shown = {name: connection.execute(f"SHOW {name}").fetchone()[0]
                 for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout")}
        assert shown == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                         "tcp_user_timeout": "10000"}, shown
    finally:
        connection.close()
