"""Client traffic for a served instance: a request that holds the GPU, and callers that queue behind it."""

from __future__ import annotations

import threading

import httpx

from tests.served import fake_cmd, read_events


def two_model_config(tmp, bonus=10):
    """Fake alpha and beta models; aging off so ranks depend only on priority and swap affinity."""
    events = tmp / "events.jsonl"
    return events, f"""
        healthCheckTimeout: 20
        models:
          alpha:
            cmd: {fake_cmd("alpha", events, "--tps", "500")}
            proxy: http://127.0.0.1:${{PORT}}
          beta:
            cmd: {fake_cmd("beta", events, "--tps", "500")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{agingDivisor: 0, swapAffinityBonus: {bonus}}}
    """


class Caller:
    """A client request in its own thread; `result` holds (status, JSON body) once it returns."""

    def __init__(self, served, model, priority=0, tag=""):
        self.result = None
        body = {"model": model, "messages": [{"role": "user", "content": tag}], "fake": {"id": tag or model}}

        def run():
            response = httpx.post(served.base + "/v1/chat/completions", json=body,
                                  headers={"X-LlamaSwap-Priority": str(priority)}, timeout=60)
            self.result = (response.status_code, response.json())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait(self):
        self.thread.join(60)
        assert self.result is not None, "the request did not return"
        return self.result


class GpuHolder:
    """A streaming request that keeps alpha busy until `release()` hangs up."""

    def __init__(self, served):
        self._stream = httpx.stream(
            "POST", served.base + "/v1/chat/completions", timeout=60,
            json={"model": "alpha", "stream": True, "messages": [],
                  "fake": {"tokens": 100000, "tps": 20, "id": "holder"}},
        )
        self._lines = self._stream.__enter__().iter_lines()  # dropping the iterator would hang up
        assert next(self._lines).startswith("data:")

    def release(self):
        self._stream.__exit__(None, None, None)


def started_ids(served):
    return [e["id"] for e in read_events(served.events) if e["event"] == "start"]
