"""The system and GPU sampler behind /metrics' `llamaswap_cpu_*`, `_memory_*`, `_gpu_*` series: parsing and export."""

from __future__ import annotations

import os
import stat
import textwrap
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.model_processes import system_metrics
from proxy.config.performance import PerformanceConfig
from proxy.model_processes.system_metrics import (
    Memory, Sample, SystemCollector, SystemSampler, cpu_percent, parse_cpu_times, parse_loadavg, parse_meminfo,
    parse_net_dev, parse_nvidia_smi, query_nvidia_smi,
)

PROC_STAT = """\
cpu  300 0 100 600 0 0 0 0 0 0
cpu0 100 0 50 300 0 0 0 0 0 0
cpu1 200 0 50 300 0 0 0 0 0 0
intr 12345 0 0
ctxt 999
"""
PROC_STAT_LATER = """\
cpu  450 0 100 850 0 0 0 0 0 0
cpu0 100 0 50 400 0 0 0 0 0 0
cpu1 350 0 50 350 0 0 0 0 0 0
"""
MEMINFO = """\
MemTotal:       16000000 kB
MemFree:         2000000 kB
MemAvailable:   10000000 kB
Buffers:          500000 kB
Cached:          6000000 kB
SwapTotal:       4000000 kB
SwapFree:        3000000 kB
HugePages_Total:       0
"""
NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:   39602     541    0    0    0     0          0         0    39602     541    0    0    0     0       0          0
  eth0: 162689864 120000  0    0    0     0          0         0   323637    3000    0    0    0     0       0          0
"""
# What `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints: one line per GPU; N/A where unsupported.
NVIDIA_SMI = """\
0, NVIDIA H200, GPU-5b9d3c1e-0000-1111-2222-333344445555, 34, 41, 87, 52, 81234, 143771, [N/A], 412.35
1, NVIDIA GeForce RTX 4090, GPU-aaaa0000-bbbb-cccc-dddd-eeeeffff0000, 61, [N/A], 3, 1, 512, 24564, 30, 35.10
"""


def test_cpu_use_per_core_is_the_busy_share_between_two_readings():
    before, after = parse_cpu_times(PROC_STAT), parse_cpu_times(PROC_STAT_LATER)
    assert before == ((150, 450), (250, 550))  # the aggregate `cpu` line is not a core
    assert cpu_percent(before, after) == (0.0, 75.0)


def test_iowait_counts_as_idle_and_a_core_without_elapsed_time_reads_zero():
    cores = parse_cpu_times("cpu0 10 0 10 70 10 0 0 0 0 0\n")
    assert cores == ((20, 100),)
    assert cpu_percent(cores, cores) == (0.0,)


def test_memory_used_is_total_less_available_and_swap_used_is_total_less_free():
    assert parse_meminfo(MEMINFO) == Memory(
        total=16_000_000 * 1024, used=6_000_000 * 1024, free=2_000_000 * 1024,
        swap_total=4_000_000 * 1024, swap_used=1_000_000 * 1024,
    )


def test_load_average_and_network_counters():
    assert parse_loadavg("0.23 0.37 0.18 2/163 9667\n") == (0.23, 0.37, 0.18)
    assert parse_net_dev(NET_DEV) == {"lo": (39602, 39602), "eth0": (162689864, 323637)}


def test_nvidia_smi_csv_gives_each_gpus_values_in_bytes_and_leaves_out_what_it_does_not_report():
    h200, rtx = parse_nvidia_smi(NVIDIA_SMI)
    assert (h200.id, h200.name, h200.uuid) == (0, "NVIDIA H200", "GPU-5b9d3c1e-0000-1111-2222-333344445555")
    assert h200.values["llamaswap_gpu_memory_used_bytes"] == 81234 * 1024 * 1024
    assert h200.values["llamaswap_gpu_power_draw_watts"] == 412.35
    assert h200.values["llamaswap_gpu_vram_temperature_celsius"] == 41
    assert "llamaswap_gpu_fan_speed_percent" not in h200.values  # [N/A]: a passively cooled card
    assert rtx.values["llamaswap_gpu_fan_speed_percent"] == 30
    assert "llamaswap_gpu_vram_temperature_celsius" not in rtx.values


def test_nvidia_smi_lines_that_are_not_gpu_rows_are_skipped():
    assert parse_nvidia_smi("No devices were found\n") == ()
    # A digit that is not an ASCII one ("²".isdigit() holds, int("²") raises) is no GPU index.
    assert parse_nvidia_smi(NVIDIA_SMI.replace("0,", "\u00b2,", 1))[0].id == 1


def exported(sample: Sample) -> dict:
    sampler = SystemSampler()
    sampler.latest = sample
    registry = CollectorRegistry()
    registry.register(SystemCollector(sampler))
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def test_the_collector_exports_llama_swaps_names_and_labels():
    got = exported(Sample(
        cpu_percent=(12.5, 75.0), memory=parse_meminfo(MEMINFO), load=(0.5, 0.25, 0.125),
        network={"eth0": (100, 200)}, gpus=parse_nvidia_smi(NVIDIA_SMI),
    ))
    assert got[("llamaswap_cpu_util_percent", frozenset({("core", "1")}))] == 75.0
    assert got[("llamaswap_memory_used_bytes", frozenset())] == 6_000_000 * 1024
    assert got[("llamaswap_swap_total_bytes", frozenset())] == 4_000_000 * 1024
    assert got[("llamaswap_load_average", frozenset({("interval", "15m")}))] == 0.125
    assert got[("llamaswap_network_bytes_total", frozenset({("interface", "eth0"), ("direction", "sent")}))] == 200
    h200 = frozenset({("id", "0"), ("name", "NVIDIA H200"), ("uuid", "GPU-5b9d3c1e-0000-1111-2222-333344445555")})
    assert got[("llamaswap_gpu_util_percent", h200)] == 87
    assert got[("llamaswap_gpu_memory_total_bytes", h200)] == 143771 * 1024 * 1024
    assert ("llamaswap_gpu_fan_speed_percent", h200) not in got


def test_nothing_is_exported_before_the_first_sample_or_without_a_gpu():
    assert exported(Sample()) == {}
    assert not [name for name, _ in exported(Sample(load=(1.0, 1.0, 1.0))) if name.startswith("llamaswap_gpu_")]
    sampler = SystemSampler()
    registry = CollectorRegistry()
    registry.register(SystemCollector(sampler))
    assert b"llamaswap_" not in generate_latest(registry)


def fake_tool(tmp_path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_gpu_tool_that_hangs_is_killed_at_the_timeout(tmp_path):
    tool = fake_tool(tmp_path, "sleep 30\n")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer within 0.5s"):
        query_nvidia_smi(tool, timeout=0.5)
    assert time.monotonic() - started < 5, "the tool's own children must not keep the pipe open"


def test_a_failing_gpu_tool_names_its_first_line(tmp_path):
    tool = fake_tool(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n")
    with pytest.raises(RuntimeError, match="exited with 9: NVIDIA-SMI has failed"):
        query_nvidia_smi(tool)


def test_the_sampler_reads_proc_files_and_a_gpu_tool_on_path(tmp_path, monkeypatch):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text(PROC_STAT)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "loadavg").write_text("1.5 1.0 0.5 1/100 42\n")
    (proc / "net" / "dev").write_text(NET_DEV)
    fake_tool(tmp_path, f"cat <<'CSV'\n{NVIDIA_SMI}CSV\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sample = SystemSampler(proc).sample()
    assert sample.cpu_percent == (0.0, 0.0)  # /proc/stat did not move during the first window
    assert sample.load == (1.5, 1.0, 0.5) and sample.memory.total == 16_000_000 * 1024
    assert [gpu.name for gpu in sample.gpus] == ["NVIDIA H200", "NVIDIA GeForce RTX 4090"]


def test_the_sampler_runs_the_gpu_tool_the_setting_names_and_none_when_it_is_empty(tmp_path, monkeypatch):
    tool = fake_tool(tmp_path, f"cat <<'CSV'\n{NVIDIA_SMI}CSV\n")
    monkeypatch.setenv("LLAMASWAP_NVIDIA_SMI", tool)  # not on PATH
    assert [gpu.id for gpu in SystemSampler(tmp_path / "no-proc").sample().gpus] == [0, 1]
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LLAMASWAP_NVIDIA_SMI", "")
    assert SystemSampler(tmp_path / "no-proc").sample().gpus == ()


def test_without_proc_or_gpu_tool_the_sample_is_empty_and_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = SystemSampler(tmp_path / "no-proc")
    with caplog.at_level("INFO", logger="llamaswap.performance"):
        assert sampler.sample() == Sample()
        sampler.sample()
    assert all(record.levelname == "INFO" for record in caplog.records)
    assert sum("no nvidia-smi" in record.getMessage() for record in caplog.records) == 1
    assert sum("no CPU, memory, load or network series" in record.getMessage() for record in caplog.records) == 1


def test_configure_starts_retimes_and_stops_the_thread(monkeypatch):
    sampler = SystemSampler()
    taken = []
    monkeypatch.setattr(sampler, "sample", lambda: taken.append(time.monotonic()) or Sample(load=(1.0, 1.0, 1.0)))
    sampler.configure(PerformanceConfig(every=3600))
    deadline = time.monotonic() + 5
    while sampler.latest is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.latest is not None and len(taken) == 1
    sampler.configure(PerformanceConfig(every=3600))  # a reload: sampled again at once, then on the new interval
    while len(taken) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(taken) == 2
    sampler.configure(PerformanceConfig(disabled=True))
    assert sampler.latest is None and sampler._thread is None


def _until(condition, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_failed_sampling_pass_is_logged_and_sampling_goes_on(monkeypatch, caplog):
    sampler = SystemSampler()
    passes = []

    def sample():
        passes.append(1)
        if len(passes) == 1:
            raise RuntimeError("boom")
        return Sample(load=(2.0, 2.0, 2.0))

    monkeypatch.setattr(sampler, "sample", sample)
    sampler.configure(PerformanceConfig(every=3600))
    try:
        assert _until(lambda: len(passes) == 1)
        sampler.configure(PerformanceConfig(every=3600))  # wakes the thread: it must still be there
        assert _until(lambda: sampler.latest is not None)
        assert sampler.latest.load == (2.0, 2.0, 2.0)
        assert any("sampling the system failed" in record.getMessage() for record in caplog.records)
    finally:
        sampler.stop()


def test_an_interval_too_long_to_wait_for_does_not_end_the_thread_and_a_reload_retimes_it(monkeypatch):
    sampler = SystemSampler()
    taken = []
    monkeypatch.setattr(sampler, "sample", lambda: taken.append(1) or Sample(load=(float(len(taken)),) * 3))
    sampler.configure(PerformanceConfig(every=99999999 * 3600.0))  # beyond threading.TIMEOUT_MAX
    try:
        assert _until(lambda: len(taken) == 1)
        time.sleep(0.1)
        assert sampler._thread.is_alive()
        sampler.configure(PerformanceConfig(every=3600))
        assert _until(lambda: len(taken) == 2)
    finally:
        sampler.stop()


def test_a_reload_restarts_a_thread_that_ended(monkeypatch):
    sampler = SystemSampler()
    taken = []
    monkeypatch.setattr(sampler, "sample", lambda: taken.append(1) or Sample(load=(1.0, 1.0, 1.0)))
    monkeypatch.setattr(sampler, "_run", lambda wake: None)  # a thread that ends at once, as one killed by a fault
    sampler.configure(PerformanceConfig(every=3600))
    assert _until(lambda: not sampler._thread.is_alive())
    monkeypatch.undo()
    monkeypatch.setattr(sampler, "sample", lambda: taken.append(1) or Sample(load=(1.0, 1.0, 1.0)))
    sampler.configure(PerformanceConfig(every=3600))
    try:
        assert _until(lambda: sampler.latest is not None)
    finally:
        sampler.stop()


def test_the_process_sampler_is_registered_for_metrics():
    from prometheus_client import REGISTRY

    assert any(
        isinstance(collector, SystemCollector) and collector.sampler is system_metrics.SAMPLER
        for collector in REGISTRY._collector_to_names
    )


def test_the_system_and_gpu_series_pass_promtool():
    import shutil
    import subprocess

    sampler = SystemSampler()
    sampler.latest = Sample(
        cpu_percent=(12.5,), memory=parse_meminfo(MEMINFO), load=(0.5, 0.25, 0.125), network=parse_net_dev(NET_DEV),
        gpus=parse_nvidia_smi(NVIDIA_SMI),
    )
    registry = CollectorRegistry()
    registry.register(SystemCollector(sampler))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus'); .ci/run installs it")
    text = generate_latest(registry).decode()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
