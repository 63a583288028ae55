"""A worker killed with kill -9 while a front end relays a stream, with real processes: the stream's bytes
go front end ← model directly, so the client gets all of it, and the row the next worker found
`interrupted` says how it really ended once the front end reports it."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import pytest

from tests.e2e.held import HeldStream
from tests.e2e.test_distributed import distributed  # noqa: F401 (fixture)
from tests.served import Served, Worker, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

TOKENS, TPS = 40, 20  # a two-second stream


def test_a_stream_that_outlived_its_worker_is_recorded_completed_with_its_tokens(tmp_path, distributed):
    env, _ = distributed
    text = (f"startPort: {model_ports(2)}\nrouting:\n  scheduler:\n    use: serial\nmodels:\n"
            f'  chat: {{cmd: "{fake_cmd("chat", tmp_path / "events.jsonl")}"}}\n')
    (tmp_path / "fe").mkdir()
    worker = Worker(tmp_path / "worker", text, env).__enter__()
    try:
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as served:
            served.check_settled("chat")  # the model is up
            stream = HeldStream(served, "chat", tokens=TOKENS, tps=TPS, request_id="outlived")
            wait_until(lambda: len(served.rows()) == 2, 10, 0.02, "the stream's row to be written")
            os.kill(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait(10)
            payloads = stream.read_to_end()
            assert payloads[-1] == "[DONE]" and len(stream.text().split()) == TOKENS, "the client got the whole stream"
            assert json.loads(payloads[-2])["usage"]["completion_tokens"] == TOKENS
            _recorded_by_the_next_worker(tmp_path, text, env, served)
    finally:
        worker.__exit__(None, None, None)


def _recorded_by_the_next_worker(tmp_path, text: str, env: dict, served: Served) -> None:
    with Worker(tmp_path / "next-worker", text, env):  # finds the row dispatched, and the front end's report
        row = wait_until(lambda: next((r for r in served.rows()[1:] if r["state"] != "interrupted"), None),
                         30, 0.1, "the stream's row to say how it ended")
        assert (row["state"], row["status_code"], row["output_tokens"], row["error"]) == (
            "completed", 200, TOKENS, ""), row
        assert timedelta(seconds=TOKENS / TPS * 0.8) < row["finished_at"] - row["dispatched_at"] < timedelta(seconds=10)
        assert row["dispatched_at"] < row["first_byte_at"] < row["finished_at"]
        assert abs(row["duration_ms"] / 1000 - (row["finished_at"] - row["dispatched_at"]).total_seconds()) < 0.5
        served.check_settled("chat")
