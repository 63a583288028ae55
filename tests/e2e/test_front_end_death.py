"""A front end killed with kill -9, with real processes: the worker hears nothing from it for the 5 s
silence limit, then ends all its requests in one step, so the scheduler never serves a client that is
gone (no model is started for one) and a live front end's request is served as if they never were."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.e2e.held import HeldStream
from tests.e2e.test_distributed import distributed  # noqa: F401 (fixture)
from tests.served import Served, Worker, fake_cmd, model_ports, wait_until
from scheduling.door.wire import FRONT_END_TIMEOUT_S, HEARTBEAT_S

pytestmark = pytest.mark.e2e


def config(events, started) -> str:
    """Models x and y, one at a time; y's command notes each start of its process in `started`."""
    y = f"sh -c 'echo started >> {started}; exec {fake_cmd('y', events)}'"
    return (f"startPort: {model_ports(2)}\nrouting:\n  scheduler:\n    use: serial\nmodels:\n"
            f'  x: {{cmd: "{fake_cmd("x", events)}"}}\n  y: {{cmd: "{y}"}}\n')


def front_end(tmp_path, name: str, text: str, env: dict) -> Served:
    (tmp_path / name).mkdir()
    return Served(tmp_path / name, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")})


def post(served: Served, model: str, request_id: str, priority: int, answers: dict) -> threading.Thread:
    def send():
        try:
            answers[request_id] = httpx.post(
                served.base + "/v1/chat/completions", timeout=120, headers={"X-LlamaSwap-Priority": str(priority)},
                json={"model": model, "messages": [], "fake": {"id": request_id, "tokens": 2}},
            )
        except httpx.HTTPError as exc:  # its front end was killed
            answers[request_id] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def by_state(served: Served, state: str) -> list[dict]:
    return [row for row in served.rows() if row["state"] == state]


def test_a_killed_front_ends_requests_leave_at_once_and_start_no_model_for_it(tmp_path, distributed):
    env, _ = distributed
    started = tmp_path / "y-started"
    text = config(tmp_path / "events.jsonl", started)
    with Worker(tmp_path / "worker", text, env) as worker, front_end(tmp_path, "a", text, env) as doomed, \
            front_end(tmp_path, "b", text, env) as live:
        answers: dict = {}
        held = HeldStream(doomed, "x", tokens=100_000, tps=50, request_id="a-x")  # x runs for the doomed front end
        post(doomed, "y", "a-y", 100, answers)  # best of the queue: y next, once x is free
        wait_until(lambda: len(by_state(live, "queued")) == 1, 20, 0.02, "a-y to queue")
        served = post(live, "x", "b-x", 0, answers)
        wait_until(lambda: len(by_state(live, "queued")) == 2, 20, 0.02, "b-x to queue")

        doomed.kill()
        held.close()
        served.join(60)
        assert answers["b-x"].status_code == 200, answers["b-x"].text
        a_x, a_y, b_x, _ = live.check_settled("x")  # in the order they queued, then the check's own
        assert not started.exists(), "y was started for a front end already gone"
        assert "swapping to" not in worker.log(), "the live request waited through a swap"
        assert (a_x["model"], a_y["model"], b_x["model"]) == ("x", "y", "x")
        assert b_x["state"] == "completed" and b_x["needed_swap"] is False, b_x
        assert a_x["state"] == a_y["state"] == "cancelled", (a_x, a_y)
        assert "not heard from for 5 s" in a_x["error"] and "not heard from for 5 s" in a_y["error"]


def test_a_killed_front_ends_requests_are_cancelled_after_the_silence_limit_not_before(tmp_path, distributed):
    env, _ = distributed
    text = config(tmp_path / "events.jsonl", tmp_path / "y-started")
    with Worker(tmp_path / "worker", text, env), front_end(tmp_path, "a", text, env) as doomed, \
            front_end(tmp_path, "b", text, env) as live:
        held = HeldStream(doomed, "x", tokens=100_000, tps=50, request_id="a-x")
        post(doomed, "x", "a-x2", 0, {})
        wait_until(lambda: len(by_state(live, "queued")) == 1, 20, 0.02, "a-x2 to queue")
        doomed.kill()
        killed_at = time.monotonic()
        held.close()
        # Heard from at most one heartbeat before the kill; the worker looks four times per limit.
        earliest, latest = FRONT_END_TIMEOUT_S - HEARTBEAT_S, FRONT_END_TIMEOUT_S * 1.25 + 3
        wait_until(lambda: len(by_state(live, "cancelled")) == 2, latest, 0.05, "the killed front end's requests to end")
        took = time.monotonic() - killed_at
        assert earliest - 0.2 <= took <= latest, f"cancelled {took:.1f} s after the kill"
        live.check_settled("x")
