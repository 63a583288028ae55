"""DATABASE_URL: the same service with its rows in PostgreSQL (127.0.0.1:5432) instead of SQLite."""

from __future__ import annotations


import httpx
import pytest

from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def test_requests_are_recorded_in_postgresql(tmp_path, postgres):
    url, psycopg = postgres
    text = f"""
        models:
          m:
            cmd: {fake_cmd("m")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """
    with Served(tmp_path, text, env={"DATABASE_URL": url}) as served:
        for priority in ("batch", "interactive"):
            r = httpx.post(served.base + "/v1/chat/completions", headers={"X-LlamaSwap-Priority": priority},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
            assert r.status_code == 200

        def rows():
            with psycopg.connect(url) as con:
                return con.execute(
                    "SELECT state, serial_band, serial_priority, output_tokens, dispatched_at IS NOT NULL"
                    " FROM scheduling_queuedrequest ORDER BY id"
                ).fetchall()

        done = wait_until(lambda: (r := rows()) and all(row[0] == "completed" for row in r) and len(r) == 2 and r,
                          what="two completed rows in PostgreSQL")
        assert [(band, priority) for _, band, priority, _, _ in done] == [("batch", -100), ("interactive", 100)]
        assert all(tokens > 0 and dispatched for _, _, _, tokens, dispatched in done)
        assert not (served.data_dir / "llamaswap.sqlite3").exists()
