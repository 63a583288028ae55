"""Hostile input against the real service over HTTP, and what it keeps (logs, database) afterwards."""

from __future__ import annotations

import base64
import json
import socket
import sqlite3
import time
from contextlib import closing

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e

KEY = "sk-hardening-7d1f0c"
OTHER_KEY = "sk-hardening-second-93ab"
WRONG_KEY = "sk-hardening-wrong-5e2a"
# Text that would show up in the database if a request body were stored.
BODY_MARKER = "body-marker-4c7e19"
LIMIT = 4096


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hardening")
    text = f"""
        apiKeys: ["{KEY}", "{OTHER_KEY}"]
        logLevel: debug
        maxRequestBodyBytes: {LIMIT}
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "4")}
            proxy: http://127.0.0.1:${{PORT}}
    """
    with Served(tmp, text) as s:
        s.http = httpx.Client(base_url=s.base, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
        yield s
        s.http.close()


def chat(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def raw_exchange(served: Served, request: bytes, *, half_close: bool = False, timeout: float = 10.0) -> bytes:
    """Send bytes as they are (no client library tidies them up) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=timeout) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def raw_request(method: bytes, target: bytes, headers: list[bytes], body: bytes = b"",
                content_length: bytes | None = None) -> bytes:
    """One HTTP/1.1 request with the key; Content-Length is the body's unless `content_length` says otherwise."""
    if content_length is None and (body or method == b"POST"):
        content_length = b"%d" % len(body)
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close",
             b"Authorization: Bearer " + KEY.encode(), *headers]
    if content_length is not None:
        lines.append(b"Content-Length: " + content_length)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        chunks, rest = [], body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            if int(size, 16) == 0:
                break
            chunks.append(rest[: int(size, 16)])
            rest = rest[int(size, 16) + 2:]
        body = b"".join(chunks)
    return int(status_line.split()[1]), headers, body


def error_of(status: int, headers: dict[str, str], body: bytes) -> dict:
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body[:200])
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.mark.parametrize("content_type,body,status,code", [
    ("application/json", b'{"model": "m", "messages": [', 400, "invalid_json"),
    ("application/json", b'{"model": "m\xff"}', 400, "invalid_encoding"),
    ("application/json", b"[" * 2000 + b"]" * 2000, 400, "invalid_json"),
    ("application/json", b'{"messages": []}', 400, "model_missing"),
    ("application/json", b'{"model": 12}', 400, "invalid_model"),
    ("application/json", b'{"model": "../../etc/passwd"}', 404, "model_not_found"),
    ("text/plain", b'{"model": "m"}', 415, "unsupported_media_type"),
    ("multipart/form-data; boundary=x", b"--x\r\n\r\nm\r\n--x--\r\n", 400, "model_missing"),
    ("application/json", b'{"model": "m", "pad": "' + b"x" * LIMIT + b'"}', 413, "request_too_large"),
])
def test_bad_bodies_over_http_get_openai_shaped_errors(served, content_type, body, status, code):
    r = served.http.post("/v1/chat/completions", content=body, headers={"content-type": content_type})
    assert r.status_code == status
    assert r.json()["error"]["code"] == code and r.json()["error"]["message"]


def test_multipart_without_a_boundary_gets_a_json_400(served):
    r = served.http.post("/v1/audio/transcriptions", content=b"--x\r\n\r\nm\r\n--x--\r\n",
                         headers={"content-type": "multipart/form-data"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_multipart" and "boundary" in r.json()["error"]["message"]
    assert served.http.post("/v1/chat/completions", json=chat()).status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(
    st.binary(max_size=128),
    st.dictionaries(st.sampled_from(["model", "messages", "x"]), st.sampled_from(["m", "nope", "", 0, None, [], {}]),
                    max_size=3).map(lambda d: json.dumps(d).encode()),
    st.integers(0, 30).map(lambda n: b'{"model": "m", "messages": [' + b"{" * n),
))
def test_generated_bodies_over_http_never_get_a_500(served, case_counts, body):
    case_counts["bodies over HTTP"] = case_counts.get("bodies over HTTP", 0) + 1
    r = served.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code in {200, 400, 404}, r.text[:300]
    if r.status_code != 200:
        assert r.json()["error"]["message"]


@pytest.mark.parametrize("values,priority", [
    ([b"9" * 10240], 0),
    ([b"\xe9t\xe9"], 0),
    (["\u0661\u0660\u0660".encode()], 0),
    ([b"1.5"], 0),
    ([b"-99999999999999999999"], 0),
    ([b"batch", b"interactive"], -100),
    ([b"  Interactive "], 100),
])
def test_hostile_priority_headers_over_http_are_served(served, values, priority):
    before = last_id(served)
    headers = [b"Content-Type: application/json"] + [b"X-LlamaSwap-Priority: " + v for v in values]
    body = json.dumps(chat()).encode()
    status, _, answer = parse_answer(raw_exchange(served, raw_request(b"POST", b"/v1/chat/completions", headers, body)))
    assert status == 200, answer[:300]
    assert json.loads(answer)["choices"]
    assert finished_row_after(served, before)["priority"] == priority


@pytest.mark.parametrize("target,status,code", [
    (b"/upstream/m/../../x", 400, "invalid_path"),
    (b"/upstream/m/..%2f..%2fx", 400, "invalid_path"),
    (b"/upstream/m/%2e%2e/%2e%2e/x", 400, "invalid_path"),
    (b"/upstream/../../etc/passwd", 404, "model_not_found"),
    (b"/upstream/%24(touch%20x)/y", 404, "model_not_found"),
    (b"/v1/chat/completions/../../admin/", 404, "route_not_found"),
])
def test_path_tricks_over_http(served, target, status, code):
    got, headers, body = parse_answer(raw_exchange(served, raw_request(b"GET", target, [])))
    assert got == status and error_of(got, headers, body)["code"] == code


def test_upstream_requests_stay_on_the_model_server(served):
    status, headers, body = parse_answer(raw_exchange(served, raw_request(b"GET", b"/upstream/m//evil.example/x", [])))
    assert status == 200 and json.loads(body)["served_by"] == "m"
    assert json.loads(body)["path"].endswith("/evil.example/x")


@pytest.mark.parametrize("method,target", [
    (b"TRACE", b"/v1/models"), (b"DELETE", b"/health"), (b"PUT", b"/v1/chat/completions"), (b"FOO", b"/running"),
])
def test_unsupported_methods_over_http_are_json_405(served, method, target):
    status, headers, body = parse_answer(raw_exchange(served, raw_request(method, target, [], b"{}")))
    assert status == 405 and headers["allow"]
    assert error_of(status, headers, body)["code"] == "method_not_allowed"


def test_a_foreign_host_name_gets_no_model(served):
    request = raw_request(b"POST", b"/v1/chat/completions", [b"Content-Type: application/json"],
                          json.dumps(chat()).encode()).replace(b"Host: 127.0.0.1", b"Host: rebound.evil.example")
    status, headers, body = parse_answer(raw_exchange(served, request))
    assert status == 400 and error_of(status, headers, body)["code"] == "host_not_allowed"


@pytest.mark.parametrize("length", [b"99999999999999999999", b"1000000"])
def test_a_client_that_declares_more_body_than_it_sends_and_hangs_up_harms_nothing(served, length):
    request = raw_request(b"POST", b"/v1/chat/completions", [b"Content-Type: application/json"], b'{"model": "m"',
                          content_length=length)
    raw_exchange(served, request, half_close=True)
    assert served.http.post("/v1/chat/completions", json=chat()).status_code == 200


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3", b"13, 14"])
def test_an_unreadable_content_length_is_refused_before_the_application(served, length):
    """daphne answers these itself with a bare 400; the point is that nothing breaks."""
    request = raw_request(b"POST", b"/v1/chat/completions", [b"Content-Type: application/json"], b'{"model": "m"}',
                          content_length=length)
    status, _, _ = parse_answer(raw_exchange(served, request))
    assert status == 400


def test_api_keys_never_reach_the_logs(served):
    forms = [
        {"Authorization": f"Bearer {KEY}"},
        {"x-api-key": OTHER_KEY},
        {"Authorization": "Basic " + base64.b64encode(f"user:{KEY}".encode()).decode()},
        {"Authorization": f"Bearer {WRONG_KEY}"},
        {"x-api-key": WRONG_KEY},
    ]
    for headers in forms:
        with httpx.Client(base_url=served.base, timeout=30) as client:
            client.post("/v1/chat/completions", json=chat(), headers=headers)
            client.get("/upstream/m/v1/models", headers=headers)
            client.get("/v1/models", headers=headers)
            client.post("/v1/chat/completions", content=b"{", headers={**headers, "content-type": "application/json"})
    model_logs = served.http.get("/logs").text
    served_log = served.log()
    assert "POST /v1/chat/completions" in model_logs  # the model's own log is there to be searched
    for secret in (KEY, OTHER_KEY, WRONG_KEY, base64.b64encode(f"user:{KEY}".encode()).decode()):
        assert secret not in served_log and secret not in model_logs


def test_no_key_header_or_body_is_stored(served):
    before = last_id(served)
    r = served.http.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": BODY_MARKER}]),
                         headers={"x-api-key": OTHER_KEY, "X-LlamaSwap-Priority": "batch"})
    assert r.status_code == 200
    answer_text = r.json()["choices"][0]["message"]["content"]
    response_id = r.json()["id"]
    assert finished_row_after(served, before)["band"] == "batch"
    dump = database_dump(served)
    for stored in (KEY, OTHER_KEY, BODY_MARKER, response_id, answer_text):
        assert stored not in dump


def test_the_request_table_has_no_column_for_headers_or_bodies(served):
    with closing(open_database(served)) as con:
        columns = [row[1] for row in con.execute("PRAGMA table_info(scheduling_queuedrequest)")]
    assert "priority" in columns and "path" in columns
    # `api_key` holds the name of the key row that sent the request, never a secret (tests/e2e/test_api_keys.py
    # looks for every secret in every row).
    named = [c for c in columns if c != "api_key"]
    for forbidden in ("header", "body", "auth", "key", "cookie", "content", "message"):
        assert not [c for c in named if forbidden in c], columns


def test_the_service_still_serves_normally_afterwards(served):
    r = served.http.post("/v1/chat/completions", json=chat(), headers={"X-LlamaSwap-Priority": "interactive"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert served.proc.poll() is None
    assert "Traceback" not in served.log()


def open_database(served: Served) -> sqlite3.Connection:
    """The served instance's SQLite database, read-only."""
    con = sqlite3.connect(f"file:{served.data_dir / 'llamaswap.sqlite3'}?mode=ro", uri=True, timeout=5)
    con.row_factory = sqlite3.Row
    return con


def stored_rows(served: Served) -> list[dict]:
    with closing(open_database(served)) as con:
        return [dict(r) for r in con.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id")]


def finished_row_after(served: Served, after_id: int, timeout: float = 10.0) -> dict:
    """The first request row newer than `after_id`, once the recorder (which writes behind) has finished it."""
    deadline = time.monotonic() + timeout
    while True:
        newer = [row for row in stored_rows(served) if row["id"] > after_id]
        if newer and newer[0]["finished_at"] is not None:
            return newer[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no finished request row after #{after_id} within {timeout}s: {newer}")
        time.sleep(0.05)


def last_id(served: Served) -> int:
    rows = stored_rows(served)
    return rows[-1]["id"] if rows else 0


def database_dump(served: Served) -> str:
    """Every row of every table, as SQL text."""
    with closing(open_database(served)) as con:
        return "\n".join(con.iterdump())
