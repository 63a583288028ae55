"""The matrix router end to end: real daphne, fake model servers started through `cmd:`; which
models a start stops is read back from GET /running."""

from __future__ import annotations

import httpx
import pytest

from tests.served import Served, fake_cmd, read_events

pytestmark = pytest.mark.e2e


def matrix_config(tmp, scheduler: str) -> str:
    events = tmp / "events.jsonl"
    models = "".join(
        f"""
          {model}:
            cmd: {fake_cmd(model, events)}
            proxy: http://127.0.0.1:${{PORT}}"""
        for model in ("llm-a", "llm-b", "tts", "embed", "big")
    )
    return f"""
        healthCheckTimeout: 20
        models:{models}
        routing:
          scheduler: {{use: {scheduler}}}
          router:
            use: matrix
            settings:
              matrix:
                vars: {{a: llm-a, b: llm-b}}
                evict_costs: {{tts: 5}}
                sets:
                  voice: "(a | b) & tts"
                  rag: "(a | b) & embed"
                  helpers: "tts & embed"
    """


def running(served) -> list[str]:
    return sorted(model["model"] for model in httpx.get(served.base + "/running", timeout=10).json()["running"])


def ask(served, model: str) -> None:
    reply = httpx.post(served.base + "/v1/embeddings", json={"model": model, "input": "x"}, timeout=30)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("scheduler", ["serial", "fifo"])
def test_a_start_evicts_the_cheapest_models_outside_its_set_and_keeps_its_set_mates(tmp_path, scheduler):
    with Served(tmp_path, matrix_config(tmp_path, scheduler)) as served:
        ask(served, "llm-a")
        ask(served, "tts")
        assert running(served) == ["llm-a", "tts"]  # one set holds both: nothing stopped

        ask(served, "llm-b")
        assert running(served) == ["llm-b", "tts"]  # voice keeps tts (cost 5) and drops llm-a (cost 1)

        ask(served, "embed")
        assert running(served) == ["embed", "tts"]  # helpers drops llm-b (1); rag would drop tts (5)

        ask(served, "big")
        assert running(served) == ["big"]  # in no set: runs alone

        starts = [event["model"] for event in read_events(tmp_path / "events.jsonl") if event["event"] == "start"]
        assert starts == ["llm-a", "tts", "llm-b", "embed", "big"]
