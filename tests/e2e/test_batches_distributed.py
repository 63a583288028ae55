"""Batches in distributed mode: two front ends sharing a files folder and one worker; whichever front end claims
the batch runs it, alone: each line reaches the model once and is in the output once."""

from __future__ import annotations

import json
import os
import signal

import openai
import pytest

from tests.e2e.test_distributed import config_text, distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import Served, Worker, read_events, wait_until

pytestmark = pytest.mark.e2e


def test_a_batch_uploaded_to_one_front_end_is_run_once_by_one_of_them(tmp_path, distributed):
    env, psycopg = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    shared = {**env, "LLAMASWAP_FILES_DIR": str(tmp_path / "files")}
    with two_front_ends(tmp_path, text, env, shared) as (first, second):
        one, two = (openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0) for s in (first, second))
        content = b"".join(json.dumps({
            "custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "chat", "messages": [], "fake": {"id": f"line-{n}", "tokens": 2, "delay": 0.05}},
        }).encode() + b"\n" for n in range(12))
        uploaded = one.files.create(file=("in.jsonl", content), purpose="batch")
        batch = two.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        done = wait_until(lambda: (b := one.batches.retrieve(batch.id)).status == "completed" and b, 60, 0.1,
                          "the batch to complete")
        output = [json.loads(line) for line in two.files.content(done.output_file_id).read().splitlines()]
    assert [line["custom_id"] for line in output] == [f"line-{n}" for n in range(12)]
    starts = [e["id"] for e in read_events(events) if e["event"] == "start"]
    assert sorted(starts) == sorted(f"line-{n}" for n in range(12))  # one runner: no line sent twice
    with psycopg.connect(env["DATABASE_URL"]) as connection:
        rows = connection.execute("SELECT count(*), min(priority), max(priority) FROM scheduling_queuedrequest "
                                  "WHERE client = 'batch' AND state = 'completed'").fetchone()
    assert rows == (12, -100, -100)


def test_a_batch_carries_on_when_its_worker_is_killed_and_a_standby_takes_over(tmp_path, distributed):
    """The line at the model when the worker dies runs again, once; none is lost, none is in the output twice."""
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    standby_env = {**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "standby-data")}  # as on another machine
    with Worker(tmp_path / "active", text, env) as active, \
            Worker(tmp_path / "standby", text, standby_env, ready="llamaswap worker standing by") as standby:
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            api = openai.OpenAI(base_url=front.base + "/v1", api_key="unused", max_retries=0)
            content = b"".join(json.dumps({
                "custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "chat", "messages": [], "fake": {"id": f"line-{n}", "tokens": 2,
                                                                   "delay": 3.0 if n == 2 else 0.2}},
            }).encode() + b"\n" for n in range(8))
            uploaded = api.files.create(file=("in.jsonl", content), purpose="batch")
            batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")

            def starts() -> list[str]:
                return [e["id"] for e in read_events(events) if e["event"] == "start"]

            wait_until(lambda: len(starts()) >= 3, 30, 0.02, "the third line to start: it takes 3 s")
            os.kill(active.proc.pid, signal.SIGKILL)
            wait_until(lambda: "llamaswap worker serving" in standby.log(), 60, 0.05, "the standby to take over")
            done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b, 90, 0.1,
                              "the batch to complete")
            output = [json.loads(line) for line in api.files.content(done.output_file_id).read().splitlines()]
    assert done.request_counts.model_dump() == {"total": 8, "completed": 8, "failed": 0}, done.error_file_id
    assert [line["custom_id"] for line in output] == [f"line-{n}" for n in range(8)]  # each once
    assert all(line["response"]["status_code"] == 200 for line in output)
    started = starts()
    assert sorted(started) == sorted([f"line-{n}" for n in range(8)] + ["line-2"]), started  # the cut one, once more
    assert "batch line line-2: " in front.log() and "it runs again" in front.log()
