"""GPU memory measured end to end, through a fake `nvidia-smi` on PATH that reports what the running fake model
servers say they use: a model that declares 1 GiB but uses 3 GiB is logged, shown beside its declaration in
/api/placement and /metrics — measured before it counts as started, so by its first answer — and once stopped its
next placement counts 3 GiB, so it no longer fits beside a model it fitted beside before; in distributed mode the worker, which runs the models, measures them."""

from __future__ import annotations

import os
import sys

import httpx
import pytest

from fakemodel.server import GPU_DIR_VARIABLE
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.e2e.test_placement import ask, loaded
from tests.e2e.test_system_metrics_e2e import path_without_nvidia_smi
from tests.served import Served, Worker, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

def config(events) -> str:
    """One GPU of 4 GiB: `small` declares 1 GiB and uses 3 GiB (through a wrapper, as models often start);
    `other` declares and uses 2 GiB. By their declarations they fit together."""
    small = fake_cmd("small", events, "--gpu-memory", "3072")
    return f"""
        healthCheckTimeout: 20
        hardware:
          gpus:
            - {{id: 0, memory: 4GiB}}
        models:
          small:
            cmd: /bin/sh -c '{small} & wait'
            memory: 1GiB
          other:
            cmd: {fake_cmd("other", events, "--gpu-memory", "2048")}
            memory: 2GiB
    """


def with_fake_nvidia_smi(tmp_path, env: dict | None = None) -> dict:
    """The environment of a llamaswap whose PATH finds the fake nvidia-smi, and whose fake models tell it their use."""
    tools, gpus = tmp_path / "tools", tmp_path / "gpus"
    tools.mkdir()
    gpus.mkdir()
    tool = tools / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} -m fakemodel.nvidia_smi "$@"\n')
    tool.chmod(0o755)
    return {**(env or {}), "PATH": f"{tools}{os.pathsep}{path_without_nvidia_smi()}", GPU_DIR_VARIABLE: str(gpus)}


def placement(base: str) -> dict:
    return httpx.get(base + "/api/placement", timeout=10).json()["boxes"][0]


def measured(base: str, model: str) -> int | None:
    return placement(base)["models"].get(model, {}).get("measured_mib")


def test_a_model_using_more_than_it_declared_is_logged_shown_and_counted_at_its_measured_use_next_time(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events), env=with_fake_nvidia_smi(tmp_path)) as served:
        assert ask(served, "other").status_code == 200
        asked = httpx.get(served.base + "/api/placement/can-load/small", timeout=10).json()
        assert (asked["fits_now"], asked["would_evict"]) == (True, [])  # by its declaration: 1 GiB beside 2 GiB
        assert ask(served, "small").status_code == 200
        assert loaded(served) == {"small", "other"}
        # Each was measured before it counted as started: by its first answer, placement counts what it uses.
        assert (measured(served.base, "small"), measured(served.base, "other")) == (3072, 2048)
        shown = placement(served.base)
        small = shown["models"]["small"]
        assert (small["declared_mib"], small["measured_mib"], small["counted_mib"]) == (1024, 3072, 3072)
        assert small["measured_per_gpu_mib"] == {"0": 3072}
        gpu = shown["gpus"][0]
        assert (gpu["declared_mib"], gpu["measured_mib"], gpu["counted_mib"]) == (3072, 5120, 5120)
        assert ("model small uses 3072 MiB of GPU memory, more than the 1024 MiB it declared (memory:); "
                "placement counts 3072 MiB for it from now on") in served.log()
        assert "model other uses" not in served.log()  # within its declaration
        metrics = httpx.get(served.base + "/metrics", timeout=10).text
        for line in ('llamaswap_gpu_memory_declared_bytes{gpu="0"} 3.221225472e+09',  # 3 GiB
                     'llamaswap_gpu_memory_measured_bytes{gpu="0"} 5.36870912e+09',  # 5 GiB
                     'llamaswap_model_gpu_memory_measured_bytes{gpu="0",model="small"} 3.221225472e+09'):
            assert line in metrics, [m for m in metrics.splitlines() if "memory_measured" in m or "memory_declared" in m]

        assert httpx.post(served.base + "/api/models/unload/small", timeout=30).status_code == 200
        assert loaded(served) == {"other"}
        asked = httpx.get(served.base + "/api/placement/can-load/small", timeout=10).json()
        assert (asked["fits_now"], asked["would_evict"]) == (False, ["other"])  # counted at 3 GiB now
        assert ask(served, "small").status_code == 200
        assert loaded(served) == {"small"}
        assert "Traceback" not in served.log()


def test_in_distributed_mode_the_worker_measures_and_a_front_end_shows_it(tmp_path, distributed):
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = config(events)
    with Worker(tmp_path / "worker", text, with_fake_nvidia_smi(tmp_path, env)) as worker:
        (tmp_path / "fe").mkdir()
        front_env = {**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}
        with Served(tmp_path / "fe", text, env=front_env) as front:
            assert ask(front, "small").status_code == 200
            wait_until(lambda: measured(front.base, "small") == 3072, 10, 0.1, "the worker to measure small")
            metrics = httpx.get(worker.metrics_url, timeout=10).text
            assert 'llamaswap_gpu_memory_measured_bytes{gpu="0"}' in metrics
            assert "model small uses 3072 MiB of GPU memory" in worker.log()


def test_a_model_measured_above_every_gpu_is_refused_at_once_after_it_stops_and_others_still_run(tmp_path):
    events = tmp_path / "events.jsonl"
    text = config(events).replace("--gpu-memory 3072", "--gpu-memory 5000")
    with Served(tmp_path, text, env=with_fake_nvidia_smi(tmp_path)) as served:
        assert ask(served, "small").status_code == 200  # by its declaration it fits
        wait_until(lambda: measured(served.base, "small") == 5000, 10, 0.1, "small's use to be measured")
        assert httpx.post(served.base + "/api/models/unload/small", timeout=30).status_code == 200
        refused = ask(served, "small")
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert "'small' needs 5000 MiB on a GPU, measured with nvidia-smi (it declared 1024 MiB)" in message
        assert "the largest GPU, 0, has 4096 MiB" in message
        assert ask(served, "other").status_code == 200  # nothing waits in its way
        asked = httpx.get(served.base + "/api/placement/can-load/small", timeout=10).json()
        assert (asked["fits_now"], asked["loaded"], asked["never_fits"]) == (False, False, message)
        assert "Traceback" not in served.log()
