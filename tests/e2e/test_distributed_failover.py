"""Distributed mode losing nothing when a process dies: a standby worker takes over a `kill -9`ed one
and serves its queue once, in order, to the front ends that kept their clients; a `kill -9`ed front
end's requests are let go at the worker while everyone else carries on. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.e2e.held import HeldStream
from tests.e2e.test_distributed import config_text, distributed, distributed_either, queued_rows  # noqa: F401 (fixtures)
from tests.served import REPO, Served, Worker, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

PRIORITIES = (-50, 0, 20, 0, 5)


def front_ends(tmp_path, text: str, env: dict) -> list[Served]:
    made = []
    for name in ("fe1", "fe2"):
        (tmp_path / name).mkdir()
        made.append(Served(tmp_path / name, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")}))
    return made


def post_in_background(served: Served, request_id: str, priority: int, answers: dict) -> threading.Thread:
    def post():
        try:
            answers[request_id] = httpx.post(
                served.base + "/v1/chat/completions", timeout=120,
                headers={"X-LlamaSwap-Priority": str(priority)},
                json={"model": "chat", "messages": [], "fake": {"id": request_id, "tokens": 2}},
            )
        except httpx.HTTPError as exc:
            answers[request_id] = exc

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def rows(psycopg, url: str) -> list[tuple]:
    with psycopg.connect(url) as connection:
        return connection.execute(
            "SELECT id, state, priority, origin <> '' FROM scheduling_queuedrequest ORDER BY id"
        ).fetchall()


def ended_rows(psycopg, url: str) -> list[tuple]:
    """The rows once every one has ended (the worker writes them behind its answers)."""
    def ended():
        found = rows(psycopg, url)
        return found if all(row[1] not in ("queued", "dispatched") for row in found) else None

    return wait_until(ended, 10, 0.05, "every row to end")


def test_a_standby_serves_the_50_requests_queued_on_a_killed_worker_once_and_in_order(tmp_path, distributed_either):
    env, psycopg = distributed_either
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    standby_env = {**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "standby-data")}  # as on another machine
    with Worker(tmp_path / "active", text, env) as active, \
            Worker(tmp_path / "standby", text, standby_env, ready="llamaswap worker standing by") as standby:
        first, second = front_ends(tmp_path, text, env)
        with first, second:
            held = HeldStream(first, "chat", tokens=100_000, tps=50, request_id="held")
            answers: dict = {}
            threads, priority_of = [], {}
            for number in range(50):
                request_id, priority = f"r{number:02d}", PRIORITIES[number % len(PRIORITIES)]
                priority_of[request_id] = priority
                threads.append(post_in_background((first, second)[number % 2], request_id, priority, answers))
                wait_until(lambda: queued_rows(psycopg, env["DATABASE_URL"]) == number + 1, 20, 0.02,
                           f"{request_id} to queue at the worker")
            queued_ids = [row[0] for row in rows(psycopg, env["DATABASE_URL"]) if row[1] == "queued"]

            os.kill(active.proc.pid, signal.SIGKILL)
            wait_until(lambda: "llamaswap worker serving" in standby.log(), 60, 0.05, "the standby to take over")
            assert "50 queued requests taken over" in standby.log()

            held.read_to_end()
            assert "upstream_failed" in held.payloads[-2], "the running request's model was stopped with the dead worker"
            for thread in threads:
                thread.join(120)
            failed = {rid: answer for rid, answer in answers.items()
                      if not isinstance(answer, httpx.Response) or answer.status_code != 200}
            assert len(answers) == 50 and not failed, failed

            started = [e["id"] for e in read_events(events) if e["event"] == "start" and e["id"] != "held"]
            assert sorted(started) == sorted(priority_of), "each queued request reached the model exactly once"
            assert started == sorted(priority_of, key=lambda rid: (-priority_of[rid], rid)), "in priority order"
            final = ended_rows(psycopg, env["DATABASE_URL"])
            assert len(final) == 51, "no request was queued twice"
            assert [row[0] for row in final if row[1] == "completed"] == queued_ids, "served under their own rows"
            # The held stream was cut when the standby stopped the dead worker's model: its row says so as its front
            # end saw it, once that report reaches the standby (with `pubsub` it may reach none: then the row says
            # the worker died under it).
            held_ends = ["failed"] if env["LLAMASWAP_CHANNEL_LAYER"] == "lists" else ["failed", "interrupted"]
            assert [row[1] for row in final if row[0] not in queued_ids][0] in held_ends


def test_a_killed_front_end_has_its_requests_let_go_and_the_others_are_served(tmp_path, distributed):
    env, psycopg = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    with Worker(tmp_path / "worker", text, env):
        doomed, survivor = front_ends(tmp_path, text, env)
        with doomed, survivor:
            held = HeldStream(doomed, "chat", tokens=100_000, tps=50, request_id="held")
            answers: dict = {}
            threads = []
            for number, (served, priority) in enumerate([(doomed, 100), (doomed, 100), (survivor, 0), (survivor, -10)]):
                threads.append(post_in_background(served, f"r{number}", priority, answers))
                wait_until(lambda: queued_rows(psycopg, env["DATABASE_URL"]) == number + 1, 20, 0.02, f"r{number} to queue")

            doomed.kill()
            for thread in threads[2:]:
                thread.join(60)
            assert [answers[rid].status_code for rid in ("r2", "r3")] == [200, 200]
            started = [e["id"] for e in read_events(events) if e["event"] == "start"]
            assert started == ["held", "r2", "r3"], "the dead front end's requests never reached the model"
            states = {row[0]: row[1] for row in ended_rows(psycopg, env["DATABASE_URL"])}
            assert sorted(states.values()) == ["cancelled", "cancelled", "cancelled", "completed", "completed"]
            held.close()


def test_a_restarted_worker_serves_what_the_stopped_one_left_queued_and_what_came_meanwhile(tmp_path, distributed):
    env, psycopg = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    (tmp_path / "fe").mkdir()
    answers: dict = {}
    threads = []
    stopping = Worker(tmp_path / "worker", text, env).__enter__()
    try:
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            held = HeldStream(front, "chat", tokens=100, tps=40, request_id="held")
            for number, priority in enumerate((0, -10, 10)):
                threads.append(post_in_background(front, f"r{number}", priority, answers))
                wait_until(lambda: queued_rows(psycopg, env["DATABASE_URL"]) == number + 1, 20, 0.02, f"r{number} to queue")
            stopping.proc.terminate()  # as `systemctl restart` does
            wait_until(lambda: "leaving 3 queued requests for the next worker" in stopping.log(), 20, 0.05, "the hand-over")
            threads.append(post_in_background(front, "meanwhile", 5, answers))
            assert held.read_to_end()[-1] == "[DONE]", "the running request finished during the drain"
            stopping.proc.wait(30)
            with Worker(tmp_path / "restarted", text, env) as restarted:  # the same data dir, a log of its own
                assert "3 queued requests taken over" in restarted.log()
                for thread in threads:
                    thread.join(60)
    finally:
        stopping.__exit__(None, None, None)
    assert {rid: answer.status_code for rid, answer in answers.items()} == dict.fromkeys(
        ("r0", "r1", "r2", "meanwhile"), 200)
    started = [e["id"] for e in read_events(events) if e["event"] == "start"]
    assert started == ["held", "r2", "meanwhile", "r0", "r1"]


def test_a_front_end_started_before_any_worker_says_to_start_the_worker_first(tmp_path, distributed):
    env, _ = distributed
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tmp_path / "events.jsonl"))
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "serve", "--config", str(config), "--listen", f"127.0.0.1:{model_ports(1)}"],
        cwd=REPO, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "data")}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "start `llamaswap worker` first" in result.stderr and "migrations" in result.stderr
