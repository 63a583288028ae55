"""Two models that share the GPU start at the same time, and one start fails: the other model still
comes up and serves. Each start is held at a gate file, so both are under way before either ends."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.e2e.test_model_lifecycle import gated_start
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config(chat_cmd: str, embed_cmd: str, health_timeout: float = 20) -> str:
    return f"""
        healthCheckTimeout: {health_timeout}
        models:
          chat:
            cmd: {chat_cmd}
          embed:
            cmd: {embed_cmd}
        groups:
          gpu:
            members: [chat]
          embeddings:
            persistent: true
            swap: false
            exclusive: false
            members: [embed]
        routing:
          scheduler:
            use: serial
    """


def ask(served, model: str) -> httpx.Response:
    if model == "embed":
        return httpx.post(served.base + "/v1/embeddings", json={"model": "embed", "input": "hello"}, timeout=60)
    return httpx.post(served.base + "/v1/chat/completions",
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]}, timeout=60)


class Pending:
    """A request on a thread, so the test can start another model while this one's start is under way."""

    def __init__(self, served, model: str) -> None:
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._run, args=(served, model), daemon=True)
        self._thread.start()

    def _run(self, served, model: str) -> None:
        self.response = ask(served, model)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> httpx.Response:
        self._thread.join(60)
        assert self.response is not None, "the request never returned"
        return self.response


def running(served) -> dict[str, str]:
    return {m["model"]: m["state"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]}


@pytest.mark.parametrize("failing", ["embed", "chat"])
def test_a_start_that_exits_leaves_the_concurrent_start_of_a_coexisting_model_to_come_up(tmp_path, failing):
    other = "chat" if failing == "embed" else "embed"
    spawns = {m: tmp_path / f"{m}.spawns" for m in ("chat", "embed")}
    gates = {m: tmp_path / f"{m}.gate" for m in ("chat", "embed")}
    cmds = {m: gated_start(spawns[m], gates[m], "--model", m, *(["--exit-at-start", "3"] if m == failing else []))
            for m in ("chat", "embed")}
    with Served(tmp_path, config(cmds["chat"], cmds["embed"])) as served:
        requests = {}
        for model in (other, failing):
            requests[model] = Pending(served, model)
            wait_until(spawns[model].exists, timeout=15, what=f"the start of {model} to be under way")
        assert running(served) == {"chat": "starting", "embed": "starting"}

        gates[failing].touch()
        failed = requests[failing].result()
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "model_start_failed"
        assert failing in failed.json()["error"]["message"] and "status 3" in failed.json()["error"]["message"]
        assert not requests[other].done() and running(served) == {other: "starting"}

        gates[other].touch()
        assert requests[other].result().status_code == 200
        assert running(served) == {other: "ready"}
        assert ask(served, other).status_code == 200
        assert spawns[other].read_text().splitlines() == ["spawn"]  # the failure did not restart it
        served.check_settled(other)


def test_a_start_that_never_becomes_healthy_leaves_a_coexisting_model_serving(tmp_path):
    spawns, gate = tmp_path / "chat.spawns", tmp_path / "chat.gate"
    stuck = fake_cmd("embed", None, "--hang-at-start")
    with Served(tmp_path, config(gated_start(spawns, gate, "--model", "chat"), stuck, health_timeout=5)) as served:
        embedding = Pending(served, "embed")
        wait_until(lambda: "model 'embed' starting" in served.log(), timeout=15, what="the start of embed")
        chatting = Pending(served, "chat")
        wait_until(spawns.exists, timeout=15, what="the start of chat to be under way")
        assert not embedding.done(), "embed gave up before chat's start began; the starts did not overlap"

        gate.touch()
        assert chatting.result().status_code == 200
        failed = embedding.result()
        assert failed.status_code == 503 and "timed out" in failed.json()["error"]["message"]
        assert running(served) == {"chat": "ready"}
        assert ask(served, "chat").status_code == 200
        assert spawns.read_text().splitlines() == ["spawn"]
        served.check_settled("chat")
