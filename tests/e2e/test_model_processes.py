"""How the service runs model commands and reports on them: the `llamaswap` it finds, its start errors, its log."""

from __future__ import annotations

import sys

import httpx
import pytest
import yaml

from tests.served import Served

pytestmark = pytest.mark.e2e


def chat(served: Served, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)


def config(models: dict[str, str]) -> str:
    return yaml.safe_dump({
        "healthCheckTimeout": 20,
        "models": {name: {"cmd": cmd, "proxy": "http://127.0.0.1:${PORT}"} for name, cmd in models.items()},
    }, width=1 << 16)


def test_llamaswap_serving_without_its_scripts_on_path_still_runs_llamaswap_fakemodel(tmp_path):
    """`cmd: llamaswap fakemodel …` (the example config's) works however the service was started."""
    text = config({"m": "llamaswap fakemodel --port ${PORT} --model m"})
    with Served(tmp_path, text, env={"PATH": "/usr/bin:/bin"}) as served:
        reply = chat(served, "m")
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "m"


def test_a_failed_start_names_the_model_once_with_only_that_attempts_output_and_is_logged(tmp_path):
    broken = f"{sys.executable} -m fakemodel --port ${{PORT}} --exit-at-start 3"
    ok = f"{sys.executable} -m fakemodel --port ${{PORT}} --model ok"
    with Served(tmp_path, config({"broken": broken, "ok": ok})) as served:
        messages = []
        for _ in range(2):
            reply = chat(served, "broken")
            assert reply.status_code == 503
            messages.append(reply.json()["error"]["message"])
        expected = (
            "model 'broken' failed to start: exited with status 3 before becoming healthy; last log lines:\n"
            "fakemodel: exiting at start with status 3 as requested"
        )
        assert messages == [expected, expected], "the second attempt's message must not repeat the first's output"
        served.check_settled("ok")
        log = served.log()
    # The model processes' own lines reach the service's log, with time and level.
    assert " INFO llamaswap.processes: model 'broken' starting (pid " in log
    assert " INFO llamaswap.processes: model 'ok' ready after " in log
    assert log.count(" WARNING llamaswap.scheduler: model broken failed to start: exited with status 3") == 2
    assert "could not start" not in log
