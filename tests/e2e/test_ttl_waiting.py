"""A loaded model that a request is queued for is not idle: its TTL does not unload it while the request
waits behind another model's job, and the request is served without loading the model again."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.held import HeldRequest, HeldStream
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

B_JOB_TOKENS, B_JOB_TPS = 60, 20  # b's job takes 3 s, three times a's TTL


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          a:
            cmd: {fake_cmd("a", events)}
            ttl: 1
          b:
            cmd: {fake_cmd("b", events)}
        groups:
          gpu:
            swap: false
            members: [a, b]
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{swapAffinityBonus: 0}}
    """


def process_id(completion_id: str) -> str:
    """The fake model's completion ids are `cmpl-<its pid>-<clock>`."""
    return completion_id.split("-")[1]


def test_a_model_with_a_queued_request_outlives_its_ttl_and_serves_it_without_reloading(tmp_path, rows):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        held = HeldStream(served, "a", tokens=100_000, tps=20, request_id="a1")
        b_job = HeldRequest(served, "b", tokens=B_JOB_TOKENS, tps=B_JOB_TPS, request_id="b1")
        wait_until(lambda: len(rows(served.data_dir, "state='queued'")) == 1, what="b's request to queue")
        a_again = HeldRequest(served, "a", tokens=3, tps=0, request_id="a2")
        wait_until(lambda: len(rows(served.data_dir, "state='queued'")) == 2, what="a's second request to queue")

        held.close()  # b goes next (it arrived first); a stays loaded beside it, idle, with a2 waiting
        assert b_job.result().status_code == 200
        answer = a_again.result()
        assert answer.status_code == 200
        assert process_id(answer.json()["id"]) == process_id(held.chunks()[0]["id"]), "a was loaded again"
        assert served.log().count("model 'a' starting") == 1

        # Idle at last, with nothing waiting: now the TTL unloads it.
        wait_until(lambda: "a" not in [m["model"] for m in httpx.get(served.base + "/running").json()["running"]],
                   what="a's TTL to unload it once idle")
        served.check_settled("b")
