"""The fake model server, run as a real subprocess the way tests, benchmarks and the demo use it.

Each server is started with `--port 0` and announces its port on stdout. The child gets the repo
root as cwd and on PYTHONPATH, so `python -m fakemodel` works without installing the package.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0


@dataclass
class FakeModel:
    process: subprocess.Popen[bytes]
    url: str
    events_path: Path
    stderr_path: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, trust_env=False, timeout=DEADLINE_S)

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def wait_until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.02)
    return result


@pytest.fixture
def launch(tmp_path):
    """Start `python -m fakemodel --port 0 ARGS…` and return it once its port is open; it gets
    CUDA_VISIBLE_DEVICES only when `cuda_visible_devices` is given, whatever this machine sets."""
    started: list[subprocess.Popen[bytes]] = []

    def launch(*args: str, expect_listening: bool = True, cuda_visible_devices: str | None = None) -> FakeModel:
        number = len(started)
        events_path = tmp_path / f"events-{number}.jsonl"
        stderr_path = tmp_path / f"stderr-{number}.log"
        with open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "fakemodel", "--port", "0", "--events", str(events_path), *args],
                cwd=REPO_ROOT,
                env={
                    **{name: value for name, value in os.environ.items() if name != "CUDA_VISIBLE_DEVICES"},
                    "PYTHONPATH": str(REPO_ROOT),
                    **({} if cuda_visible_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_visible_devices}),
                },
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        started.append(process)
        model = FakeModel(process, "", events_path, stderr_path)
        if expect_listening:
            model.url = "http://" + read_listening_address(process, stderr_path)
        return model

    yield launch
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()


def read_listening_address(process: subprocess.Popen[bytes], stderr_path: Path) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=DEADLINE_S):
            pytest.fail("fakemodel did not print its listening line")
    line = process.stdout.readline().decode()
    assert line.startswith("fakemodel "), f"unexpected first line {line!r}; stderr: {stderr_path.read_text()}"
    return line.rsplit(" ", 1)[-1].strip()


def sse_payloads(lines: list[str]) -> list[Any]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def test_announces_its_model_and_port(launch):
    model = launch("--model", "tiny-llama")
    with model.client() as client:
        assert client.get("/health").json() == {"status": "ok", "cuda_visible_devices": None}
        assert [entry["id"] for entry in client.get("/v1/models").json()["data"]] == ["tiny-llama"]


def test_chat_completion_returns_words_usage_and_llamacpp_timings(launch):
    model = launch("--tps", "0", "--tokens", "5")
    with model.client() as client:
        body = client.post("/v1/chat/completions", json=chat("one two three")).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "alpha bravo charlie delta echo"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    timings = body["timings"]
    assert timings["prompt_n"] == 3 and timings["predicted_n"] == 5
    assert {"prompt_ms", "predicted_ms", "prompt_per_second", "predicted_per_second"} <= timings.keys()


def test_streamed_chat_sends_role_one_word_per_chunk_stop_usage_then_done(launch):
    model = launch("--tps", "0", "--tokens", "4")
    with model.client() as client:
        with client.stream("POST", "/v1/chat/completions", json=chat("hi", stream=True)) as response:
            assert response.headers["content-type"] == "text/event-stream"
            payloads = sse_payloads(list(response.iter_lines()))
        non_streamed = client.post("/v1/chat/completions", json=chat("hi"))

    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    words = [chunk["choices"][0]["delta"]["content"] for chunk in chunks[1:5]]
    assert words == ["alpha", " bravo", " charlie", " delta"]
    assert "".join(words) == non_streamed.json()["choices"][0]["message"]["content"]
    assert chunks[5]["choices"][0]["finish_reason"] == "stop"
    last = chunks[-1]
    assert last["usage"]["completion_tokens"] == 4
    assert last["timings"]["predicted_n"] == 4


def test_text_and_native_completions(launch):
    model = launch("--tps", "0")
    with model.client() as client:
        text = client.post("/v1/completions", json={"prompt": "say", "max_tokens": 2}).json()
        native = client.post("/completion", json={"prompt": "say", "n_predict": 3}).json()
        with client.stream("POST", "/infill", json={"n_predict": 2, "stream": True}) as response:
            infill = [json.loads(p) for p in sse_payloads(list(response.iter_lines()))]
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "alpha bravo"
    assert native["content"] == "alpha bravo charlie" and native["stop"] is True
    assert native["timings"]["predicted_n"] == 3
    assert [chunk["content"] for chunk in infill] == ["alpha", " bravo", ""]
    assert infill[-1]["stop"] is True and infill[-1]["timings"]["predicted_n"] == 2


def test_embeddings_are_deterministic_per_input(launch):
    model = launch()
    with model.client() as client:
        first = client.post("/v1/embeddings", json={"model": "e", "input": ["cat", "dog"]}).json()
        again = client.post("/v1/embeddings", json={"model": "e", "input": "cat"}).json()
    vectors = [item["embedding"] for item in first["data"]]
    assert vectors[0] == again["data"][0]["embedding"]
    assert vectors[0] != vectors[1]


def test_transcription_echoes_model_and_file_size(launch):
    model = launch()
    with model.client() as client:
        response = client.post(
            "/v1/audio/transcriptions", data={"model": "whisper"}, files={"file": ("a.wav", b"x" * 1234)}
        )
    assert response.json()["model"] == "whisper"
    assert response.json()["file_size"] == 1234


def test_other_paths_echo_path_method_requested_and_serving_model(launch):
    model = launch("--model", "server-a")
    with model.client() as client:
        posted = client.post("/v1/rerank?x=1", json={"model": "r"}).json()
        got = client.get("/props?model=p").json()
    assert posted == {"path": "/v1/rerank?x=1", "method": "POST", "model": "r", "served_by": "server-a",
                      "cuda_visible_devices": None, "body": {"model": "r"}}
    assert got == {"path": "/props?model=p", "method": "GET", "model": "p", "served_by": "server-a",
                   "cuda_visible_devices": None}


@pytest.mark.parametrize("devices", ["1,3", ""])
def test_the_cuda_visible_devices_it_was_started_with_is_in_its_health_echo_and_start_events(launch, devices):
    model = launch("--model", "placed", cuda_visible_devices=devices)
    with model.client() as client:
        assert client.get("/health").json() == {"status": "ok", "cuda_visible_devices": devices}
        assert client.post("/v1/rerank", json={"model": "placed"}).json()["cuda_visible_devices"] == devices
    [start] = [event for event in model.events() if event["event"] == "start"]
    assert start["cuda_visible_devices"] == devices


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE", "GET"])
def test_a_body_on_any_method_is_read_so_the_next_request_on_the_connection_is_intact(launch, method):
    model = launch("--model", "server-a")
    with model.client() as client:
        answered = client.request(method, "/any/path", content=b'{"model": "m"}' + b" " * 5000)
        after = client.post("/v1/rerank", json={"model": "next"})
    assert answered.json()["method"] == method
    assert after.json() == {"path": "/v1/rerank", "method": "POST", "model": "next", "served_by": "server-a",
                            "cuda_visible_devices": None, "body": {"model": "next"}}


def test_invalid_requests_get_openai_errors(launch):
    model = launch()
    with model.client() as client:
        not_json = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        bad_override = client.post("/v1/chat/completions", json=chat(fake={"tokens": "many"}))
    for response in (not_json, bad_override):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in not_json.json()["error"]["message"]
    assert "many" in bad_override.json()["error"]["message"]


def test_per_request_overrides(launch):
    model = launch("--tps", "0", "--tokens", "16")
    with model.client() as client:
        short = client.post("/v1/chat/completions", json=chat(fake={"tokens": 2}))
        by_max_tokens = client.post("/v1/chat/completions", json=chat(max_tokens=3))
        failing = client.post("/v1/chat/completions", json=chat(fake={"status": 503}))
        started = time.monotonic()
        client.post("/v1/chat/completions", json=chat(fake={"delay": 0.3, "tokens": 1}))
        delayed_for = time.monotonic() - started
    assert short.json()["usage"]["completion_tokens"] == 2
    assert by_max_tokens.json()["choices"][0]["message"]["content"] == "alpha bravo charlie"
    assert failing.status_code == 503
    assert failing.json()["error"]["type"] == "server_error"
    assert delayed_for >= 0.3


def test_events_record_request_id_model_priority_and_headers(launch):
    model = launch("--tps", "0")
    with model.client() as client:
        client.post(
            "/v1/chat/completions",
            json=chat(fake={"id": "first"}),
            headers={"X-LlamaSwap-Priority": "7", "X-Custom": "yes"},
        )
        client.post("/v1/embeddings", json={"model": "e", "input": "x"})
    events = model.events()
    assert [(e["event"], e["id"]) for e in events] == [("start", "first"), ("end", "first"), ("start", "2"), ("end", "2")]
    assert events[0]["model"] == "m" and events[0]["priority"] == "7"
    assert events[0]["path"] == "/v1/chat/completions"
    assert events[0]["headers"]["x-custom"] == "yes"
    assert events[2]["priority"] is None and events[2]["model"] == "e"


def test_load_delay_reports_loading_and_holds_requests_until_loaded(launch):
    model = launch("--load-delay", "2", "--tps", "0")
    with model.client() as client:
        loading = client.get("/health")
        answer = client.post("/v1/chat/completions", json=chat(fake={"tokens": 1}))
        after = client.get("/health")
    assert (loading.status_code, loading.json()) == (503, {"status": "loading", "cuda_visible_devices": None})
    assert answer.json()["choices"][0]["message"]["content"] == "alpha"
    assert after.status_code == 200


def test_hang_at_start_never_becomes_healthy(launch):
    model = launch("--hang-at-start")
    with model.client() as client:
        assert client.get("/health").status_code == 503
    assert model.process.poll() is None


def test_exit_at_start_exits_with_the_code_and_says_why(launch):
    model = launch("--exit-at-start", "7", expect_listening=False)
    assert model.process.wait(timeout=DEADLINE_S) == 7
    assert "status 7" in model.stderr()


def test_client_disconnect_stops_generation_and_is_recorded(launch):
    model = launch("--tps", "20", "--tokens", "1000")
    host, port = model.url.removeprefix("http://").split(":")
    body = json.dumps(chat(stream=True, fake={"id": "leaver"})).encode()
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        wait_until(lambda: b"alpha" in connection.recv(65536), "the first token arrived")

    disconnect = wait_until(
        lambda: [e for e in model.events() if e["event"] == "disconnect" and e["id"] == "leaver"],
        "the disconnect was recorded",
    )
    assert disconnect
    assert not [e for e in model.events() if e["event"] == "end"]
    with model.client() as client:
        assert client.get("/health").status_code == 200


def test_crash_after_tokens_kills_the_process_mid_stream(launch):
    model = launch("--tps", "0", "--tokens", "10", "--crash-after-tokens", "3")
    received = []
    with model.client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        received.append(json.loads(line[len("data: ") :])["choices"][0]["delta"].get("content"))
    assert received == ["", "alpha", " bravo", " charlie"]
    assert model.process.wait(timeout=DEADLINE_S) == 3


def test_per_request_crash_after_kills_non_streaming_requests_too(launch):
    model = launch("--tps", "0")
    with model.client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json=chat(fake={"crash_after": 1}))
    assert model.process.wait(timeout=DEADLINE_S) == 3


def test_sigterm_exits_cleanly(launch):
    model = launch()
    model.process.send_signal(signal.SIGTERM)
    assert model.process.wait(timeout=DEADLINE_S) == 0


def test_ignore_sigterm_survives_until_sigkill(launch):
    model = launch("--ignore-sigterm")
    model.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "ignoring SIGTERM" in model.stderr(), "the server noticed SIGTERM")
    with model.client() as client:
        assert client.get("/health").status_code == 200
    model.process.kill()
    assert model.process.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def open_stream(model: FakeModel, request_id: str) -> socket.socket:
    """Send a long streamed chat request on a raw connection and leave it open."""
    host, port = model.url.removeprefix("http://").split(":")
    body = json.dumps(chat(stream=True, fake={"id": request_id})).encode()
    connection = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
    connection.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return connection


def events_of(model: FakeModel, kind: str, request_id: str) -> list[dict[str, Any]]:
    return [e for e in model.events() if e["event"] == kind and e["id"] == request_id]


def test_parallel_serves_n_at_once_and_queues_the_next_in_arrival_order(launch):
    model = launch("--parallel", "2", "--tps", "20", "--tokens", "100000")
    first, second = open_stream(model, "a"), open_stream(model, "b")
    wait_until(lambda: events_of(model, "start", "a") and events_of(model, "start", "b"), "two requests started")
    third = open_stream(model, "c")
    wait_until(lambda: events_of(model, "queued", "c"), "the third request queued")
    fourth = open_stream(model, "d")
    wait_until(lambda: events_of(model, "queued", "d"), "the fourth request queued")
    with model.client() as client:
        assert client.get("/v1/models").status_code == 200  # a GET takes no slot
    assert not events_of(model, "start", "c") and not events_of(model, "start", "d")

    first.close()
    wait_until(lambda: events_of(model, "start", "c"), "the third request took the freed slot")
    assert not events_of(model, "start", "d")
    for connection in (second, third, fourth):
        connection.close()
    starts = [e for e in model.events() if e["event"] == "start" and e["path"] != "/v1/models"]
    assert [e["in_flight"] for e in starts[:2]] == [1, 2]
    assert events_of(model, "queued", "c")[0]["in_flight"] == 2
    assert events_of(model, "start", "c")[0]["in_flight"] == 2


def test_parallel_drops_a_queued_request_whose_client_left(launch):
    model = launch("--parallel", "1", "--tps", "20", "--tokens", "100000")
    holder = open_stream(model, "holder")
    wait_until(lambda: events_of(model, "start", "holder"), "the slot is taken")
    leaver = open_stream(model, "leaver")
    wait_until(lambda: events_of(model, "queued", "leaver"), "the second request queued")
    leaver.close()
    wait_until(lambda: events_of(model, "disconnect", "leaver"), "the queued request was dropped")
    holder.close()
    with model.client() as client:
        answered = client.post("/v1/chat/completions", json=chat(fake={"id": "next", "tokens": 1}))
    assert answered.status_code == 200
    assert not events_of(model, "start", "leaver")
    assert events_of(model, "start", "next")[0]["in_flight"] == 1


def test_without_parallel_every_request_is_served_at_once(launch):
    model = launch("--tps", "20", "--tokens", "100000")
    streams = [open_stream(model, str(n)) for n in range(3)]
    wait_until(lambda: all(events_of(model, "start", str(n)) for n in range(3)), "all three started")
    assert sorted(events_of(model, "start", str(n))[0]["in_flight"] for n in range(3)) == [1, 2, 3]
    assert not [e for e in model.events() if e["event"] == "queued"]
    for connection in streams:
        connection.close()


def test_negative_parallel_is_refused(launch):
    model = launch("--parallel", "-1", expect_listening=False)
    assert model.process.wait(timeout=DEADLINE_S) == 2
    assert "--parallel" in model.stderr()
