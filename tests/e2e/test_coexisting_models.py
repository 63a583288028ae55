"""A persistent embeddings model beside the chat model, as llama-swap's docs lay them out: embeddings answer
while a long batch job streams on the chat model, and starting the chat model never evicts them."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.held import HeldStream, model_events
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          chat:
            cmd: {fake_cmd("chat", events)}
          coder:
            cmd: {fake_cmd("coder", events)}
          embed:
            cmd: {fake_cmd("embed", events)}
        groups:
          gpu:
            members: [chat, coder]
          embeddings:
            persistent: true
            swap: false
            exclusive: false
            members: [embed]
        routing:
          scheduler:
            use: serial
    """


def embed(served, request_id: str) -> httpx.Response:
    return httpx.post(served.base + "/v1/embeddings",
                      json={"model": "embed", "input": request_id, "fake": {"id": request_id}},
                      headers={"X-LlamaSwap-Priority": "interactive"}, timeout=30)


def loaded(served) -> set[str]:
    return {m["model"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]}


def test_embeddings_answer_while_a_batch_job_streams_on_the_chat_model(tmp_path, rows):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        assert embed(served, "before").status_code == 200
        batch = HeldStream(served, "chat", tokens=100_000, tps=20, request_id="batch")
        assert loaded(served) == {"chat", "embed"}  # the exclusive chat group left the persistent group alone

        during = embed(served, "during")
        assert during.status_code == 200 and len(during.json()["data"][0]["embedding"]) == 16
        assert model_events(events, "during") == ["start", "end"]
        assert model_events(events, "batch") == ["start"]  # the batch job is still streaming

        batch.close()
        embedded = wait_until(lambda: len(found := rows(served.data_dir, "model='embed' AND slot IS NOT NULL")) == 2
                              and found, what="both embeddings rows to record their slot")
        assert [row["slot"] for row in embedded] == [1, 1]
        assert served.log().count("model 'embed' starting") == 1
