"""Distributed mode with real processes: one `llamaswap worker` owning the models and two `llamaswap
serve` front ends, over the local Redis and a PostgreSQL database of the test's own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest

from tests.conftest import REDIS_URL, fresh_redis_db
from tests.e2e.held import HeldStream
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def distributed(tmp_path, postgres):
    """The environment of every process: the test's database and a Redis database emptied for it."""
    redis = pytest.importorskip("redis")
    url, _ = postgres
    try:
        redis_url = fresh_redis_db(REDIS_URL)
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis_url, "PYTHONPATH": str(REPO),
           "LLAMASWAP_DATA_DIR": str(tmp_path / "worker-data")}
    yield env, postgres[1]
    redis.Redis.from_url(redis_url).flushdb()


@pytest.fixture(params=["lists", "pubsub"])
def distributed_either(distributed, request):
    """`distributed`, once over each channel layer (LLAMASWAP_CHANNEL_LAYER)."""
    env, psycopg = distributed
    return {**env, "LLAMASWAP_CHANNEL_LAYER": request.param}, psycopg


def config_text(events) -> str:
    return textwrap.dedent(f"""
        startPort: {model_ports(2)}
        models:
          chat: {{cmd: "{fake_cmd('chat', events)}"}}
          coder: {{cmd: "{fake_cmd('coder', events)}"}}
        routing:
          scheduler:
            use: serial
    """)


@contextlib.contextmanager
def two_front_ends(tmp_path, text: str, env: dict, front_env: dict | None = None):
    """A worker and two front ends over the test's database and Redis, each front end with its data folder
    (`front_env`: the front ends' environment when it is not the worker's, e.g. with a shared files folder)."""
    with Worker(tmp_path / "worker", text, env):
        front = []
        for name in ("fe1", "fe2"):
            (tmp_path / name).mkdir()
            front.append(Served(tmp_path / name, text,
                                env={**(front_env or env), "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")}))
        with front[0] as first, front[1] as second:
            yield first, second


def queued_rows(psycopg, url: str) -> int:
    with psycopg.connect(url) as connection:
        return connection.execute("SELECT count(*) FROM scheduling_queuedrequest WHERE state = 'queued'").fetchone()[0]


def test_two_front_ends_share_one_worker_queue_in_priority_order(tmp_path, distributed):
    env, psycopg = distributed
    events = tmp_path / "events.jsonl"
    text = config_text(events)
    with two_front_ends(tmp_path, text, env) as (first, second):
        models = httpx.get(first.base + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["chat", "coder"]

        held = HeldStream(first, "chat", tokens=10_000, tps=50, request_id="held")
        answers: dict[str, httpx.Response] = {}

        def ask(served, request_id: str, priority: str) -> threading.Thread:
            def post():
                answers[request_id] = httpx.post(
                    served.base + "/v1/chat/completions", timeout=60,
                    headers={"X-LlamaSwap-Priority": priority},
                    json={"model": "chat", "messages": [], "fake": {"id": request_id, "tokens": 2}},
                )
            thread = threading.Thread(target=post)
            thread.start()
            return thread

        plan = [(second, "batch", "batch"), (first, "normal-1", "normal"), (second, "interactive", "interactive"),
                (first, "normal-2", "normal")]
        threads = []
        for count, (served, request_id, priority) in enumerate(plan, start=1):
            threads.append(ask(served, request_id, priority))
            wait_until(lambda: queued_rows(psycopg, env["DATABASE_URL"]) == count, 20, 0.05,
                       f"{request_id} to queue at the worker")

        running = httpx.get(second.base + "/running", timeout=10).json()["running"]
        assert [(m["model"], m["state"]) for m in running] == [("chat", "ready")]
        held.close()
        for thread in threads:
            thread.join(60)
        assert all(answer.status_code == 200 for answer in answers.values()), answers
        started = [e["id"] for e in read_events(events) if e["event"] == "start" and e["id"] != "held"]
        assert started == ["interactive", "normal-1", "normal-2", "batch"]


def test_a_worker_without_redis_says_what_to_set(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("REDIS_URL", "DATABASE_URL")}
    env.update(PYTHONPATH=str(REPO), LLAMASWAP_DATA_DIR=str(tmp_path / "data"))
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tmp_path / "events.jsonl"))
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "worker", "--config", str(config)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "set REDIS_URL=redis://" in result.stderr and "DATABASE_URL" in result.stderr
