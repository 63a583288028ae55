"""Metrics in distributed mode with real processes: the worker exports the queue once, on its own
port, and each front end the requests it served, so a sum over every scrape target counts each once."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.held import HeldStream
from tests.e2e.test_distributed import Worker, config_text, distributed  # noqa: F401 - the fixture
from tests.served import REPO, Served, wait_until

pytestmark = pytest.mark.e2e

BANDS = ("interactive", "normal", "batch")
# What only the scheduler knows: a front end that exported them would count the queue once per front end.
SCHEDULER_PREFIXES = ("llamaswap_scheduler_", "llamaswap_model_")


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def queue_depth(url: str) -> dict[str, float]:
    got = scrape(url)
    return {band: got[("llamaswap_scheduler_queue_depth", frozenset({("band", band)}))] for band in BANDS}


def requests_by_status(url: str) -> dict[str, float]:
    """The front end's `llamaswap_requests_total` for the chat route, summed by status."""
    counted: dict[str, float] = {}
    for (name, labels), value in scrape(url).items():
        labels = dict(labels)
        if name == "llamaswap_requests_total" and labels["route"] == "/v1/chat/completions" and value:
            counted[labels["status"]] = counted.get(labels["status"], 0) + value
    return counted


def test_the_worker_exports_the_queue_once_and_each_front_end_the_requests_it_served(tmp_path, distributed):
    env, _ = distributed
    text = config_text(tmp_path / "events.jsonl")
    with Worker(tmp_path / "worker", text, env) as worker:
        fronts = []
        for name in ("fe1", "fe2"):
            (tmp_path / name).mkdir()
            fronts.append(Served(tmp_path / name, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")}))
        with fronts[0] as first, fronts[1] as second:
            held = HeldStream(first, "chat", tokens=10_000, tps=50, request_id="held")
            answers: list[int] = []

            def ask(served: Served, request_id: str, priority: str) -> threading.Thread:
                def post():
                    answers.append(httpx.post(
                        served.base + "/v1/chat/completions", timeout=60, headers={"X-LlamaSwap-Priority": priority},
                        json={"model": "chat", "messages": [], "fake": {"id": request_id, "tokens": 2}},
                    ).status_code)

                thread = threading.Thread(target=post)
                thread.start()
                return thread

            plan = [(second, "b", "batch"), (first, "i", "interactive"), (second, "n1", "normal"), (second, "n2", "normal")]
            threads = [ask(served, request_id, priority) for served, request_id, priority in plan]
            wanted = {"interactive": 1, "normal": 2, "batch": 1}
            wait_until(lambda: queue_depth(worker.metrics_url) == wanted, 30, 0.05, "the worker to export the queue")
            for served in (first, second):
                exported = {name for name, _ in scrape(served.base + "/metrics")}
                assert not {name for name in exported if name.startswith(SCHEDULER_PREFIXES)}, served.base

            held.close()
            for thread in threads:
                thread.join(60)
            assert answers == [200] * 4
            wait_until(lambda: requests_by_status(second.base + "/metrics") == {"200": 3}, 20, 0.05,
                       "the second front end to count its three requests")
            # Its one queued request, and the held stream, which ended when the client closed it.
            wait_until(lambda: sum(requests_by_status(first.base + "/metrics").values()) == 2, 20, 0.05,
                       "the first front end to count its two requests")
            assert requests_by_status(first.base + "/metrics").get("200") >= 1
            at_worker = scrape(worker.metrics_url)
            assert not {name for name, _ in at_worker if name.startswith("llamaswap_request")}
            dispatched = sum(at_worker[("llamaswap_scheduler_dispatched_total", frozenset({("band", b)}))] for b in BANDS)
            assert dispatched == 5
            assert queue_depth(worker.metrics_url) == dict.fromkeys(BANDS, 0)


def test_a_worker_whose_metrics_port_is_taken_says_so(tmp_path, distributed):
    env, _ = distributed
    config = tmp_path / "config.yaml"
    config.write_text(config_text(tmp_path / "events.jsonl"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = "127.0.0.1:%d" % taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(REPO / "manage.py"), "worker", "--config", str(config), "--metrics-listen", listen],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot serve metrics on {listen}: Address already in use" in result.stderr
    assert "--metrics-listen" in result.stderr


def test_the_workers_metrics_port_asks_for_an_api_key_when_the_config_does(tmp_path, distributed):
    env, _ = distributed
    text = "apiKeys: [s3cret]\nmetricsRequireApiKey: true\n" + config_text(tmp_path / "events.jsonl")
    with Worker(tmp_path / "worker", text, env) as worker:
        refused = httpx.get(worker.metrics_url, timeout=10)
        assert refused.status_code == 401 and "metricsRequireApiKey" in refused.json()["error"]["message"]
        assert refused.headers["WWW-Authenticate"].startswith("Basic")
        for headers in ({"Authorization": "Bearer s3cret"}, {"x-api-key": "s3cret"}):
            assert "llamaswap_scheduler_queue_depth" in httpx.get(worker.metrics_url, headers=headers, timeout=10).text
