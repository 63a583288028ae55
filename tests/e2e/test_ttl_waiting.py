"""A loaded model that a request is queued for is not idle: its TTL does not unload it while the request
is held back, and the request is served without loading the model again."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.e2e.held import HeldRequest, HeldStream
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

TTL_S = 1


def config(events) -> str:
    """`a` and `b` run together; `c` runs alone (starting it stops both)."""
    return f"""
        healthCheckTimeout: 20
        models:
          a:
            cmd: {fake_cmd("a", events)}
            ttl: {TTL_S}
          b:
            cmd: {fake_cmd("b", events)}
          c:
            cmd: {fake_cmd("c", events)}
        groups:
          pair:
            swap: false
            members: [a, b]
          alone:
            members: [c]
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{swapAffinityBonus: 0}}
    """


def process_id(completion_id: str) -> str:
    """The fake model's completion ids are `cmpl-<its pid>-<clock>`."""
    return completion_id.split("-")[1]


def running(served) -> list[str]:
    return [m["model"] for m in httpx.get(served.base + "/running").json()["running"]]


def waiting_request(served, model: str, priority: int) -> socket.socket:
    """A chat request sent on a raw socket, so that closing the socket is its client leaving."""
    body = json.dumps({"model": model, "messages": [], "fake": {"tokens": 1, "tps": 0}}).encode()
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"X-LlamaSwap-Priority: {priority}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    return sock


def test_a_loaded_model_with_a_request_held_back_for_it_outlives_its_ttl_and_serves_it_without_reloading(
    tmp_path, rows
):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        first = HeldRequest(served, "a", tokens=1, tps=0, request_id="a1").result()
        assert first.status_code == 200
        busy_b = HeldStream(served, "b", tokens=100_000, tps=20, request_id="b1")  # b runs beside a
        # c must stop a and b, and waits for b's job; a request for a scores lower, so it may not start new
        # work on a, which c's start will stop: a is loaded, idle, and has a request waiting for it.
        urgent_c = waiting_request(served, "c", priority=10)
        wait_until(lambda: rows(served.data_dir, "model='c' AND state='queued'"), what="c's request to queue")
        held_back = HeldRequest(served, "a", tokens=3, tps=0, request_id="a2")
        wait_until(lambda: rows(served.data_dir, "model='a' AND state='queued'"), what="a's request to queue")

        # Three TTLs pass with a idle: it stays loaded for the request that waits for it.
        until = time.monotonic() + 3 * TTL_S
        while time.monotonic() < until:
            assert "a" in running(served), "a's TTL unloaded it while a request waited for it"
            time.sleep(0.05)

        urgent_c.close()  # c's client leaves: nothing holds the request for a back any more
        answer = held_back.result()
        assert answer.status_code == 200
        assert process_id(answer.json()["id"]) == process_id(first.json()["id"]), "a was loaded again"
        assert served.log().count("model 'a' starting") == 1
        wait_until(lambda: [r["state"] for r in rows(served.data_dir, "model='c'")] == ["cancelled"],
                   what="c's row to end as its client left")

        # Idle at last, with nothing waiting: now the TTL unloads it.
        wait_until(lambda: "a" not in running(served), what="a's TTL to unload it once idle")
        busy_b.close()
        served.check_settled("b")
