"""Multipart uploads and large bodies against the real service: non-ASCII model names, charsets, and
30 MB uploads that must not stall everybody else."""

from __future__ import annotations

import os
import threading
import time
import uuid

import httpx
import pytest

from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e

ACCENTED = "modèle-ü"
JAPANESE = "文字起こしモデル"
RENAMED = "whisper-ü"
UPLOAD_BYTES = 30_000_000
# The issue this guards against: every other request waited about 2 s per upload.
STALL_BOUND_S = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multipart")
    events = tmp / "events.jsonl"
    text = f"""
        models:
          "{ACCENTED}":
            cmd: {fake_cmd("a", events)}
            proxy: http://127.0.0.1:${{PORT}}
          "{JAPANESE}":
            cmd: {fake_cmd("j", events)}
            proxy: http://127.0.0.1:${{PORT}}
            useModelName: "{RENAMED}"
    """
    with Served(tmp, text) as s:
        s.events = events
        yield s


def form(fields: list[tuple[str, bytes]], file_bytes: bytes = b"RIFF....WAVE") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = b""
    for name, value in fields:
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
    body += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
             "Content-Type: audio/wav\r\n\r\n").encode() + file_bytes + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def transcribe(served: Served, fields: list[tuple[str, bytes]], file_bytes: bytes = b"RIFF....WAVE") -> httpx.Response:
    body, content_type = form(fields, file_bytes)
    return httpx.post(served.base + "/v1/audio/transcriptions", content=body,
                      headers={"content-type": content_type}, timeout=120)


@pytest.mark.parametrize("model,forwarded_as", [(ACCENTED, ACCENTED), (JAPANESE, RENAMED)])
def test_a_non_ascii_model_field_is_read_as_utf_8_like_the_same_name_in_json(served, model, forwarded_as):
    r = transcribe(served, [("model", model.encode("utf-8"))])
    assert r.status_code == 200, r.text
    assert r.json()["model"] == forwarded_as  # what the model server received, useModelName applied
    as_json = httpx.post(served.base + "/v1/chat/completions", timeout=60,
                         json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert as_json.status_code == 200, as_json.text


def test_the_charset_field_names_the_encoding_of_the_other_fields(served):
    r = transcribe(served, [("_charset_", b"iso-8859-1"), ("model", ACCENTED.encode("latin-1"))])
    assert r.status_code == 200, r.text


def test_a_model_field_that_is_not_utf_8_is_a_clear_400(served):
    r = transcribe(served, [("model", ACCENTED.encode("latin-1"))])
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_multipart"
    assert "'model'" in r.json()["error"]["message"] and "utf-8" in r.json()["error"]["message"]


def test_30_mb_uploads_do_not_stall_the_other_requests(served):
    audio = os.urandom(UPLOAD_BYTES)
    answers: list[httpx.Response] = []

    def upload_three():
        for _ in range(3):
            answers.append(transcribe(served, [("model", ACCENTED.encode())], audio))

    uploader = threading.Thread(target=upload_three)
    uploader.start()
    slowest = 0.0
    with httpx.Client(base_url=served.base, timeout=30) as probe:
        while uploader.is_alive():
            started = time.monotonic()
            assert probe.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.02)
    uploader.join()
    print(f"slowest /health during 3 uploads of {UPLOAD_BYTES} bytes: {slowest * 1000:.0f} ms")
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert all(r.json()["file_size"] == UPLOAD_BYTES for r in answers)
    assert slowest < STALL_BOUND_S


def test_a_large_json_body_is_read_off_the_event_loop_with_the_same_result(served):
    """Bodies over 256 KiB take the worker-thread path; useModelName still applies to them."""
    marker = uuid.uuid4().hex
    pad = "x" * 2_000_000
    r = httpx.post(served.base + "/v1/chat/completions", timeout=60, json={
        "model": JAPANESE, "messages": [{"role": "user", "content": pad}], "fake": {"id": marker},
    })
    assert r.status_code == 200, r.text
    start = wait_until(lambda: [e for e in read_events(served.events) if e["id"] == marker and e["event"] == "start"])
    assert start[0]["model"] == RENAMED
    broken = b'{"model": "' + JAPANESE.encode() + b'", "messages": [' + b'"' + pad.encode() + b'",'
    r = httpx.post(served.base + "/v1/chat/completions", content=broken,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert "line 1" in r.json()["error"]["message"]
    assert httpx.get(served.base + "/v1/models", timeout=30).json()["data"]  # and the service serves on
