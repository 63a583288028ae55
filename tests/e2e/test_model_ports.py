"""A model's port held by someone else: the start fails clearly, and nobody else's server is served."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
import yaml

from tests.served import REPO, Served, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e


def chat(served: Served, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)


def test_a_model_whose_port_is_taken_gets_a_503_naming_the_port_and_the_other_server_is_never_asked(tmp_path):
    port = model_ports(1)
    foreign_events = tmp_path / "foreign.jsonl"
    foreign = subprocess.Popen(
        [sys.executable, "-m", "fakemodel", "--port", str(port), "--model", "foreign",
         "--events", str(foreign_events)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    config = yaml.safe_dump({
        "startPort": port,
        "models": {"m": {"cmd": f"{sys.executable} -m fakemodel --port ${{PORT}} --model m",
                         "proxy": "http://127.0.0.1:${PORT}"}},
    })
    served = Served(tmp_path, config).start()
    try:
        wait_until(lambda: _answers(port), what="the other server to listen on the model's port")
        refused = chat(served, "m")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "model_start_failed"
        assert error["message"] == (
            f"model 'm' failed to start: port {port} (from its proxy http://127.0.0.1:{port}) "
            "is in use by another process"
        )
        assert read_events(foreign_events) == [], "the other server must never get the model's requests"

        foreign.terminate()
        foreign.wait(10)
        rows = served.check_settled("m")  # with the port free, the model starts and answers
        assert [row["status_code"] for row in rows] == [503, 200]
    finally:
        served.stop()
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
