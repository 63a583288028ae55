"""`/logs/stream` on a front end: the model processes run on the worker, and the front end streams
their logs by asking the worker for what is new for as long as its client stays."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.test_distributed import config_text, distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, wait_until

pytestmark = pytest.mark.e2e

ARRIVAL_S = 30  # a model start included
REQUEST_LINE = '"POST /v1/chat/completions HTTP/1.1" 200'


class LogStream:
    """A client of a `/logs/stream` route; the test reads what has come so far."""

    def __init__(self, served: Served, path: str) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=ARRIVAL_S))
        self._stream = self._client.stream("GET", served.base + path)
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._pieces = self.response.iter_text()
        self.text = ""

    def read_until(self, wanted: str, after: int = 0) -> None:
        """Read until `wanted` has arrived, past the first `after` characters (each read waits at
        most ARRIVAL_S for text)."""

        def arrived() -> bool:
            self.text += next(self._pieces)
            return wanted in self.text[after:]

        if wanted not in self.text[after:]:
            wait_until(arrived, ARRIVAL_S, 0, repr(wanted))

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


def front_end(tmp_path, text: str, env: dict) -> Served:
    (tmp_path / "fe").mkdir()
    return Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")})


def chat(served: Served, model: str) -> None:
    answer = httpx.post(served.base + "/v1/chat/completions", timeout=60,
                        json={"model": model, "messages": [], "fake": {"tokens": 2}})
    assert answer.status_code == 200, answer.text


def wait_for_quiet_asks(monitor, db: int) -> None:
    """Until the wire has carried no `LogsSince` question for a second: the front end stopped asking.

    The front end's heartbeats keep commands coming, so each read returns within about a second."""
    last_ask = time.monotonic()

    def quiet() -> bool:
        nonlocal last_ask
        command = monitor.next_command()
        if command["db"] == db and "LogsSince" in command["command"]:
            last_ask = time.monotonic()
        return time.monotonic() - last_ask > 1.0

    wait_until(quiet, 15, 0, "the front end to stop asking the worker for logs")


def test_a_front_end_streams_the_workers_logs_until_its_client_leaves(tmp_path, distributed):
    redis = pytest.importorskip("redis")
    env, _ = distributed
    text = config_text(tmp_path / "events.jsonl")
    with Worker(tmp_path / "worker", text, env), front_end(tmp_path, text, env) as served:
        chat(served, "chat")
        everything = LogStream(served, "/logs/stream")
        everything.read_until("fakemodel chat listening")  # the history
        chat(served, "coder")
        everything.read_until("fakemodel coder listening")  # live

        coder = LogStream(served, "/logs/stream/coder?no-history")
        chat(served, "coder")
        coder.read_until(REQUEST_LINE)
        assert "listening" not in coder.text  # neither coder's history nor chat's log

        unknown = httpx.get(served.base + "/logs/stream/nosuch", timeout=10)
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_log"

        connection = redis.Redis.from_url(env["REDIS_URL"])
        db = connection.connection_pool.connection_kwargs["db"]
        with connection.monitor() as monitor:
            wait_until(lambda: (c := monitor.next_command())["db"] == db and "LogsSince" in c["command"],
                       10, 0, "the front end to ask the worker for logs")
            everything.close()
            coder.close()
            wait_for_quiet_asks(monitor, db)
        chat(served, "chat")  # the worker keeps serving
        assert REQUEST_LINE in httpx.get(served.base + "/logs", timeout=10).text


def test_the_stream_says_when_the_worker_does_not_answer_and_resumes_with_a_new_one(tmp_path, distributed):
    env, _ = distributed
    text = config_text(tmp_path / "events.jsonl")
    first_worker = Worker(tmp_path / "worker", text, env)
    with first_worker, front_end(tmp_path, text, env) as served:  # the worker first: it migrates the database
        stream = LogStream(served, "/logs/stream")
        chat(served, "chat")
        stream.read_until(REQUEST_LINE)
        first_worker.__exit__(None, None, None)  # the worker goes away under the stream
        stream.read_until("llamaswap: the scheduler worker did not answer 'LogsSince'")
        with Worker(tmp_path / "second-worker", text, env):
            stream.read_until("llamaswap: the scheduler worker answers again\n")
            answered_again = len(stream.text)
            chat(served, "chat")
            # The new worker's log, from its start.
            stream.read_until("fakemodel chat listening", after=answered_again)
            stream.read_until(REQUEST_LINE, after=answered_again)
            stream.close()
