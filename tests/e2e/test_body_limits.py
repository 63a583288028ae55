"""Request bodies over their limit are refused as they arrive, not after Twisted has written them whole to a
temporary file: whatever the route, the spelling of its path, or whether the body is chunked, one request cannot
fill the service's disk."""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest

from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
REQUEST_LIMIT = MIB
FILE_LIMIT = 1_000_000
# More than the loopback socket buffers hold: once it is all sent, the service has read most of it.
SENT = 32 * MIB


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    text = f"""
        maxRequestBodyBytes: {REQUEST_LIMIT}
        maxBatchFileBytes: {FILE_LIMIT}
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0")}
    """
    with Served(tmp_path_factory.mktemp("body-limits"), text) as s:
        yield s


def spooled_bytes(pid: int) -> int:
    """What the process holds in deleted files (Twisted's temporary request bodies)."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("(deleted)"):
                held += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:  # closed meanwhile
            continue
    return held


def chunked(data: bytes, piece: int = 256 * 1024) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[at:at + piece]), data[at:at + piece])
                    for at in range(0, len(data), piece))


def refused_while_sent(served: Served, head: bytes, body: bytes, end: bytes = b"") -> tuple[int, dict, int]:
    """Send `head` and `body`, note what the service has spooled, send `end`; (status, error, spooled bytes)."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(head + body)
        spooled = spooled_bytes(served.proc.pid)
        sock.sendall(end)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, json.loads(answer.read())["error"], spooled


def upload_head(path: str, length: int | None) -> bytes:
    framing = b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % length
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=x\r\n%s\r\n\r\n"
            % (path.encode(), framing))


def test_a_chunked_upload_is_asked_for_a_length_from_its_head_and_none_of_it_kept(served):
    status, error, spooled = refused_while_sent(served, upload_head("/v1/files", None), chunked(b"x" * SENT), b"0\r\n\r\n")
    assert (status, error["code"]) == (411, "length_required")
    assert spooled < MIB, f"{spooled} bytes of a refused upload were written to disk"


@pytest.mark.parametrize("path", ["/v1/file%73", "/v1/%66iles/", "/v1/files?purpose=batch"])
def test_an_upload_over_its_limit_is_refused_from_its_length_however_its_path_is_spelled(served, path):
    status, error, spooled = refused_while_sent(served, upload_head(path, SENT), b"x" * (SENT - 1), b"x")
    assert (status, error["code"]) == (413, "file_too_large") and "maxBatchFileBytes" in error["message"]
    assert spooled < MIB


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_model_request_over_max_request_body_bytes_is_cut_off_at_the_limit(served, framing):
    body = b'{"model": "m", "pad": "' + b"x" * SENT + b'"}'
    if framing == "length":
        head, sent, end = b"Content-Length: %d" % len(body), body[:-1], body[-1:]
    else:
        head, sent, end = b"Transfer-Encoding: chunked", chunked(body), b"0\r\n\r\n"
    status, error, spooled = refused_while_sent(
        served, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s\r\n\r\n"
        % head, sent, end)
    assert (status, error["code"]) == (413, "request_too_large") and "maxRequestBodyBytes" in error["message"]
    assert spooled <= REQUEST_LIMIT + MIB, f"{spooled} bytes spooled past a {REQUEST_LIMIT}-byte limit"


def told_before_the_body(served: Served, head: bytes) -> tuple[int, dict]:
    """Send a head that asks for 100 Continue, and nothing more: (status, error) of the answer, after which the
    connection closes."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n", 1))
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        error = json.loads(answer.read())["error"]
        assert sock.recv(1) == b"", "the connection closes: the body is not read"
        return answer.status, error


def test_a_client_that_waits_for_100_continue_is_told_the_refusal_instead_and_sends_nothing(served):
    status, error = told_before_the_body(served, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                 b"Content-Type: application/json\r\nContent-Length: 5000000000\r\n\r\n")
    assert (status, error["code"]) == (413, "request_too_large")


def test_a_lowercase_method_is_held_to_the_uploads_limit_as_the_router_reads_it(served):
    status, error = told_before_the_body(served, upload_head("/v1/files", SENT).replace(b"POST", b"post", 1))
    assert (status, error["code"]) == (413, "file_too_large")
