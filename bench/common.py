"""What the benchmark scripts share: the machine they ran on, percentiles, alternating timed calls,
process statistics, the served instance's queue and metrics.

Scripts run as `python bench/NAME.py` from the repository root; each puts the root on `sys.path`
before importing this module, so `bench`, `tests` and the project's packages all import."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.conftest import db_rows

REPO = Path(__file__).resolve().parent.parent
MODEL = "bench"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
PACKAGES = ("django", "channels", "daphne", "httpx")


# -- the machine -------------------------------------------------------------------------------

def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def machine() -> str:
    return (f"{len(os.sched_getaffinity(0))} CPUs usable (nproc), {cpu_model()}; "
            f"Python {platform.python_version()} on {platform.system()} {platform.release()}")


def load_average() -> str:
    """Other work on the machine skews every figure; each report says how busy it was."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


# -- statistics --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stats:
    n: int
    p50: float
    p95: float
    p99: float
    mean: float
    max: float


def stats(samples: list[float]) -> Stats:
    """Median and nearest-rank p95 and p99 (with fewer than 100 samples the p99 is the maximum or next to it)."""
    if not samples:
        raise ValueError("no samples to summarise")
    ordered = sorted(samples)

    def rank(share: float) -> float:
        return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]

    return Stats(len(ordered), statistics.median(ordered), rank(0.95), rank(0.99), statistics.fmean(ordered),
                 ordered[-1])


def timed_rounds(calls: dict[str, Callable[[], None]], rounds: int, warmup: int = 20,
                 shift: int = 0) -> dict[str, list[float]]:
    """Milliseconds per call for each named call, run in turn `rounds` times after a warm-up.

    Running the targets back to back within a round means drift on a shared machine hits them all
    alike, so per-round differences compare like with like. Each round starts `shift` calls further
    along the order: with several (direct, through) pairs and `shift` 2, every pair's calls follow
    each pair's trailing work in turn, not always the same one's."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(rounds):
        start = index * shift % len(names)
        for name in names[start:] + names[:start]:
            call = calls[name]
            started = time.perf_counter()
            call()
            samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def added(through: list[float], direct: list[float]) -> list[float]:
    """What the proxy added in each round: the same request through it minus straight to the model."""
    return [t - d for t, d in zip(through, direct, strict=True)]


# -- requests ----------------------------------------------------------------------------------

def chat_call(client: httpx.Client, base: str, body: dict | None = None) -> Callable[[], None]:
    """One non-streaming chat completion against `base` (a proxy or the model itself)."""
    def call() -> None:
        response = client.post(base + "/v1/chat/completions", json=body or CHAT)
        if response.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {response.status_code}: {response.text[:300]}")
    return call


def first_chunk_call(client: httpx.Client, base: str) -> Callable[[], None]:
    """Returns once the first SSE `data:` line has arrived (the rest of the stream is then drained)."""
    def call() -> None:
        with client.stream("POST", base + "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{base}: HTTP {response.status_code}")
            for line in response.iter_lines():
                if line.startswith("data:"):
                    return
            raise RuntimeError(f"{base}: stream ended without a data: line")
    return call


# -- the served instance -----------------------------------------------------------------------

async def until_queued(data_dir: Path, count: int, timeout: float = 30) -> None:
    """Wait until `count` requests are queued in the service's request table."""
    deadline = time.monotonic() + timeout
    while (queued := len(db_rows(data_dir, "state='queued'"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {queued} of {count} requests reached llamaswap's queue within {timeout:g} s")
        await asyncio.sleep(0.02)


def metric_total(base: str, name: str) -> float:
    """The sum over all label sets of one Prometheus series from the service's /metrics."""
    text = httpx.get(base + "/metrics", timeout=10).raise_for_status().text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def direct_base(base: str) -> str:
    """The loaded model's own address, from the service's /running."""
    running = httpx.get(base + "/running", timeout=10).raise_for_status().json()["running"]
    if len(running) != 1:
        raise RuntimeError(f"expected exactly one loaded model, /running lists {running}")
    return running[0]["proxy"]


# -- processes ---------------------------------------------------------------------------------

def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM line")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": utime and stime are fields 12, 13
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
