"""No request row is lost because of another request's values, on SQLite and on PostgreSQL.

Rows are written behind the data path in batches; a value that does not fit its column (a huge
priority, a path or method longer than the column, a token count from a hostile upstream) must
neither fail the batch it travels in nor lose its own row.
"""

from __future__ import annotations

import socket
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.admin.session import AdminSession, create_superuser, queue_rows
from tests.admin.traffic import Caller, GpuHolder, two_model_config
from tests.reliability.support import TERMINAL_STATES, all_rows_terminal, chat, serial_config
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

INT64_MAX = 2**63 - 1
QUEUE = "/admin/scheduling/waitingrequest/"


def postgres_rows(url: str, psycopg) -> list[dict]:
    with psycopg.connect(url) as con:
        cursor = con.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id")
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def postgres_rows_terminal(url: str, psycopg, expected: int) -> list[dict]:
    def settled():
        rows = postgres_rows(url, psycopg)
        return rows if len(rows) == expected and all(r["state"] in TERMINAL_STATES for r in rows) else None

    try:
        return wait_until(settled, 15, 0.05, f"{expected} rows in terminal states")
    except AssertionError:
        rows = postgres_rows(url, psycopg)
        raise AssertionError(f"{len(rows)} rows (expected {expected}): {[(r['id'], r['state']) for r in rows]}") from None


def fifo_config(priority: int = 10) -> str:
    return f"""
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "2")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: fifo
            settings:
              fifo:
                priority: {{m: {priority}}}
    """


def burst(base: str, count: int, headers: dict[str, str]) -> list[int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with ThreadPoolExecutor(count) as pool:
        answers = pool.map(lambda _: httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=60),
                           range(count))
        return [answer.status_code for answer in answers]


def check_burst_rows(rows: list[dict]) -> None:
    assert [r["state"] for r in rows] == ["completed"] * 10
    assert {r["priority"] for r in rows} == {INT64_MAX}
    # The fifo queue priority is the model's 10 plus the header: beyond 64 bits, so stored clamped.
    assert {r["fifo_priority"] for r in rows} == {INT64_MAX}


def test_a_burst_at_a_priority_beyond_64_bits_keeps_every_row_on_sqlite(tmp_path):
    with Served(tmp_path, fifo_config()) as served:
        assert burst(served.base, 10, {"X-LlamaSwap-Priority": str(INT64_MAX)}) == [200] * 10
        check_burst_rows(all_rows_terminal(served.data_dir, 10))
        assert served.stop() == 0
    assert "could not record request" not in served.log()


def test_a_burst_at_a_priority_beyond_64_bits_keeps_every_row_on_postgresql(tmp_path, postgres):
    url, psycopg = postgres
    with Served(tmp_path, fifo_config(), env={"DATABASE_URL": url}) as served:
        assert burst(served.base, 10, {"X-LlamaSwap-Priority": str(INT64_MAX)}) == [200] * 10
        check_burst_rows(postgres_rows_terminal(url, psycopg, 10))
    assert "could not record request" not in served.log()


def raw_request(port: int, method: bytes, target: bytes) -> int:
    """Send a request line no client library would send; return the status the service answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(method + b" " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return int(received.split(b" ", 2)[1])


def test_a_long_path_a_long_method_and_a_nul_on_postgresql_lose_no_row(tmp_path, postgres):
    url, psycopg = postgres
    long_path = "/upstream/m/" + "p" * 600
    long_method = "X" * 40
    config = serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0", "--tokens", "2")}})
    with Served(tmp_path, config, env={"DATABASE_URL": url}) as served:
        with ThreadPoolExecutor(13) as pool:
            normal = [pool.submit(chat, served.base, "m") for _ in range(10)]
            odd = [pool.submit(raw_request, served.port, b"GET", long_path.encode()),
                   pool.submit(raw_request, served.port, long_method.encode(), b"/upstream/m/v1/models"),
                   pool.submit(raw_request, served.port, b"GET", b"/upstream/m/v1/models%00nul")]
            assert [f.result().status_code for f in normal] == [200] * 10
            long_path_status, long_method_status, nul_status = (f.result() for f in odd)
        rows = postgres_rows_terminal(url, psycopg, 13)
    assert "could not record request" not in served.log()
    by_path = {r["path"]: r for r in rows}
    assert by_path[long_path]["method"] == "GET" and by_path[long_path]["status_code"] == long_path_status
    [odd_method] = [r for r in rows if r["method"] not in ("GET", "POST")]
    assert odd_method["method"] == long_method[:32] and odd_method["status_code"] == long_method_status
    assert by_path["/upstream/m/v1/models\ufffdnul"]["status_code"] == nul_status
    assert sum(r["path"] == "/v1/chat/completions" and r["state"] == "completed" for r in rows) == 10


HOSTILE_UPSTREAM = textwrap.dedent('''
    """A model server whose answers report absurd usage: token counts past any column, speeds of inf and NaN."""
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    ANSWER = ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
              '{"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], '
              '"usage": {"prompt_tokens": %d, "completion_tokens": %d}, '
              '"timings": {"prompt_per_second": Infinity, "predicted_per_second": NaN, "cache_n": 1e400}}'
              % (10**30, -10**30)).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
''')


def hostile_config(tmp_path) -> str:
    script = tmp_path / "hostile_upstream.py"
    script.write_text(HOSTILE_UPSTREAM)
    return f"""
        models:
          hostile:
            cmd: {sys.executable} {script} ${{PORT}}
            proxy: http://127.0.0.1:${{PORT}}
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "2")}
            proxy: http://127.0.0.1:${{PORT}}
        groups:
          both:
            swap: false
            members: [hostile, m]
    """


def check_hostile_rows(rows: list[dict]) -> None:
    hostile = [r for r in rows if r["model"] == "hostile"]
    assert len(hostile) == 5 and all(r["state"] == "completed" and r["status_code"] == 200 for r in hostile)
    for row in hostile:
        assert row["input_tokens"] > 2**30 and row["output_tokens"] < -(2**30)
        assert row["prompt_per_second"] is None and row["tokens_per_second"] is None and row["cache_tokens"] is None
    assert sum(r["model"] == "m" and r["state"] == "completed" for r in rows) == 5


def hostile_burst(base: str) -> list[int]:
    with ThreadPoolExecutor(10) as pool:
        answers = [pool.submit(chat, base, model) for model in ("hostile", "m") * 5]
        return [a.result().status_code for a in answers]


def test_usage_beyond_every_column_from_a_hostile_upstream_loses_no_row_on_sqlite(tmp_path):
    with Served(tmp_path, hostile_config(tmp_path)) as served:
        assert hostile_burst(served.base) == [200] * 10
        check_hostile_rows(all_rows_terminal(served.data_dir, 10))
    assert "could not record request" not in served.log()


def test_usage_beyond_every_column_from_a_hostile_upstream_loses_no_row_on_postgresql(tmp_path, postgres):
    url, psycopg = postgres
    with Served(tmp_path, hostile_config(tmp_path), env={"DATABASE_URL": url}) as served:
        assert hostile_burst(served.base) == [200] * 10
        check_hostile_rows(postgres_rows_terminal(url, psycopg, 10))
    assert "could not record request" not in served.log()


def test_status_code_is_what_the_client_was_answered_and_null_when_it_left_first(tmp_path):
    events, text = two_model_config(tmp_path)
    with Served(tmp_path, text) as served:
        create_superuser(served, "alice", "correct-horse-battery")
        admin = AdminSession(served, "alice", "correct-horse-battery")
        holder = GpuHolder(served)  # ticket 1: alpha streams until the holder hangs up
        try:
            cancelled_by_operator = Caller(served, "beta", 0, "beta")  # ticket 2
            wait_until(lambda: len(queue_rows(admin.get(QUEUE))) == 1, what="the request on the queue page")
            with pytest.raises(httpx.ReadTimeout):  # ticket 3: its client gives up while queued
                httpx.post(served.base + "/v1/chat/completions", timeout=0.5,
                           json={"model": "beta", "messages": [], "fake": {"id": "leaver"}})
            assert admin.post(QUEUE, {"action": "cancel", "ticket": [2]}).status_code == 302
            status, body = cancelled_by_operator.wait()
        finally:
            holder.release()
            admin.close()
        rows = all_rows_terminal(served.data_dir, 3)
    assert status == 503 and body["error"]["code"] == "cancelled_by_operator"
    assert [(r["id"], r["state"], r["status_code"]) for r in rows] == [
        (1, "cancelled", None), (2, "cancelled", 503), (3, "cancelled", None)]
