"""Swapping between two real llama.cpp servers: proof the proxy works against an upstream we did not write.

Needs the `real-upstream` extra (`pip install -e '.[real-upstream]'`). Without it the test is
skipped with the reason (a failure under CI=true, see tests/conftest.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

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
