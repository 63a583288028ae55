"""/metrics of a real `llamaswap serve` carries llama-swap's system series (CPU, memory, swap, load, network)
and, where nvidia-smi answers, its GPU series; `performance: {disabled: true}` turns them off, also on reload."""

from __future__ import annotations

import os
import stat

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

SYSTEM_SERIES = {
    "llamaswap_cpu_util_percent", "llamaswap_memory_total_bytes", "llamaswap_memory_used_bytes",
    "llamaswap_memory_free_bytes", "llamaswap_swap_total_bytes", "llamaswap_swap_used_bytes",
    "llamaswap_load_average", "llamaswap_network_bytes_total",
}
GPU_SERIES = {
    "llamaswap_gpu_temperature_celsius", "llamaswap_gpu_vram_temperature_celsius", "llamaswap_gpu_util_percent",
    "llamaswap_gpu_memory_util_percent", "llamaswap_gpu_memory_used_bytes", "llamaswap_gpu_memory_total_bytes",
    "llamaswap_gpu_fan_speed_percent", "llamaswap_gpu_power_draw_watts",
}
# Two GPUs as `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints them.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,name,uuid,*--format=csv,noheader,nounits*) ;;
  *) echo "unexpected arguments: $*" >&2; exit 64 ;;
esac
echo "0, NVIDIA H200, GPU-11111111-2222-3333-4444-555555555555, 36, 44, 93, 61, 120034, 143771, [N/A], 611.20"
echo "1, NVIDIA H200, GPU-66666666-7777-8888-9999-000000000000, 31, 40, 0, 0, 4, 143771, [N/A], 74.93"
"""


def config(performance: str = "") -> str:
    return f"""
        healthCheckTimeout: 20
        {performance}
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "2")}
            proxy: http://127.0.0.1:${{PORT}}
    """


def scrape(served: Served) -> dict[str, dict[frozenset, float]]:
    response = httpx.get(served.base + "/metrics", timeout=10)
    response.raise_for_status()
    series: dict[str, dict[frozenset, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            series.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return series


def path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        entry for entry in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(entry, "nvidia-smi"))
    )


def test_system_series_without_a_gpu(tmp_path):
    with Served(tmp_path, config(), env={"PATH": path_without_nvidia_smi()}) as served:
        got = wait_until(lambda: (s := scrape(served)) and SYSTEM_SERIES <= s.keys() and s, 20, 0.1, "system series")
        assert not GPU_SERIES & got.keys()
        cores = {dict(labels)["core"] for labels in got["llamaswap_cpu_util_percent"]}
        assert cores == {str(core) for core in range(len(cores))} and cores
        assert all(0 <= value <= 100 for value in got["llamaswap_cpu_util_percent"].values())
        assert {dict(labels)["interval"] for labels in got["llamaswap_load_average"]} == {"1m", "5m", "15m"}
        memory = next(iter(got["llamaswap_memory_total_bytes"].values()))
        assert 0 < next(iter(got["llamaswap_memory_used_bytes"].values())) < memory
        loopback = got["llamaswap_network_bytes_total"]
        assert frozenset({("interface", "lo"), ("direction", "recv")}) in loopback
        assert "nvidia-smi" in served.log() and "WARNING" not in served.log() and "Traceback" not in served.log()


def test_gpu_series_from_nvidia_smi_on_path(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    tool = tools / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    with Served(tmp_path, config(), env={"PATH": f"{tools}{os.pathsep}{path_without_nvidia_smi()}"}) as served:
        got = wait_until(lambda: (s := scrape(served)) and GPU_SERIES - {"llamaswap_gpu_fan_speed_percent"} <= s.keys() and s,
                         20, 0.1, "GPU series")
    first = frozenset({("id", "0"), ("name", "NVIDIA H200"), ("uuid", "GPU-11111111-2222-3333-4444-555555555555")})
    assert got["llamaswap_gpu_util_percent"][first] == 93
    assert got["llamaswap_gpu_memory_used_bytes"][first] == 120034 * 1024 * 1024
    assert got["llamaswap_gpu_power_draw_watts"][first] == 611.2
    assert len(got["llamaswap_gpu_temperature_celsius"]) == 2
    assert "llamaswap_gpu_fan_speed_percent" not in got, "a fan nvidia-smi reports as N/A is left out, not 0"


def test_performance_disabled_exports_none_and_a_reload_turns_it_on_and_off(tmp_path):
    served = Served(tmp_path, config("performance: {disabled: true}"), extra_args=("--watch-config",))
    with served:
        scraped = scrape(served)
        assert "llamaswap_scheduler_queue_depth" in scraped and not SYSTEM_SERIES & scraped.keys()
        text = served.config_path.read_text().replace("performance: {disabled: true}", "performance: {every: 1m}")
        served.config_path.write_text(text)
        wait_until(lambda: SYSTEM_SERIES <= scrape(served).keys(), 20, 0.2, "a reload to start sampling")
        served.config_path.write_text(text.replace("performance: {every: 1m}", "performance: {disabled: true}"))
        wait_until(lambda: not SYSTEM_SERIES & scrape(served).keys(), 20, 0.2, "a reload to stop sampling")
