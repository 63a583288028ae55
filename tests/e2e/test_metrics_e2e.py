"""/metrics of a real `llamaswap serve`: queue depth by band while requests wait, then dispatch and reorder counters."""

from __future__ import annotations

import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.served import Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

BANDS = ("interactive", "normal", "batch")
TERMS = ("aging", "swap_affinity")


def serial_config(*models: str, divisor: float, bonus: int) -> str:
    entries = "".join(
        f"""
          {model}:
            cmd: {fake_cmd(model, None, "--tps", "200")}
            proxy: http://127.0.0.1:${{PORT}}"""
        for model in models
    )
    return f"""
        healthCheckTimeout: 20
        startPort: {model_ports(4)}
        models:{entries}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{agingDivisor: {divisor}, swapAffinityBonus: {bonus}}}
    """


class Scrape:
    """One /metrics scrape, parsed with the Prometheus client's own parser."""

    def __init__(self, served: Served):
        response = httpx.get(served.base + "/metrics", timeout=10)
        response.raise_for_status()
        self.values = {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }

    def get(self, name: str, **labels: str) -> float:
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def by_band(self, name: str) -> dict[str, float]:
        return {band: self.get(name, band=band) for band in BANDS}


def until(served: Served, check, what: str, timeout: float = 20.0) -> Scrape:
    """Scrape until `check(scrape)` holds; returns that scrape."""

    def attempt():
        scrape = Scrape(served)
        return scrape if check(scrape) else None

    return wait_until(attempt, timeout, 0.05, what)


def post(served: Served, model: str, priority: str, results: list, **fake) -> threading.Thread:
    def run():
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "fake": fake}
        response = httpx.post(served.base + "/v1/chat/completions", json=body,
                              headers={"X-LlamaSwap-Priority": priority}, timeout=60)
        results.append(response.status_code)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def dispatched(band: str, count: int):
    return lambda s: s.get("llamaswap_scheduler_dispatched_total", band=band) == count


def queued(band: str, count: int):
    return lambda s: s.get("llamaswap_scheduler_queue_depth", band=band) == count


def test_queue_depth_by_band_behind_a_long_job_then_dispatch_counts(tmp_path):
    with Served(tmp_path, serial_config("alpha", divisor=60, bonus=10)) as served:
        before = Scrape(served)
        assert before.by_band("llamaswap_scheduler_queue_depth") == dict.fromkeys(BANDS, 0)
        assert before.by_band("llamaswap_scheduler_dispatched_total") == dict.fromkeys(BANDS, 0)
        assert before.get("llamaswap_model_state", model="alpha", state="stopped") == 1

        results: list[int] = []
        threads = [post(served, "alpha", "batch", results, delay=4)]
        running = until(served, dispatched("batch", 1), "the long batch job to get the GPU")
        assert running.get("llamaswap_model_state", model="alpha", state="ready") == 1
        for band in BANDS:
            threads.append(post(served, "alpha", band, results))
            waiting = until(served, queued(band, 1), f"the {band} request to be queued")

        assert waiting.by_band("llamaswap_scheduler_queue_depth") == dict.fromkeys(BANDS, 1)
        oldest = waiting.by_band("llamaswap_scheduler_queue_oldest_wait_seconds")
        assert oldest["interactive"] > oldest["normal"] > oldest["batch"] > 0

        for thread in threads:
            thread.join(30)
        assert results == [200] * 4
        done = until(
            served, lambda s: sum(s.by_band("llamaswap_scheduler_dispatched_total").values()) == 4, "all four dispatched"
        )
        assert done.by_band("llamaswap_scheduler_queue_depth") == dict.fromkeys(BANDS, 0)
        assert done.by_band("llamaswap_scheduler_queue_oldest_wait_seconds") == dict.fromkeys(BANDS, 0)
        assert done.by_band("llamaswap_scheduler_dispatched_total") == {"interactive": 1, "normal": 1, "batch": 2}
        assert done.get("llamaswap_scheduler_queue_wait_seconds_count", band="batch") == 2
        assert all(done.get("llamaswap_scheduler_reorders_total", band=b, term=t) == 0 for b in BANDS for t in TERMS)
        assert done.get("llamaswap_model_loads_total", model="alpha") == 1
        finished = until(
            served,
            lambda s: s.get("llamaswap_requests_total", model="alpha", route="/v1/chat/completions", status="200") == 4,
            "four finished requests",
        )
        assert finished.get("llamaswap_tokens_total", model="alpha", direction="output") > 0
        assert finished.get("llamaswap_request_duration_seconds_count", model="alpha") == 4


def test_reorders_count_the_term_that_changed_each_pick(tmp_path):
    # One point per 10 ms of waiting, and the largest affinity bonus: both terms decide real picks here.
    with Served(tmp_path, serial_config("alpha", "beta", divisor=0.01, bonus=99)) as served:
        results: list[int] = []

        # Aging: a batch request that has waited 1.2 s longer than a normal one has 120 aging points
        # more and overtakes it across the 100-point band gap.
        threads = [post(served, "alpha", "normal", results, delay=4)]
        until(served, dispatched("normal", 1), "the long job to get the GPU")
        threads.append(post(served, "alpha", "batch", results))
        until(served, lambda s: s.get("llamaswap_scheduler_queue_oldest_wait_seconds", band="batch") >= 1.2,
              "the batch request to have waited 1.2 s")
        threads.append(post(served, "alpha", "normal", results))
        until(served, queued("normal", 1), "the normal request to be queued")
        for thread in threads:
            thread.join(30)
        after_aging = until(served, dispatched("normal", 2), "the normal request to be dispatched")
        assert after_aging.get("llamaswap_scheduler_reorders_total", band="batch", term="aging") == 1

        # Swap affinity: a newer request for the loaded model goes before an older one that needs a swap.
        threads = [post(served, "alpha", "normal", results, delay=1.5)]
        until(served, dispatched("normal", 3), "the second long job to get the GPU")
        threads.append(post(served, "beta", "normal", results))
        until(served, queued("normal", 1), "the beta request to be queued")
        threads.append(post(served, "alpha", "normal", results))
        until(served, queued("normal", 2), "the alpha request to be queued")
        for thread in threads:
            thread.join(30)
        assert results == [200] * 6
        done = until(served, dispatched("normal", 5), "every request dispatched")

        reorders = {(b, t): done.get("llamaswap_scheduler_reorders_total", band=b, term=t) for b in BANDS for t in TERMS}
        assert {key: n for key, n in reorders.items() if n} == {("batch", "aging"): 1, ("normal", "swap_affinity"): 1}
        assert done.by_band("llamaswap_scheduler_dispatched_total") == {"interactive": 0, "normal": 5, "batch": 1}
        assert done.get("llamaswap_model_loads_total", model="alpha") == 1
        assert done.get("llamaswap_model_loads_total", model="beta") == 1
