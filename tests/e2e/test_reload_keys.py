"""A reload applies every changed key, not only those that need a new process: timeouts,
healthCheckTimeout and unloadTimeout take effect at once, and the running model is not restarted."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.held import sighup_reload
from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e


def config(events, *, health: int, unload: int, response_timeout: str) -> str:
    return f"""\
healthCheckTimeout: {health}
models:
  m:
    cmd: {fake_cmd("m", events, "--ignore-sigterm")}
    unloadTimeout: {unload}
    {response_timeout}
  stuck:
    cmd: {fake_cmd("stuck", None, "--hang-at-start")}
routing:
  scheduler:
    use: serial
"""


def chat(served, model, **fake):
    return httpx.post(served.base + "/v1/chat/completions",
                      json={"model": model, "messages": [], "fake": fake}, timeout=120)


def served_by_pid(answer: httpx.Response) -> str:
    """The fake model's completion ids are `cmpl-<its pid>-<clock>`."""
    return answer.json()["id"].split("-")[1]


def test_a_reload_applies_changed_timeouts_without_restarting_the_model(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, health=60, unload=1, response_timeout="")) as served:
        first = chat(served, "m")
        assert first.status_code == 200

        sighup_reload(served, config(events, health=1, unload=3, response_timeout="timeouts: {responseHeader: 1}"))
        assert "restarting none" in served.log()

        # timeouts.responseHeader: a request slower than the new limit gets 504, from the same process.
        slow = chat(served, "m", delay=5)
        assert slow.status_code == 504 and slow.json()["error"]["code"] == "upstream_timeout"
        again = chat(served, "m")
        assert again.status_code == 200 and served_by_pid(again) == served_by_pid(first)

        # unloadTimeout: the model ignores SIGTERM, so it is killed once the new limit is up.
        assert httpx.post(served.base + "/api/models/unload/m", timeout=60).text == "OK"
        assert "'m' did not stop within 3s" in served.log()

        # healthCheckTimeout: a model that never becomes healthy is given up on after the new limit.
        stuck = chat(served, "stuck")
        assert stuck.status_code == 503 and "health check timed out after 1s" in stuck.json()["error"]["message"]
        served.check_settled("m")
