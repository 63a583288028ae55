"""The machine's CPU, memory, load, network and NVIDIA GPUs in /metrics, under llama-swap's names.

A background thread samples every `performance.every` seconds (reading /proc and
running `nvidia-smi`), so a scrape never waits on a slow or hung GPU tool and never
runs on the event loop: the collector only hands out the latest sample. Where a
source is missing (no /proc off Linux, no nvidia-smi on a machine without an NVIDIA
GPU) its series are left out; that is said once, quietly.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.model_processes.gpu_memory import COMMAND_SETTING, nvidia_smi_command, whole_number

log = logging.getLogger("llamaswap.performance")

PROC = Path("/proc")
GPU_TOOL_TIMEOUT_S = 5.0  # nvidia-smi answers in well under a second; a wedged driver must not stall sampling
FIRST_CPU_WINDOW_S = 0.25  # CPU use needs two readings; the first sample waits this long between them
MIB = 1024 * 1024

NVIDIA_SMI_FIELDS = (
    "index", "name", "uuid", "temperature.gpu", "temperature.memory", "utilization.gpu", "utilization.memory",
    "memory.used", "memory.total", "fan.speed", "power.draw",
)


@dataclass(frozen=True)
class Memory:
    total: int
    used: int  # total less what is available (page cache that can be dropped counts as free)
    free: int
    swap_total: int
    swap_used: int


@dataclass(frozen=True)
class Gpu:
    id: int
    name: str
    uuid: str
    values: dict[str, float]  # metric name -> value; a value nvidia-smi reports as N/A is absent


@dataclass(frozen=True)
class Sample:
    cpu_percent: tuple[float, ...] = ()
    memory: Memory | None = None
    load: tuple[float, float, float] | None = None
    network: dict[str, tuple[int, int]] = field(default_factory=dict)  # interface -> (received, sent) bytes
    gpus: tuple[Gpu, ...] = ()


# -- /proc -----------------------------------------------------------------------------------------


def parse_cpu_times(text: str) -> tuple[tuple[int, int], ...]:
    """(busy, total) jiffies of each core, in /proc/stat order (`cpu0`, `cpu1`…; the `cpu` total is skipped)."""
    cores = []
    for line in text.splitlines():
        name, *fields = line.split() or [""]
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        cores.append((sum(ticks) - idle, sum(ticks)))
    return tuple(cores)


def cpu_percent(before: tuple[tuple[int, int], ...], after: tuple[tuple[int, int], ...]) -> tuple[float, ...]:
    """Each core's busy share (0-100) between two readings; a core that came online in between reads 0."""
    percents = []
    for (busy0, total0), (busy1, total1) in zip(before, after, strict=False):
        elapsed = total1 - total0
        percents.append(round(100.0 * (busy1 - busy0) / elapsed, 2) if elapsed > 0 else 0.0)
    percents += [0.0] * (len(after) - len(before))
    return tuple(percents)


def parse_meminfo(text: str) -> Memory:
    kib = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and whole_number(parts[0]):
            kib[name] = int(parts[0]) * 1024
    total = kib.get("MemTotal", 0)
    free = kib.get("MemFree", 0)
    available = kib.get("MemAvailable", free + kib.get("Buffers", 0) + kib.get("Cached", 0))
    swap_total = kib.get("SwapTotal", 0)
    return Memory(total, max(total - available, 0), free, swap_total, max(swap_total - kib.get("SwapFree", 0), 0))


def parse_loadavg(text: str) -> tuple[float, float, float]:
    one, five, fifteen = (float(value) for value in text.split()[:3])
    return one, five, fifteen


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """Bytes received and sent by each interface, from /proc/net/dev (two header lines, then one per interface)."""
    counters = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and len(fields) >= 9:
            counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


# -- nvidia-smi ------------------------------------------------------------------------------------

_GPU_VALUES = (  # metric name, nvidia-smi field, factor to the metric's unit
    ("llamaswap_gpu_temperature_celsius", "temperature.gpu", 1),
    ("llamaswap_gpu_vram_temperature_celsius", "temperature.memory", 1),
    ("llamaswap_gpu_util_percent", "utilization.gpu", 1),
    ("llamaswap_gpu_memory_util_percent", "utilization.memory", 1),
    ("llamaswap_gpu_memory_used_bytes", "memory.used", MIB),
    ("llamaswap_gpu_memory_total_bytes", "memory.total", MIB),
    ("llamaswap_gpu_fan_speed_percent", "fan.speed", 1),
    ("llamaswap_gpu_power_draw_watts", "power.draw", 1),
)
GPU_HELP = {
    "llamaswap_gpu_temperature_celsius": "GPU temperature in degrees Celsius.",
    "llamaswap_gpu_vram_temperature_celsius": "GPU memory (VRAM) temperature in degrees Celsius.",
    "llamaswap_gpu_util_percent": "GPU utilization percent (0-100).",
    "llamaswap_gpu_memory_util_percent": "GPU memory bandwidth utilization percent (0-100).",
    "llamaswap_gpu_memory_used_bytes": "GPU memory in use, in bytes.",
    "llamaswap_gpu_memory_total_bytes": "GPU memory in total, in bytes.",
    "llamaswap_gpu_fan_speed_percent": "GPU fan speed percent (0-100).",
    "llamaswap_gpu_power_draw_watts": "GPU power draw in watts.",
}


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits` output, one line per GPU."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(NVIDIA_SMI_FIELDS) or not whole_number(cells[0]):
            continue
        row = dict(zip(NVIDIA_SMI_FIELDS, cells, strict=True))
        values = {}
        for metric, name, factor in _GPU_VALUES:
            try:
                values[metric] = float(row[name]) * factor
            except ValueError:  # "[N/A]", "[Not Supported]": the GPU does not report it
                continue
        gpus.append(Gpu(int(row["index"]), row["name"], row["uuid"], values))
    return tuple(gpus)


def query_nvidia_smi(executable: str, timeout: float = GPU_TOOL_TIMEOUT_S) -> str:
    """Run nvidia-smi, killing it (and anything it started) when it outlives `timeout`."""
    command = [executable, f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RuntimeError(f"{executable} did not answer within {timeout:g}s") from None
    if process.returncode != 0:
        detail = (err or out).strip().splitlines()
        raise RuntimeError(f"{executable} exited with {process.returncode}: {detail[0] if detail else 'no output'}")
    return out


# -- sampling --------------------------------------------------------------------------------------


class _Once:
    """Say each distinct thing once: a machine without a GPU is normal, not worth a line per sample."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def info(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            log.info("%s", message)


class SystemSampler:
    """Takes a `Sample` every `every` seconds on its own thread; `latest` is the newest one (None when off)."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self.every = 5.0
        self.latest: Sample | None = None
        self._cpu: tuple[tuple[int, int], ...] | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._once = _Once()

    def configure(self, performance) -> None:
        """Start, stop or retime to match the config's `performance:` (at start and on every reload)."""
        if performance.disabled:
            self.stop()
            return
        self.every = performance.every
        if self._thread is None or not self._thread.is_alive():  # not started, or ended by a fault
            self._wake = threading.Event()  # its own: a thread still finishing after a stop must not be woken
            self._thread = threading.Thread(target=self._run, args=(self._wake,), name="llamaswap-performance", daemon=True)
            self._thread.start()
        else:
            self._wake.set()  # the new interval applies from now

    def stop(self) -> None:
        """Stop publishing at once; the thread ends after the sample it may be taking (it never blocks the caller,
        which may be the event loop)."""
        if self._thread is not None:
            self._thread = None
            self._wake.set()
        self.latest = None
        self._cpu = None

    def _run(self, wake: threading.Event) -> None:
        current = threading.current_thread()
        while self._thread is current:
            try:
                sample = self.sample()
            except Exception:  # a sampler bug must not end sampling for the life of the service
                log.exception("sampling the system failed")
            else:
                if self._thread is current:  # a sample finished after a stop stays unpublished
                    self.latest = sample
            wake.wait(min(self.every, threading.TIMEOUT_MAX))  # beyond TIMEOUT_MAX, wait raises and the thread ends
            wake.clear()

    def sample(self) -> Sample:
        cpu = self._cpu_percent()
        meminfo, loadavg, net_dev = (self._read(name) for name in ("meminfo", "loadavg", "net/dev"))
        return Sample(
            cpu_percent=cpu,
            memory=parse_meminfo(meminfo) if meminfo else None,
            load=parse_loadavg(loadavg) if loadavg else None,
            network=parse_net_dev(net_dev) if net_dev else {},
            gpus=self._gpus(),
        )

    def _read(self, name: str) -> str | None:
        try:
            return (self.proc / name).read_text()
        except OSError as exc:
            if not self.proc.is_dir():
                self._once.info(f"no {self.proc} here (not Linux): no CPU, memory, load or network series in /metrics")
            else:
                self._once.info(f"{self.proc / name} is not readable ({exc.strerror}): its series are left out of /metrics")
            return None

    def _cpu_percent(self) -> tuple[float, ...]:
        text = self._read("stat")
        if text is None:
            return ()
        now = parse_cpu_times(text)
        if self._cpu is None:  # the first sample: measure over a short window rather than since boot
            self._wake.wait(FIRST_CPU_WINDOW_S)
            self._cpu, text = now, self._read("stat")
            now = parse_cpu_times(text) if text else now
        before, self._cpu = self._cpu, now
        return cpu_percent(before, now)

    def _gpus(self) -> tuple[Gpu, ...]:
        executable = nvidia_smi_command()
        if executable is None:
            self._once.info(f"no nvidia-smi (on PATH, or as {COMMAND_SETTING} names): no GPU series in /metrics")
            return ()
        try:
            return parse_nvidia_smi(query_nvidia_smi(executable))
        except (OSError, RuntimeError) as exc:
            self._once.info(f"GPU series left out of /metrics: {exc}")
            return ()


class SystemCollector:
    """Yields the latest sample as llama-swap's `llamaswap_*` system and GPU series; nothing while sampling is off."""

    def __init__(self, sampler: SystemSampler) -> None:
        self.sampler = sampler

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families depend on the machine; none is known ahead

    def collect(self) -> Iterator[Metric]:
        sample = self.sampler.latest
        if sample is None:
            return
        if sample.cpu_percent:
            cpu = GaugeMetricFamily("llamaswap_cpu_util_percent", "CPU utilization per core (0-100).", labels=["core"])
            for core, percent in enumerate(sample.cpu_percent):
                cpu.add_metric([str(core)], percent)
            yield cpu
        if sample.memory is not None:
            memory = sample.memory
            for name, help_text, value in (
                ("llamaswap_memory_total_bytes", "Memory in total, in bytes.", memory.total),
                ("llamaswap_memory_used_bytes", "Memory in use (total less available), in bytes.", memory.used),
                ("llamaswap_memory_free_bytes", "Free memory, in bytes.", memory.free),
                ("llamaswap_swap_total_bytes", "Operating system swap space in total, in bytes.", memory.swap_total),
                ("llamaswap_swap_used_bytes", "Operating system swap space in use, in bytes.", memory.swap_used),
            ):
                yield GaugeMetricFamily(name, help_text, value=value)
        if sample.load is not None:
            load = GaugeMetricFamily("llamaswap_load_average", "System load average.", labels=["interval"])
            for interval, value in zip(("1m", "5m", "15m"), sample.load, strict=True):
                load.add_metric([interval], value)
            yield load
        if sample.network:
            network = CounterMetricFamily(
                "llamaswap_network_bytes", "Network bytes by interface and direction, since boot.",
                labels=["interface", "direction"],
            )
            for interface, (received, sent) in sorted(sample.network.items()):
                network.add_metric([interface, "recv"], received)
                network.add_metric([interface, "sent"], sent)
            yield network
        if sample.gpus:
            yield from _gpu_families(sample.gpus)


def _gpu_families(gpus: tuple[Gpu, ...]) -> Iterator[Metric]:
    for metric, _, _ in _GPU_VALUES:
        family = GaugeMetricFamily(metric, GPU_HELP[metric], labels=["id", "name", "uuid"])
        for gpu in sorted(gpus, key=lambda gpu: gpu.id):
            if metric in gpu.values:
                family.add_metric([str(gpu.id), gpu.name, gpu.uuid], gpu.values[metric])
        if family.samples:
            yield family


SAMPLER = SystemSampler()
REGISTRY.register(SystemCollector(SAMPLER))
