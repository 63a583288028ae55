"""Distributed mode: the worker, which runs the models, samples its machine and exports the system series on
its metrics port; a front end exports none (its machine runs no model). Both read a --config-dir."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e


def names(url: str) -> set[str]:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    return {line.split("{")[0].split(" ")[0] for line in response.text.splitlines() if line and not line.startswith("#")}


def test_the_worker_exports_its_machine_and_the_front_end_does_not(tmp_path, distributed):
    env, _ = distributed
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "models.yaml").write_text(f"models:\n  chat: {{cmd: \"{fake_cmd('chat')}\"}}\n")
    base = f"startPort: {model_ports(2)}\nperformance: {{every: 5s}}\n"
    with Worker(tmp_path / "worker", base, env, extra_args=("--config-dir", str(conf_d))) as worker:
        (tmp_path / "fe").mkdir()
        front = Served(tmp_path / "fe", base, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")},
                       extra_args=("--config-dir", str(conf_d)))
        with front:
            reply = httpx.post(front.base + "/v1/chat/completions", timeout=60,
                               json={"model": "chat", "messages": [], "fake": {"tokens": 2}})
            assert reply.status_code == 200, reply.text
            wait_until(lambda: "llamaswap_cpu_util_percent" in names(worker.metrics_url), 20, 0.1, "the worker's series")
            assert {"llamaswap_memory_total_bytes", "llamaswap_load_average"} <= names(worker.metrics_url)
            assert not {name for name in names(front.base + "/metrics") if name.startswith(
                ("llamaswap_cpu_", "llamaswap_memory_", "llamaswap_load_", "llamaswap_network_", "llamaswap_gpu_"))}
