"""The caller sees its wait: `sendLoadingState` streams the queue position and predicted wait as
reasoning before the answer, and every proxied response names its request and how long it waited."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import openai
import pytest

from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, fake_cmd

pytestmark = pytest.mark.e2e

ANSWER_TOKENS = 5


def config(tmp, send_loading_state: bool, *, model_override: str = "") -> str:
    events = tmp / "events.jsonl"
    return f"""
        healthCheckTimeout: 20
        sendLoadingState: {str(send_loading_state).lower()}
        models:
          alpha:
            cmd: {fake_cmd("alpha", events, "--tps", "200")}
            proxy: http://127.0.0.1:${{PORT}}
            {model_override}
          beta:
            cmd: {fake_cmd("beta", events, "--tps", "200", "--load-delay", "1")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(served, model: str, **extra):
    return client(served).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=ANSWER_TOKENS, **extra
    )


@contextmanager
def batch_job(served, seconds: float = 3.0):
    """A batch stream on alpha that holds the GPU for about `seconds`, once alpha's history says how
    long its jobs take; the block runs while it holds it."""
    body = {"model": "alpha", "stream": True, "messages": [],
            "fake": {"tokens": int(seconds * 10), "tps": 10, "id": "batch"}}
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=body,
                      headers={"X-LlamaSwap-Priority": "batch"}, timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()
        assert next(lines).startswith("data:")
        yield
        for _ in lines:
            pass


def reasoning_and_content(chunks) -> tuple[list[str], str]:
    reasoning = [c.choices[0].delta.model_extra.get("reasoning_content") for c in chunks if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return [r for r in reasoning if r], content


def test_a_queued_streaming_chat_is_told_its_place_and_wait_then_gets_exactly_the_answer(tmp_path):
    with Served(tmp_path, config(tmp_path, True)) as served:
        # History: one job of alpha (about as long as the batch job below), one load of beta.
        list(ask(served, "alpha", stream=True, extra_body={"fake": {"tokens": 30, "tps": 10}}))
        ask(served, "beta")
        expected = ask(served, "alpha").choices[0].message.content
        with batch_job(served):
            chunks = []
            streamed = client(served).chat.completions.with_raw_response.create(
                model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=ANSWER_TOKENS, stream=True,
                extra_headers={"X-LlamaSwap-Priority": "interactive"},
            )
            request_id = streamed.headers.get("x-llamaswap-request-id")
            chunks = list(streamed.parse())
        reasoning, content = reasoning_and_content(chunks)
        assert content == expected
        assert reasoning[0].startswith("Waiting for alpha")
        assert any(line.startswith("next in the queue; ~") and "a batch job on alpha ends in ~" in line
                   for line in reasoning), reasoning
        assert reasoning[-1].startswith("Done! Sent to alpha after ")
        first_answer = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content)
        assert all(not (c.choices and c.choices[0].delta.model_extra.get("reasoning_content"))
                   for c in chunks[first_answer:]), "nothing but the answer after it began"
        assert request_id and int(request_id) > 0


def test_loading_a_model_is_shown_and_a_request_granted_at_once_sees_nothing_extra(tmp_path):
    with Served(tmp_path, config(tmp_path, True)) as served:
        ask(served, "beta")  # beta's load time is on record now
        ask(served, "alpha")  # and alpha is loaded
        reasoning, _ = reasoning_and_content(list(ask(served, "beta", stream=True)))
        assert any(line.startswith("loading beta, ~") for line in reasoning), reasoning
        reasoning, content = reasoning_and_content(list(ask(served, "beta", stream=True)))
        assert reasoning == [] and content


def test_with_send_loading_state_off_nothing_extra_is_streamed(tmp_path):
    with Served(tmp_path, config(tmp_path, False)) as served:
        ask(served, "alpha")
        with batch_job(served, 2.0):
            reasoning, content = reasoning_and_content(list(ask(served, "alpha", stream=True)))
        assert reasoning == [] and content


def test_a_model_can_turn_it_off_and_non_streaming_requests_are_never_altered(tmp_path):
    with Served(tmp_path, config(tmp_path, True, model_override="sendLoadingState: false")) as served:
        ask(served, "beta")
        reasoning, _ = reasoning_and_content(list(ask(served, "alpha", stream=True)))
        assert reasoning == []
        reply = ask(served, "beta")  # beta loads first, sendLoadingState on
        assert reply.choices[0].message.content and not reply.choices[0].message.model_extra.get("reasoning_content")


def test_every_proxied_response_names_its_request_and_its_wait(tmp_path):
    with Served(tmp_path, config(tmp_path, False)) as served:
        first = httpx.post(served.base + "/v1/chat/completions", json={"model": "beta", "messages": []}, timeout=60)
        second = httpx.post(served.base + "/v1/chat/completions", json={"model": "beta", "messages": []}, timeout=60)
        for reply in (first, second):
            assert reply.status_code == 200
            assert int(reply.headers["x-llamaswap-request-id"]) > 0
            assert int(reply.headers["x-llamaswap-queue-wait-ms"]) >= 0
        assert int(second.headers["x-llamaswap-request-id"]) > int(first.headers["x-llamaswap-request-id"])
        assert int(first.headers["x-llamaswap-queue-wait-ms"]) >= 1000, "its wait included beta's 1 s load"


def test_a_front_end_streams_the_wait_it_learns_from_the_worker(tmp_path, distributed):
    env, _ = distributed
    text = config(tmp_path, True)
    with Worker(tmp_path / "worker", text, env):
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            list(ask(front, "alpha", stream=True, extra_body={"fake": {"tokens": 30, "tps": 10}}))
            with batch_job(front):
                streamed = client(front).chat.completions.with_raw_response.create(
                    model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=ANSWER_TOKENS,
                    stream=True, extra_headers={"X-LlamaSwap-Priority": "interactive"},
                )
                chunks = list(streamed.parse())
            reasoning, content = reasoning_and_content(chunks)
            assert content and any(line.startswith("next in the queue; ~") for line in reasoning), reasoning
            assert int(streamed.headers["x-llamaswap-request-id"]) > 0
            plain = httpx.post(front.base + "/v1/chat/completions", json={"model": "alpha", "messages": []}, timeout=60)
            assert int(plain.headers["x-llamaswap-request-id"]) > 0 and "x-llamaswap-queue-wait-ms" in plain.headers


def sse_events(served, model: str, **fake) -> list[dict]:
    """The data of every SSE event of a streaming chat request, read raw."""
    body = {"model": model, "stream": True, "messages": [], "max_tokens": ANSWER_TOKENS}
    if fake:
        body["fake"] = fake
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=body, timeout=60) as reply:
        assert reply.status_code == 200
        data = [line[len("data: "):] for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_a_model_that_answers_with_an_error_after_the_wait_was_streamed_ends_the_stream_with_it(tmp_path):
    with Served(tmp_path, config(tmp_path, True)) as served:
        events = sse_events(served, "beta", status=500)  # beta loads for a second first
        assert events[0]["choices"][0]["delta"]["reasoning_content"].startswith("Waiting for beta")
        assert events[-1]["error"]["code"] == "upstream_error" and "beta" in events[-1]["error"]["message"]
        answer = [e["choices"][0]["delta"].get("content") for e in sse_events(served, "beta") if e.get("choices")]
        assert any(answer), "and the next request is served"


def test_a_start_that_fails_after_the_wait_was_streamed_ends_the_stream_with_the_reason(tmp_path):
    broken = config(tmp_path, True).replace("healthCheckTimeout: 20", "healthCheckTimeout: 1").replace(
        '"--load-delay", "1"', '"--hang-at-start"'
    ).replace("--load-delay 1", "--hang-at-start")
    with Served(tmp_path, broken) as served:
        events = sse_events(served, "beta")
        assert events[0]["choices"][0]["delta"]["reasoning_content"].startswith("Waiting for beta")
        error = events[-1]["error"]
        assert error["type"] == "server_error" and "beta" in error["message"], error
