"""API key quotas end to end: keys made by `llamaswap keys create --rpm/--tpm/--concurrency` against a running
`llamaswap serve` — 429 with Retry-After over rpm and tpm, a request over concurrency waiting (never 429) while
other keys' requests go on — and with two front ends over Redis, limits that hold in total."""

from __future__ import annotations

import textwrap
import threading

import httpx
import pytest
from openai import OpenAI, RateLimitError

from tests.e2e.test_api_keys import CHAT, auth, chat, keys, new_key
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

WAITS = "a request of the API key '{}' waits for one of its 1 places at once (concurrency)"


class Held:
    """A streaming chat request of a key: the model is busy with it until it has sent `tokens` tokens."""

    def __init__(self, served: Served, secret: str, request_id: str, *, tokens: int = 400, tps: float = 20):
        self._client = httpx.Client(timeout=60)
        self._stream = self._client.stream("POST", served.base + CHAT, headers=auth(secret), json={
            "model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": tokens, "tps": tps, "id": request_id}})
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._lines = self.response.iter_lines()  # kept: a dropped iterator closes the stream
        next(line for line in self._lines if line.startswith("data: "))  # the model is answering

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


class Later:
    """A chat request of a key sent on a thread; `result()` waits for its answer."""

    def __init__(self, served: Served, secret: str, request_id: str) -> None:
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._send, args=(served, secret, request_id), daemon=True)
        self._thread.start()

    def _send(self, served: Served, secret: str, request_id: str) -> None:
        self.response = httpx.post(served.base + CHAT, headers=auth(secret), timeout=60, json={
            "model": "chat", "messages": [{"role": "user", "content": "hi"}], "fake": {"tokens": 2, "id": request_id}})

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> httpx.Response:
        self._thread.join(60)
        assert self.response is not None, "no answer within 60 s"
        return self.response


def config_text(events, serial: str = "{slots: {chat: 4}}") -> str:
    """One chat model under the serial scheduler's `serial` settings (by default four slots: a key's waiting
    request waits for its key, not for the GPU)."""
    return textwrap.dedent(f"""
        startPort: {model_ports(1)}
        models:
          chat: {{cmd: "{fake_cmd('chat', events)}"}}
        routing:
          scheduler:
            use: serial
            settings: {{serial: {serial}}}
    """)


def started(events, request_id: str) -> bool:
    return any(e.get("event") == "start" and e.get("id") == request_id for e in read_events(events))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("key-quotas")
    events = tmp / "events.jsonl"
    with Served(tmp, config_text(events)) as s:
        s.events = events
        yield s


def test_over_rpm_a_key_gets_429_with_retry_after_and_other_keys_go_on(served):
    secret, other = new_key(served, "two-a-minute", "--rpm", "2"), new_key(served, "unlimited")
    wait_until(lambda: chat(served, "chat", None).status_code == 401, 2.0, 0.05, "the keys to count")
    assert [chat(served, "chat", secret).status_code for _ in range(2)] == [200, 200]
    refused = chat(served, "chat", secret)
    assert refused.status_code == 429
    assert 50 <= int(refused.headers["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
    assert "'two-a-minute' is over its limit of 2 requests per minute (rpm)" in error["message"]
    assert chat(served, "chat", other).status_code == 200
    client = OpenAI(base_url=served.base + "/v1", api_key=secret, max_retries=0)
    with pytest.raises(RateLimitError):  # what an OpenAI client makes of it
        client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert "rpm=2" in keys(served, "list")


def test_over_tpm_the_tokens_a_stream_reported_refuse_the_next_request(served):
    secret = new_key(served, "few-tokens", "--tpm", "30")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 2.0, 0.05, "the key to count")
    with httpx.stream("POST", served.base + CHAT, headers=auth(secret), timeout=30, json={
            "model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": 40}}) as stream:
        assert stream.status_code == 200
        assert '"usage"' in stream.read().decode()
    wait_until(lambda: chat(served, "chat", secret).status_code == 429, 5.0, 0.05, "the stream's tokens to count")
    refused = chat(served, "chat", secret)
    assert 50 <= int(refused.headers["Retry-After"]) <= 60
    assert "'few-tokens' is over its limit of 30 tokens per minute (tpm)" in refused.json()["error"]["message"]


def test_over_concurrency_a_request_waits_for_the_keys_own_not_429_and_not_holding_others_up(served):
    secret, other = new_key(served, "one-at-once", "--concurrency", "1"), new_key(served, "another")
    wait_until(lambda: chat(served, "chat", other).status_code == 200, 2.0, 0.05, "the keys to count")
    held = Held(served, secret, "held")
    try:
        waiting = Later(served, secret, "waiting")
        wait_until(lambda: WAITS.format("one-at-once") in served.log(), 10, 0.05, "the second request to wait")
        assert chat(served, "chat", other).status_code == 200  # another key's request is not held up
        assert not waiting.done() and not started(served.events, "waiting")
    finally:
        held.close()  # the held request ends: the waiting one goes on
    answer = waiting.result()
    assert answer.status_code == 200, answer.text
    assert started(served.events, "waiting")


def test_limits_hold_in_total_over_two_front_ends(tmp_path, distributed):  # noqa: F811
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    with Worker(tmp_path / "worker", text, env):
        front = []
        for name in ("fe1", "fe2"):
            (tmp_path / name).mkdir()
            front.append(Served(tmp_path / name, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")}))
        with front[0] as first, front[1] as second:
            rated = new_key(first, "three-a-minute", "--rpm", "3")
            single = new_key(first, "single", "--concurrency", "1")
            for fe in (first, second):
                wait_until(lambda: chat(fe, "chat", None).status_code == 401, 2.0, 0.02, f"{fe.base} to take the keys")
            answers = [chat(fe, "chat", rated).status_code for fe in (first, second, first, second)]
            assert answers == [200, 200, 200, 429]  # three in total, not three on each front end
            assert chat(first, "chat", rated).status_code == 429
            held = Held(first, single, "held-on-fe1")
            try:
                waiting = Later(second, single, "waiting-on-fe2")
                wait_until(lambda: WAITS.format("single") in second.log(), 10, 0.05, "fe2's request to wait")
                assert not waiting.done() and not started(events, "waiting-on-fe2")
            finally:
                held.close()
            assert waiting.result().status_code == 200
