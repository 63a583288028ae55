"""The data path end to end: real daphne, real fake-model processes started through `cmd:`, the real openai client."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest

from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e


def two_model_config(tmp, *, bonus=10, divisor=60, ttl=0, extra=""):
    events = tmp / "events.jsonl"
    return events, f"""
        healthCheckTimeout: 20
        models:
          alpha:
            cmd: {fake_cmd("alpha", events, "--tps", "200")}
            proxy: http://127.0.0.1:${{PORT}}
            aliases: [a]
            ttl: {ttl}
          beta:
            cmd: {fake_cmd("beta", events, "--tps", "200")}
            proxy: http://127.0.0.1:${{PORT}}
        {extra}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{agingDivisor: {divisor}, swapAffinityBonus: {bonus}}}
    """


@pytest.fixture
def served(tmp_path):
    events, text = two_model_config(tmp_path)
    with Served(tmp_path, text) as s:
        s.events = events
        yield s


def client(served, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0, **kw)


def test_chat_non_streaming_and_streaming_through_the_openai_client(served, rows):
    c = client(served)
    reply = c.chat.completions.create(model="alpha", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0

    chunks = list(c.chat.completions.create(model="a", messages=[{"role": "user", "content": "hi"}], stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) >= 2

    done = wait_until(lambda: [r for r in rows(served.data_dir) if r["state"] == "completed"] if len(
        [r for r in rows(served.data_dir) if r["state"] == "completed"]) == 2 else None, what="two completed rows")
    assert [r["requested_model"] for r in done] == ["alpha", "a"]
    assert all(r["model"] == "alpha" for r in done)
    assert all(r["serial_band"] == "normal" and r["serial_priority"] == 0 for r in done)
    assert done[0]["needed_swap"] == 1 and done[1]["needed_swap"] == 0
    assert done[0]["output_tokens"] > 0 and done[1]["stream"] == 1


def _post_in_thread(served, model, priority, results, key):
    def run():
        body = {"model": model, "messages": [{"role": "user", "content": key}]}
        r = httpx.post(served.base + "/v1/chat/completions", json=body,
                       headers={"X-LlamaSwap-Priority": str(priority)}, timeout=60)
        results[key] = r.status_code
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _start_events(served, model=None):
    return [e for e in read_events(served.events) if e["event"] == "start" and (model is None or e["model"] == model)]


@contextmanager
def gpu_held(served, model: str = "alpha", priority: str = "0"):
    """A stream on `model` that holds the GPU for as long as the block runs, so requests sent
    meanwhile queue behind it; leaving the block closes it mid-stream and the queue goes next."""
    body = {"model": model, "stream": True, "messages": [], "fake": {"tokens": 1_000_000, "tps": 10, "id": "holder"}}
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=body,
                      headers={"X-LlamaSwap-Priority": priority}, timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator's finaliser would close the stream
        assert next(lines).startswith("data:")
        yield


def test_dispatch_order_follows_priority_bands_behind_a_long_job(served, rows):
    results: dict[str, int] = {}
    threads = []
    with gpu_held(served, "alpha", "batch"):
        for key, prio in (("batch", "batch"), ("normal", "0"), ("interactive", "interactive")):
            threads.append(_post_in_thread(served, "alpha", prio, results, key))
            wait_until(lambda: len(rows(served.data_dir, "state='queued'")) == len(threads), what=f"{key} queued")
    for t in threads:
        t.join(30)
    assert results == {"batch": 200, "normal": 200, "interactive": 200}
    order = [e["priority"] for e in _start_events(served)]
    assert order == ["batch", "interactive", "0", "batch"]  # the holder, then the queue by band


def test_swap_affinity_keeps_a_loaded_model_request_ahead_of_an_older_one(served, rows):
    results: dict[str, int] = {}
    with gpu_held(served, "alpha"):
        threads = [_post_in_thread(served, "beta", 0, results, "older-beta")]
        # By model: the holder's own row may still read queued for a moment after its stream began.
        wait_until(lambda: rows(served.data_dir, "model='beta' AND state='queued'"), what="beta queued")
        threads.append(_post_in_thread(served, "alpha", 0, results, "newer-alpha"))
        wait_until(lambda: rows(served.data_dir, "model='alpha' AND state='queued'"), what="alpha queued")
    for t in threads:
        t.join(30)
    assert results == {"older-beta": 200, "newer-alpha": 200}
    starts = _start_events(served)
    assert [e["model"] for e in starts] == ["alpha", "alpha", "beta"]
    holder, *_ = rows(served.data_dir, "model='alpha'")  # the first alpha row; how it ended is not the point
    newer = wait_until(lambda: (r := rows(served.data_dir, "model='alpha' AND state='completed' AND id > ?",
                                          (holder["id"],))) and r[0], what="the newer alpha request's row")
    assert (newer["changed_by_affinity"], newer["score_affinity"]) == (1, 10), (holder, newer)


def test_client_that_leaves_while_queued_never_starts_its_model(served, rows):
    body = json.dumps({"model": "beta", "messages": []}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    with gpu_held(served, "alpha"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as leaving:
            leaving.sendall(request)
            wait_until(lambda: rows(served.data_dir, "model='beta' AND state='queued'"), what="the beta request to queue")
        # The client has gone; the GPU is still held, so nothing could have dispatched it.
        cancelled = wait_until(lambda: rows(served.data_dir, "model='beta' AND state='cancelled'"),
                               what="the beta row to be cancelled")
    assert "disconnected" in cancelled[0]["error"]
    assert [m["model"] for m in httpx.get(served.base + "/running").json()["running"]] == ["alpha"]
    assert not _start_events(served, "beta")
    served.check_settled("alpha")
    assert not _start_events(served, "beta")


def test_client_that_leaves_mid_stream_frees_the_gpu_for_the_next_request(served, rows):
    results: dict[str, int] = {}
    with httpx.stream("POST", served.base + "/v1/chat/completions",
                      json={"model": "alpha", "stream": True, "messages": [], "fake": {"tokens": 10000, "tps": 20}},
                      timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
        waiting = _post_in_thread(served, "alpha", 0, results, "next")
        wait_until(lambda: rows(served.data_dir, "state='queued'"), what="the next request to queue")
        closed_at = time.time()
    waiting.join(30)
    assert results == {"next": 200}
    events = read_events(served.events)
    first, second = events[0]["id"], [e for e in events if e["event"] == "start"][1]
    # The GPU passes on as the upstream connection closes, so the model may log the next start first.
    assert [(e["event"], e["id"]) for e in events if e["id"] == first] == [("start", first), ("disconnect", first)]
    assert [(e["event"], e["id"]) for e in events if e["id"] == second["id"]] == [("start", second["id"]), ("end", second["id"])]
    assert second["t"] - closed_at < 1.0, "the next request reached the model more than 1 s after the client left"
    first = wait_until(lambda: (r := rows(served.data_dir, "state='cancelled'")) and r, what="the cancelled row")
    assert "mid-response" in first[0]["error"]
    served.check_settled("alpha")


def test_unknown_model_and_bad_json_get_openai_errors(served):
    r = httpx.post(served.base + "/v1/chat/completions", json={"model": "nope", "messages": []})
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
    r = httpx.post(served.base + "/v1/chat/completions", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(served.base + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]


def test_models_list_running_and_unload(served):
    listed = httpx.get(served.base + "/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["alpha", "beta"]
    assert httpx.get(served.base + "/running").json() == {"running": []}
    client(served).embeddings.create(model="beta", input="x")
    assert [m["model"] for m in httpx.get(served.base + "/running").json()["running"]] == ["beta"]
    assert httpx.post(served.base + "/api/models/unload/beta").status_code == 200
    assert httpx.get(served.base + "/running").json() == {"running": []}


def test_model_swap_stops_the_previous_model(served):
    c = client(served)
    c.embeddings.create(model="alpha", input="x")
    c.embeddings.create(model="beta", input="x")
    running = httpx.get(served.base + "/running").json()["running"]
    assert [m["model"] for m in running] == ["beta"]
