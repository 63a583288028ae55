"""Faults around starts and stops when models share the hardware: a start never overlaps a model
another swap is still stopping, a request queued when its model's server dies starts it again,
and a request whose model is unloaded while starting is told so with a 503."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e


def _live_models(tag: str) -> set[str]:
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fakemodel" in cmd and b"--model" in cmd:
            name = cmd[cmd.index(b"--model") + 1].decode()
            if name.startswith(tag):
                found.add(name)
    return found


def test_a_start_waits_for_a_model_another_swap_is_still_stopping(tmp_path):
    tag = f"t{os.getpid()}"
    a, c, big = f"{tag}a", f"{tag}c", f"{tag}big"
    cfg = f"""
        healthCheckTimeout: 20
        models:
          {a}: {{cmd: "{fake_cmd(a)}"}}
          {c}: {{cmd: "{fake_cmd(c)}"}}
          {big}:
            cmd: "{fake_cmd(big, None, '--ignore-sigterm')}"
            unloadTimeout: 3
        routing:
          router:
            use: matrix
            settings:
              matrix:
                sets:
                  gpus: "{a} & {c}"
                  both: "{big}"
          scheduler:
            use: serial
    """
    with Served(tmp_path, cfg) as served:
        def chat(model):
            return httpx.post(served.base + "/v1/chat/completions", timeout=60,
                              json={"model": model, "messages": [{"role": "user", "content": "hi"}]})

        assert chat(big).status_code == 200
        seen: list[set[str]] = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                seen.append(_live_models(tag))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        results = {}
        t_c = threading.Thread(target=lambda: results.update(c=chat(c)))
        t_c.start()
        # c's start stops big (which takes 3 s, ignoring SIGTERM); meanwhile ask for a.
        wait_until(lambda: "stopping" in served.log() or "swapping to" in served.log(), what="the swap to begin")
        t_a = threading.Thread(target=lambda: results.update(a=chat(a)))
        t_a.start()
        t_c.join(30)
        t_a.join(30)
        stop.set()
        watcher.join()
        assert results["a"].status_code == 200 and results["c"].status_code == 200
        together = [s for s in seen if big in s and (a in s or c in s)]
        assert not together, f"{big} still ran beside {together[0]} (the matrix forbids it)"


@pytest.mark.parametrize("slots", [1, 2])
def test_a_request_queued_when_the_model_is_killed_restarts_it(tmp_path, slots):
    events = tmp_path / "events.jsonl"
    cfg = f"""
        healthCheckTimeout: 20
        models:
          m: {{cmd: "{fake_cmd('m', events, '--parallel', str(slots), '--tps', '20')}"}}
        routing:
          scheduler:
            use: serial
            settings:
              serial:
                slots: {{m: {slots}}}
    """
    with Served(tmp_path, cfg) as served:
        results: dict[str, httpx.Response] = {}

        def chat(rid: str, tokens: int) -> None:
            results[rid] = httpx.post(served.base + "/v1/chat/completions", timeout=60, json={
                "model": "m", "messages": [{"role": "user", "content": "x"}], "fake": {"id": rid, "tokens": tokens}})

        busy = [threading.Thread(target=chat, args=(f"busy{i}", 10_000)) for i in range(slots)]
        for t in busy:
            t.start()
        wait_until(lambda: sum(e["event"] == "start" for e in read_events(events)) == slots, what="every slot busy")
        queued = threading.Thread(target=chat, args=("queued", 5))
        queued.start()
        wait_until(lambda: "queue_depth" in (m := httpx.get(served.base + "/metrics").text)
                   and 'llamaswap_scheduler_queue_depth{band="normal"} 1.0' in m, what="the third request to queue")
        pid = int(next(p for p in os.listdir("/proc") if p.isdigit() and _is_model(p, events)))
        os.kill(pid, signal.SIGKILL)
        for t in [*busy, queued]:
            t.join(60)
        assert all(results[f"busy{i}"].status_code == 502 for i in range(slots))
        assert results["queued"].status_code == 200, results["queued"].text
        served.check_settled("m")


def _is_model(pid: str, events) -> bool:
    """Whether /proc/<pid> is this test's fake model server (its --events path is unique)."""
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return False
    return b"fakemodel" in cmd and str(events).encode() in cmd


def test_a_request_whose_model_is_unloaded_while_starting_gets_503(tmp_path):
    cfg = f"""
        healthCheckTimeout: 20
        models:
          slow: {{cmd: "{fake_cmd('slow', None, '--load-delay', '5')}"}}
        routing:
          scheduler:
            use: serial
    """
    with Served(tmp_path, cfg) as served:
        answer: dict[str, httpx.Response] = {}
        waiting = threading.Thread(target=lambda: answer.update(r=httpx.post(
            served.base + "/v1/chat/completions", timeout=30,
            json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]})))
        waiting.start()
        wait_until(lambda: "model 'slow' starting" in served.log(), what="the start to begin")
        assert httpx.post(served.base + "/api/models/unload/slow", timeout=30).status_code == 200
        waiting.join(30)
        reply = answer["r"]
        assert reply.json()["error"]["code"] == "model_unloaded"
        assert reply.status_code == 503, f"{reply.status_code}: {reply.text}"
        served.check_settled("slow")
