"""API key quotas end to end: keys made by `llamaswap keys create --rpm/--tpm/--concurrency` against a running
`llamaswap serve` — 429 with Retry-After over rpm and tpm, a request over concurrency waiting (never 429) while
other keys' requests go on — and with two front ends over Redis, limits that hold in total."""

from __future__ import annotations

import contextlib
import sqlite3
import textwrap
import threading

import httpx
import pytest
from openai import OpenAI, RateLimitError

from tests.e2e.test_api_keys import CHAT, auth, chat, keys, new_key
from tests.e2e.test_distributed import distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import Served, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

WAITS = "a request of the API key '{}' waits for one of its 1 places at once (concurrency)"


class Held:
    """A streaming chat request of a key: the model is busy with it until it has sent `tokens` tokens."""

    def __init__(self, served: Served, secret: str, request_id: str, *, tokens: int = 400, tps: float = 20,
                 model: str = "chat"):
        self._client = httpx.Client(timeout=60)
        self._stream = self._client.stream("POST", served.base + CHAT, headers=auth(secret), json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": tokens, "tps": tps, "id": request_id}})
        self.response = self._stream.__enter__()
        assert self.response.status_code == 200, self.response.read()
        self._lines = self.response.iter_lines()  # kept: a dropped iterator closes the stream
        next(line for line in self._lines if line.startswith("data: "))  # the model is answering

    def rest(self) -> list[str]:
        """The answer's remaining lines, read to its end."""
        return [line for line in self._lines if line]

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


class Later:
    """A chat request of a key sent on a thread; `result()` waits for its answer."""

    def __init__(self, served: Served, secret: str, request_id: str, model: str = "chat") -> None:
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._send, args=(served, secret, request_id, model), daemon=True)
        self._thread.start()

    def _send(self, served: Served, secret: str, request_id: str, model: str) -> None:
        self.response = httpx.post(served.base + CHAT, headers=auth(secret), timeout=60, json={
            "model": model, "messages": [{"role": "user", "content": "hi"}], "fake": {"tokens": 2, "id": request_id}})

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
          like-vllm: {{cmd: "{fake_cmd('like-vllm', None, '--usage-when-asked', '--tps', '0')}"}}
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


def refused_soon(served: Served, model: str, secret: str) -> None:
    """The key's next request is refused over tpm within 2 s. Each request admitted meanwhile spends its own few
    tokens (about 3), so at most 8 tries: together they stay under the smallest margin these tests leave (30)."""
    wait_until(lambda: chat(served, model, secret).status_code == 429, 2.0, 0.25, "the tokens to count")


def test_over_tpm_the_tokens_a_stream_reported_refuse_the_next_request(served):
    secret = new_key(served, "few-tokens", "--tpm", "30")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 2.0, 0.05, "the key to count")
    with httpx.stream("POST", served.base + CHAT, headers=auth(secret), timeout=30, json={
            "model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": 40}}) as stream:
        assert stream.status_code == 200
        assert '"usage"' in stream.read().decode()
    refused_soon(served, "chat", secret)
    refused = chat(served, "chat", secret)
    assert 50 <= int(refused.headers["Retry-After"]) <= 60
    assert "'few-tokens' is over its limit of 30 tokens per minute (tpm)" in refused.json()["error"]["message"]


def streamed(served: Served, secret: str, model: str) -> str:
    with httpx.stream("POST", served.base + CHAT, headers=auth(secret), timeout=30, json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": 40}}) as stream:
        assert stream.status_code == 200
        return stream.read().decode()


def test_a_tpm_key_streaming_from_a_model_that_reports_usage_only_when_asked_is_still_counted(served):
    """OpenAI's and vLLM's streams carry no usage unless `stream_options.include_usage` asks: for a key with a
    tpm quota the body asks, so leaving it out does not make the tokens free."""
    secret, free = new_key(served, "vllm-tokens", "--tpm", "30"), new_key(served, "vllm-free")
    wait_until(lambda: chat(served, "like-vllm", secret).status_code == 200, 5.0, 0.05, "the key to count")
    assert '"usage"' not in streamed(served, free, "like-vllm")  # no tpm: the body goes as sent, no usage chunk
    assert '"completion_tokens": 40' in streamed(served, secret, "like-vllm")  # asked for the key's quota
    refused_soon(served, "like-vllm", secret)


@pytest.mark.parametrize("stream", [1, "true", "Yes"])
def test_a_stream_asked_for_loosely_is_asked_for_its_usage_too(served, stream):
    """vLLM reads `stream` as Pydantic does: 1 and "true" stream as true does, so they are asked for usage too."""
    secret = new_key(served, f"loose-{str(stream).lower()}", "--tpm", "30")
    wait_until(lambda: chat(served, "like-vllm", secret).status_code == 200, 5.0, 0.05, "the key to count")
    with httpx.stream("POST", served.base + CHAT, headers=auth(secret), timeout=30, json={
            "model": "like-vllm", "stream": stream, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": 40}}) as answer:
        assert answer.status_code == 200 and '"completion_tokens": 40' in answer.read().decode()
    refused_soon(served, "like-vllm", secret)


def test_a_stream_through_upstream_is_asked_for_its_usage(served):
    secret = new_key(served, "upstream-tokens", "--tpm", "30")
    wait_until(lambda: chat(served, "like-vllm", secret).status_code == 200, 5.0, 0.05, "the key to count")
    with httpx.stream("POST", served.base + "/upstream/like-vllm/v1/chat/completions", headers=auth(secret),
                      timeout=30, json={"model": "like-vllm", "stream": True, "fake": {"tokens": 40},
                                        "messages": [{"role": "user", "content": "hi"}]}) as answer:
        assert answer.status_code == 200 and '"completion_tokens": 40' in answer.read().decode()
    refused_soon(served, "like-vllm", secret)


def test_a_client_that_hangs_up_before_the_usage_is_counted_by_estimate(served):
    """The usage comes last: leaving just before it must not make the tokens free. Counted: a quarter of the
    body's bytes for the prompt (about 35 here) and one token per event relayed (80 read, so at least 80)."""
    secret = new_key(served, "hangs-up", "--tpm", "100")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 5.0, 0.05, "the key to count")
    with httpx.stream("POST", served.base + CHAT, headers=auth(secret), timeout=30, json={
            "model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"tokens": 400, "tps": 200}}) as answer:
        events = (line for line in answer.iter_lines() if line.startswith("data: "))
        assert len([next(events) for _ in range(80)]) == 80
    refused_soon(served, "chat", secret)


def test_a_tpm_key_whose_answer_reports_no_usage_is_logged_once(served):
    secret = new_key(served, "blind-tokens", "--tpm", "1000")
    warning = "an answer to the API key 'blind-tokens' reported no token usage"

    def rerank() -> int:  # the fake model echoes what reached it: no usage
        return httpx.post(served.base + "/v1/rerank", headers=auth(secret), timeout=30,
                          json={"model": "chat", "query": "q", "documents": ["d"]}).status_code

    wait_until(lambda: rerank() == 200, 5.0, 0.05, "the key to count")
    wait_until(lambda: warning in served.log(), 5.0, 0.05, "the warning")
    assert rerank() == 200
    assert served.log().count(warning) == 1


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


def test_a_raised_concurrency_lets_the_keys_waiting_request_go_on_within_two_seconds(served):
    secret = new_key(served, "raised", "--concurrency", "1")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 2.0, 0.05, "the key to count")
    held = Held(served, secret, "held-before-raise")  # 20 s of answer: it holds the one place throughout
    try:
        waiting = Later(served, secret, "waiting-for-raise")
        wait_until(lambda: WAITS.format("raised") in served.log(), 10, 0.05, "the second request to wait")
        with contextlib.closing(sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=20)) as db, db:
            db.execute("UPDATE scheduling_apikey SET concurrency = 2 WHERE name = ?", ("raised",))
        wait_until(waiting.done, 2.0, 0.05, "the waiting request to go on under the raised limit")
        assert waiting.result().status_code == 200
    finally:
        held.close()


def test_limits_hold_in_total_over_two_front_ends(tmp_path, distributed):  # noqa: F811
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    with two_front_ends(tmp_path, text, env) as (first, second):
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


def test_a_keys_refusals_at_the_door_are_counted_for_its_usage_page(served):
    secret = new_key(served, "refused-often", "--rpm", "1", "--models", "chat")
    wait_until(lambda: chat(served, "chat", secret).status_code == 200, 5.0, 0.05, "the key to count")
    assert [chat(served, "chat", secret).status_code for _ in range(3)] == [429] * 3
    assert chat(served, "like-vllm", secret).status_code == 403  # outside its models

    def counted() -> dict[int, int]:
        with contextlib.closing(sqlite3.connect(f"file:{served.data_dir / 'llamaswap.sqlite3'}?mode=ro", uri=True)) as db:
            return dict(db.execute("SELECT status, SUM(count) FROM scheduling_keyrefusals WHERE api_key = ?"
                                   " GROUP BY status", ("refused-often",)).fetchall())

    wait_until(lambda: counted() == {429: 3, 403: 1}, 5.0, 0.1, "the refusals to be written")
