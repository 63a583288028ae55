"""Stopping the service with work in flight: SIGTERM drains within its budget, SIGKILL leaves a sound database."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxy.model_processes.process_groups import process_group_alive
from tests.e2e.conftest import db_rows
from tests.reliability.support import all_rows_terminal, chat, group_members, integrity_check, model_pgid, serial_config
from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e

EXIT_SLACK_S = 5  # stopping the model and flushing the rows, after the drain budget

def in_thread(call) -> tuple[threading.Thread, list]:
    """Run `call` in a thread; its result (or the exception it raised) and when it ended land in the list."""
    outcome: list = []

    def run():
        try:
            result = call()
        except Exception as exc:  # the caller asserts on what happened, including a cut connection
            result = exc
        outcome.append((result, time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def starts(events, request_id: str) -> list[dict]:
    return [e for e in read_events(events) if e["event"] == "start" and e["id"] == request_id]


def test_sigterm_finishes_the_running_request_and_refuses_the_queued_ones(tmp_path):
    events = tmp_path / "events.jsonl"
    served = Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", events)}}),
                    extra_args=("--drain-seconds", "20")).start()
    try:
        running, ran = in_thread(lambda: chat(served.base, "m", id="running", delay=3))
        wait_until(lambda: starts(events, "running"), what="the running request to reach the model")
        pgid = model_pgid(served.data_dir, "m")
        queued = [in_thread(lambda: chat(served.base, "m", id="queued")) for _ in range(2)]
        wait_until(lambda: len(db_rows(served.data_dir, "state='queued'")) == 2, what="two queued rows")
        signalled_at = time.time()
        exit_status = served.stop(signal.SIGTERM, timeout=20 + EXIT_SLACK_S)
    finally:
        served.kill()
    for thread, _ in [(running, ran), *queued]:
        thread.join(10)

    assert exit_status == 0
    [(finished, _)] = ran
    assert finished.status_code == 200
    ended = [e for e in read_events(events) if e["event"] == "end" and e["id"] == "running"]
    assert ended[0]["t"] > signalled_at, "the request should still have been running when SIGTERM arrived"
    for _, [(refused, _)] in queued:
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert refused.headers["X-LlamaSwap-Request-Id"], "the refusal names the row that says it too"
    assert not starts(events, "queued")
    assert not process_group_alive(pgid), f"model processes {group_members(pgid)} outlived the service"
    states = sorted(r["state"] for r in all_rows_terminal(served.data_dir, 3, timeout=1))
    assert states == ["completed", "rejected", "rejected"]


def test_sigterm_cuts_a_request_longer_than_the_drain_budget_and_still_exits_zero(tmp_path):
    events = tmp_path / "events.jsonl"
    drain_s = 1
    served = Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", events)}}),
                    extra_args=("--drain-seconds", str(drain_s))).start()
    try:
        running, ran = in_thread(lambda: chat(served.base, "m", id="long", delay=120))
        wait_until(lambda: starts(events, "long"), what="the long request to reach the model")
        pgid = model_pgid(served.data_dir, "m")
        signalled_at = time.monotonic()
        exit_status = served.stop(signal.SIGTERM, timeout=drain_s + EXIT_SLACK_S)
    finally:
        served.kill()
    running.join(10)

    assert exit_status == 0
    [(cut, cut_at)] = ran
    assert cut_at - signalled_at >= drain_s, "the request was cut before its drain budget ran out"
    assert cut.status_code == 503 and cut.json()["error"]["code"] == "shutting_down", "the shutdown, not the model"
    assert cut.headers["X-LlamaSwap-Request-Id"]
    assert not process_group_alive(pgid), f"model processes {group_members(pgid)} outlived the service"
    [row] = all_rows_terminal(served.data_dir, 1, timeout=1)
    assert (row["state"], row["status_code"], row["error"]) == ("cancelled", 503, cut.json()["error"]["message"])


def test_sigterm_ends_a_stream_longer_than_the_drain_budget_with_a_shutting_down_event(tmp_path):
    events = tmp_path / "events.jsonl"
    served = Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", events)}}),
                    extra_args=("--drain-seconds", "1")).start()
    body = {"model": "m", "messages": [], "stream": True, "fake": {"id": "long", "tokens": 10_000, "tps": 20}}
    try:
        with httpx.stream("POST", served.base + "/v1/chat/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            exit_status = served.stop(signal.SIGTERM, timeout=1 + EXIT_SLACK_S)
            payloads = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    finally:
        served.kill()

    assert exit_status == 0
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "shutting_down", error
    [row] = all_rows_terminal(served.data_dir, 1, timeout=1)
    assert (row["state"], row["status_code"], row["error"]) == ("cancelled", 503, error["message"])


def test_sigkill_while_rows_are_being_written_leaves_an_intact_database_and_the_restart_serves(tmp_path):
    served = Served(tmp_path, serial_config({"m": {"cmd": fake_cmd("m", None, "--tps", "0")}})).start()
    clients = ThreadPoolExecutor(max_workers=32)
    try:
        for _ in range(400):
            clients.submit(chat, served.base, "m", timeout=30)
        wait_until(lambda: len(db_rows(served.data_dir, "state='completed'")) >= 20
                   and db_rows(served.data_dir, "state='queued'"), what="requests completing while others queue")
        served.kill()
    finally:
        clients.shutdown(wait=True, cancel_futures=True)

    assert integrity_check(served.data_dir / "llamaswap.sqlite3") == "ok"
    served.start()
    try:
        assert chat(served.base, "m").status_code == 200
        rows = all_rows_terminal(served.data_dir, None)
    finally:
        served.stop()
    assert {"completed", "interrupted"} <= {r["state"] for r in rows}
    assert rows[-1]["state"] == "completed"
