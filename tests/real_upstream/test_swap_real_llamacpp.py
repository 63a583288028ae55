"""Real llama.cpp servers behind the proxy: proof it works against an upstream we did not write —
swapping between two models, and one model with two slots serving two streams at once.

Needs the `real-upstream` extra (`pip install -e '.[real-upstream]'`). Without it the test is
skipped with the reason (a failure under CI=true, see tests/conftest.py).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Event

import httpx
import openai
import pytest

from tests.e2e.conftest import db_rows
from tests.served import Served, model_ports, wait_until


def require_real_upstream() -> None:
    """Skip, naming what to install, when the extra is missing."""
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401
        import xllamacpp  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"real llama.cpp upstream unavailable: {exc.name} is not installed — "
                    "run: pip install -e '.[real-upstream]'")


pytestmark = pytest.mark.e2e

LAUNCHER = Path(__file__).with_name("llama_server.py")
MAX_TOKENS = 6
PROMPT = [{"role": "user", "content": "Name a few things."}]


class RecordingTransport(httpx.BaseTransport):
    """Keeps the raw bytes of every response body, to check what the openai client does not expose."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        body = bytearray()
        self.bodies.append(body)
        upstream = response.stream

        class Recorded(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in upstream:
                    body.extend(chunk)
                    yield chunk

            def close(self) -> None:
                upstream.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Recorded(),
                              extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def served(tmp_path):
    require_real_upstream()
    from tests.real_upstream.tiny_gguf import write_tiny_gguf  # needs the extra's gguf and numpy

    models = {name: write_tiny_gguf(tmp_path / f"{name}.gguf", seed=seed) for name, seed in (("tiny-a", 1), ("tiny-b", 2))}
    entries = "".join(
        f"""
          {name}:
            cmd: {sys.executable} {LAUNCHER} -m {path} --port ${{PORT}} -a {name}
            proxy: http://127.0.0.1:${{PORT}}"""
        for name, path in models.items()
    )
    config = f"""
        healthCheckTimeout: 30
        startPort: {model_ports(2)}
        models:{entries}
        routing:
          router:
            use: group
            settings:
              groups:
                tiny:
                  swap: true
                  exclusive: true
                  members: [tiny-a, tiny-b]
          scheduler:
            use: serial
    """
    with Served(tmp_path, config) as s:
        yield s


def stream_reply(client: openai.OpenAI, transport: RecordingTransport, model: str) -> str:
    """Stream one greedy completion; check it ends the way llama.cpp ends streams; return its text."""
    chunks = list(client.chat.completions.create(
        model=model, messages=PROMPT, stream=True, temperature=0, max_tokens=MAX_TOKENS))
    finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    assert finishes == ["length"], f"{model}: the stream should end with one finish_reason, got {finishes}"
    assert "timings" in (chunks[-1].model_extra or {}), f"{model}: llama.cpp's final chunk lost its timings"
    raw = bytes(transport.bodies[-1]).rstrip()
    assert raw.endswith(b"data: [DONE]"), f"{model}: stream did not end with data: [DONE]: ...{raw[-200:]!r}"
    return "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)


def running_models(served: Served) -> list[tuple[str, str]]:
    return [(m["model"], m["state"]) for m in httpx.get(served.base + "/running").json()["running"]]


def test_swapping_a_b_a_streams_real_llamacpp_replies_and_records_its_timings(served):
    transport = RecordingTransport()
    client = openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=transport, timeout=60))
    from tests.real_upstream.tiny_gguf import word_list

    vocabulary = set(word_list())
    replies = []
    for model in ("tiny-a", "tiny-b", "tiny-a"):
        text = stream_reply(client, transport, model)
        assert text.split() and set(text.split()) <= vocabulary, f"{model} replied {text!r}"
        assert len(text.split()) == MAX_TOKENS, f"{model}: every generated token should arrive, got {text!r}"
        assert running_models(served) == [(model, "ready")]
        replies.append(text)
    first_a, b, second_a = replies
    assert first_a == second_a, "greedy decoding of a reloaded model should repeat itself"
    assert b != first_a, "tiny-b is a different model and should answer differently"

    rows = wait_until(lambda: (r := db_rows(served.data_dir, "state='completed'")) and len(r) == 3 and r,
                      timeout=10, what="three completed request rows")
    assert [r["model"] for r in rows] == ["tiny-a", "tiny-b", "tiny-a"]
    assert [r["needed_swap"] for r in rows] == [1, 1, 1]
    assert all(r["stream"] == 1 and r["status_code"] == 200 and r["scheduler"] == "serial" for r in rows)
    # A stream without include_usage carries no `usage`: these come from llama.cpp's `timings` only.
    assert [r["output_tokens"] for r in rows] == [MAX_TOKENS] * 3
    assert all(r["input_tokens"] > 0 and r["tokens_per_second"] > 0 and r["prompt_per_second"] > 0 for r in rows)
    assert [r["cache_tokens"] for r in rows] == [0, 0, 0], "each request ran on a freshly loaded model"


# Two slots: the long stream lasts long enough that the short one, sent after the long one's first
# chunk, would start only after the long one's end if they were served one at a time.
LONG_TOKENS = 2000
SLOT_CONTEXT = 16384  # room for a long stream in each slot however llama.cpp splits the context


@pytest.fixture
def served_two_slots(tmp_path):
    require_real_upstream()
    from tests.real_upstream.tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=1, context_length=SLOT_CONTEXT)
    config = f"""
        healthCheckTimeout: 30
        startPort: {model_ports(1)}
        models:
          tiny:
            cmd: {sys.executable} {LAUNCHER} -m {path} --port ${{PORT}} -a tiny -np 2 -c {SLOT_CONTEXT}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
            settings:
              serial:
                slots: {{tiny: 2}}
    """
    with Served(tmp_path, config) as s:
        yield s


def timed_stream(base: str, max_tokens: int, first_chunk: Event | None = None) -> dict:
    """Stream one greedy completion; returns its text, finish reasons and when its first chunk and
    its `[DONE]` arrived (monotonic seconds), read as they come so neither is late by buffering."""
    body = {"model": "tiny", "messages": PROMPT, "stream": True, "temperature": 0, "max_tokens": max_tokens}
    text, finishes, first, done = [], [], None, None
    with httpx.Client(timeout=120) as client, \
            client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if first is None:
                first = time.monotonic()
                if first_chunk is not None:
                    first_chunk.set()
            if line == "data: [DONE]":
                done = time.monotonic()
                continue
            for choice in json.loads(line[len("data: "):]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
                if choice.get("finish_reason"):
                    finishes.append(choice["finish_reason"])
    return {"text": "".join(text), "finishes": finishes, "first": first, "done": done}


def test_a_model_with_two_slots_streams_two_real_llamacpp_replies_at_once(served_two_slots):
    served = served_two_slots
    long_started = Event()
    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(timed_stream, served.base, LONG_TOKENS, long_started)
        assert long_started.wait(60), "the long stream sent no chunk"
        short = pool.submit(timed_stream, served.base, MAX_TOKENS).result()
        long = long.result()

    assert short["first"] < long["done"], (
        f"the second stream's first chunk came {short['first'] - long['done']:.3f} s after the first stream ended: "
        "the two requests were served one after the other")
    for reply, tokens in ((long, LONG_TOKENS), (short, MAX_TOKENS)):
        assert reply["finishes"] == ["length"] and len(reply["text"].split()) == tokens, (
            f"every one of {tokens} tokens should arrive, then one finish_reason: got "
            f"{len(reply['text'].split())} words and {reply['finishes']}")

    rows = wait_until(lambda: (r := db_rows(served.data_dir, "state='completed'")) and len(r) == 2 and r,
                      timeout=10, what="two completed request rows")
    assert [r["needed_swap"] for r in rows] == [1, 0], "the first request loads the model, the second joins it"
    assert sorted(r["slot"] for r in rows) == [1, 2], "the two requests ran on the model's two slots"
    assert [r["output_tokens"] for r in rows] == [LONG_TOKENS, MAX_TOKENS]
