"""Two GPU boxes, each with a `llamaswap worker` for its own models (one config per box), behind front
ends that serve them all: their models run at once, the front ends route each request to its box, the
boxes' views are put together, and one box dying leaves the other serving. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from tests.e2e.held import HeldStream
from tests.e2e.test_distributed import distributed, distributed_either  # noqa: F401 (fixtures)
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e


def box_configs(events) -> tuple[str, str, str]:
    """The chat box's config, the coder box's, and the front ends' (both models)."""

    def config(*models: str) -> str:
        lines = "".join(f'  {model}: {{cmd: "{fake_cmd(model, events)}"}}\n' for model in models)
        return f"startPort: {model_ports(2)}\nrouting:\n  scheduler:\n    use: serial\nmodels:\n{lines}"

    return config("chat"), config("coder"), config("chat", "coder")


def post(served: Served, model: str, request_id: str, answers: dict, priority: int = 0) -> threading.Thread:
    def send():
        answers[request_id] = httpx.post(
            served.base + "/v1/chat/completions", timeout=120, headers={"X-LlamaSwap-Priority": str(priority)},
            json={"model": model, "messages": [], "fake": {"id": request_id, "tokens": 2}},
        )

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def running(served: Served) -> dict[str, str]:
    return {m["model"]: m["state"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]}


def test_two_boxes_serve_their_own_models_at_once_and_one_dying_leaves_the_other_serving(tmp_path, distributed_either):
    env, psycopg = distributed_either
    events = tmp_path / "events.jsonl"
    chat_box, coder_box, everything = box_configs(events)
    coder_env = {**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "coder-data")}
    with Worker(tmp_path / "chat-box", chat_box, env) as chat_worker, Worker(tmp_path / "coder-box", coder_box, coder_env):
        (tmp_path / "fe1").mkdir(), (tmp_path / "fe2").mkdir()
        with Served(tmp_path / "fe1", everything, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe1" / "data")}) as first, \
                Served(tmp_path / "fe2", everything, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe2" / "data")}) as second:
            assert [m["id"] for m in httpx.get(first.base + "/v1/models", timeout=10).json()["data"]] == ["chat", "coder"]
            chat = HeldStream(first, "chat", tokens=100_000, tps=50, request_id="held-chat")
            coder = HeldStream(second, "coder", tokens=100_000, tps=50, request_id="held-coder")
            assert running(first) == running(second) == {"chat": "ready", "coder": "ready"}, "both boxes busy at once"

            answers: dict = {}
            waiting = [post(second, "chat", "chat-1", answers)]
            wait_until(lambda: _queued(psycopg, env) == 1, 20, 0.02, "chat-1 to queue")
            os.kill(chat_worker.proc.pid, signal.SIGKILL)
            chat.close()
            coder_answer: dict = {}
            post(first, "coder", "coder-1", coder_answer).join(0)  # queued behind the held coder stream
            coder.close()
            wait_until(lambda: "coder-1" in coder_answer, 30, 0.05, "the coder box to serve while the chat box is down")
            assert coder_answer["coder-1"].status_code == 200
            assert "chat-1" not in answers, "the chat request waits for its box"

            with Worker(tmp_path / "chat-box-again", chat_box, env):
                for thread in waiting:
                    thread.join(60)
                assert answers["chat-1"].status_code == 200
                started = [e["id"] for e in read_events(events) if e["event"] == "start"]
                assert sorted(started) == ["chat-1", "coder-1", "held-chat", "held-coder"], "each request served once"
                rows = first.check_settled("chat")[:4]  # one row per request, the two boxes' ids never the same
                second.check_settled("coder")
            chat, coder = ([row["state"] for row in rows if row["model"] == model] for model in ("chat", "coder"))
            assert coder == ["cancelled", "completed"] and chat[1] == "completed", rows  # held, then queued
            # The held chat stream's client left as its box died: the row says so once the front end's report of
            # that reaches the next chat worker; sent in the instant of the kill, Redis may hand it to the dead
            # worker's connection (and with `pubsub` nobody hears it), and the row says the worker died under it.
            assert chat[0] in ("cancelled", "interrupted"), rows


def _queued(psycopg, env) -> int:
    with psycopg.connect(env["DATABASE_URL"]) as connection:
        return connection.execute("SELECT count(*) FROM scheduling_queuedrequest WHERE state = 'queued'").fetchone()[0]


def test_a_worker_whose_models_overlap_another_workers_refuses_to_start(tmp_path, distributed):
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    chat_box, _, everything = box_configs(events)
    with Worker(tmp_path / "chat-box", chat_box, env):
        config = tmp_path / "overlap.yaml"
        config.write_text(everything)  # chat again, with coder
        result = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "worker", "--config", str(config), "--metrics-listen", "off"],
            cwd=REPO, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "overlap-data")}, capture_output=True,
            text=True, timeout=60,
        )
        assert result.returncode == 1
        assert "model 'chat' is served by another worker (llamaswap worker pid" in result.stderr
        assert "give each model to one worker's config" in result.stderr
