"""Requests a test holds open while it changes the service under them (reload, unload, TTL)."""

from __future__ import annotations

import json
import signal
import threading

import httpx

from tests.served import read_events, wait_until


class HeldStream:
    """A streaming chat request: the model is busy with it until it has sent `tokens` tokens."""

    def __init__(self, served, model: str, *, tokens: int, tps: float, request_id: str):
        self.request_id = request_id
        self._client = httpx.Client(timeout=60)
        self._stream = self._client.stream(
            "POST", served.base + "/v1/chat/completions",
            json={"model": model, "stream": True, "messages": [],
                  "fake": {"tokens": tokens, "tps": tps, "id": request_id}},
        )
        self.response = self._stream.__enter__()
        self._lines = self.response.iter_lines()
        self.payloads: list[str] = []
        assert self.response.status_code == 200, self.response.read()
        self._read_one()  # the first event: the model is answering

    def _read_one(self) -> str | None:
        for line in self._lines:
            if line.startswith("data: "):
                self.payloads.append(line[len("data: "):])
                return self.payloads[-1]
        return None

    def read_to_end(self) -> list[str]:
        """Every `data:` payload of the stream, `[DONE]` included."""
        while self._read_one() is not None:
            pass
        self.close()
        return self.payloads

    def chunks(self) -> list[dict]:
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]

    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks() if c.get("choices"))

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


class HeldRequest:
    """A non-streaming chat request on a thread; `result()` waits for its answer."""

    def __init__(self, served, model: str, *, tokens: int, tps: float, request_id: str):
        self.response: httpx.Response | None = None

        def run():
            self.response = httpx.post(
                served.base + "/v1/chat/completions", timeout=60,
                json={"model": model, "messages": [], "fake": {"tokens": tokens, "tps": tps, "id": request_id}},
            )

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self) -> httpx.Response:
        self._thread.join(60)
        assert self.response is not None, "the request never returned"
        return self.response


def model_events(events_path, request_id: str) -> list[str]:
    """What the fake model logged for one request: "start", then "end" or "disconnect"."""
    return [e["event"] for e in read_events(events_path) if e.get("id") == request_id]


def wait_for_model_to_start(events_path, request_id: str) -> None:
    wait_until(lambda: "start" in model_events(events_path, request_id), timeout=30,
               what=f"request {request_id} to reach the model")


def sighup_reload(served, text: str) -> None:
    """Write the models part of the config (keeping the harness's start port) and reload with SIGHUP."""
    start_port = served.config_path.read_text().split("\n", 1)[0]
    served.config_path.write_text(start_port + "\n" + text)
    before = served.log().count("config reloaded")
    served.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: served.log().count("config reloaded") > before, timeout=15, what="the reload to be applied")
