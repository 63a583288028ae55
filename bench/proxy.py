"""What llamaswap itself costs a request: added latency, time to first chunk, the gap between serial jobs.

    .venv/bin/python bench/proxy.py [--requests 300] [--jobs 200] [--streams 100]

Starts its own `llamaswap serve` with one fake model at `--tps 0` (answers take microseconds), so
what remains is the proxy. Latency and first chunk compare the same request through llamaswap and
straight to the model, on one keep-alive client, alternating so drift hits both sides alike. The
dispatch gap is read from the model's own event log: the end of job n to the start of job n+1,
while `--jobs` requests wait in the serial queue."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e.conftest import db_rows  # noqa: E402
from tests.served import Served, fake_cmd, free_port, read_events  # noqa: E402

MODEL = "bench"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CONNECT_WAVE = 25  # new connections opened at once; daphne listens with a backlog of 50
TARGETS = {  # milliseconds, from the project's goals; reported, not enforced
    "dispatch gap": (1.0, 5.0),
    "added latency": (2.0, 10.0),
}


def config_text(events: Path) -> str:
    return f"""
        healthCheckTimeout: 15
        startPort: {free_port()}
        models:
          {MODEL}:
            cmd: {fake_cmd(MODEL, events, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "mean": statistics.fmean(ordered),
    }


def timed_pairs(proxy_call: Callable[[], None], direct_call: Callable[[], None], n: int) -> tuple[list[float], list[float]]:
    """Run both calls `n` times, alternating, after a short warm-up; return milliseconds per call."""
    for _ in range(20):
        proxy_call()
        direct_call()
    proxy_ms, direct_ms = [], []
    for _ in range(n):
        for call, samples in ((proxy_call, proxy_ms), (direct_call, direct_ms)):
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1000)
    return proxy_ms, direct_ms


def chat_call(client: httpx.Client, base: str) -> Callable[[], None]:
    def call() -> None:
        response = client.post(base + "/v1/chat/completions", json=CHAT)
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


async def queue_serial_jobs(served: Served, jobs: int) -> None:
    """Hold the model with a stream, queue `jobs` requests behind it, then let the queue drain.

    The jobs connect in waves of `CONNECT_WAVE`: a larger burst of new connections overflows the
    listen backlog, and the kernel's SYN retries then delay some of them by seconds.
    """
    limits = httpx.Limits(max_connections=jobs + 1, max_keepalive_connections=jobs + 1)
    async with httpx.AsyncClient(base_url=served.base, limits=limits, timeout=120) as client:
        blocker = {**CHAT, "stream": True, "fake": {"id": "blocker", "tokens": 100_000, "tps": 10}}
        async with client.stream("POST", "/v1/chat/completions", json=blocker) as held:
            lines = held.aiter_lines()  # kept: a dropped iterator would be finalised and close the stream
            await anext(lines)  # the blocker now owns the model
            pending = []
            for first in range(0, jobs, CONNECT_WAVE):
                pending += [
                    asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "fake": {"id": f"job-{i}"}}))
                    for i in range(first, min(first + CONNECT_WAVE, jobs))
                ]
                await wait_queued(served, len(pending))
        # Leaving the stream disconnects the blocker; the queue now runs back to back.
        responses = await asyncio.gather(*pending)
    failed = [r.status_code for r in responses if r.status_code != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} queued jobs failed: HTTP {sorted(set(failed))}")


async def wait_queued(served: Served, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (queued := len(db_rows(served.data_dir, "state='queued'"))) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {queued} of {count} jobs reached llamaswap's queue within {timeout:g} s")
        await asyncio.sleep(0.02)


def dispatch_gaps_ms(events_path: Path, jobs: int) -> list[float]:
    """End of job n to start of job n+1 at the model, in dispatch order; fails if two jobs overlapped."""
    events = [e for e in read_events(events_path) if str(e["id"]).startswith("job-")]
    starts = {e["id"]: e["t"] for e in events if e["event"] == "start"}
    ends = {e["id"]: e["t"] for e in events if e["event"] == "end"}
    if len(starts) != jobs or len(ends) != jobs:
        raise RuntimeError(f"the model saw {len(starts)} starts and {len(ends)} ends for {jobs} jobs")
    order = sorted(starts, key=starts.get)
    gaps = [(starts[nxt] - ends[prev]) * 1000 for prev, nxt in zip(order, order[1:])]
    if min(gaps) < 0:
        raise RuntimeError("two queued jobs ran at the same time: the serial scheduler did not serialise them")
    return gaps


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    return (f"{len(os.sched_getaffinity(0))} CPUs usable (nproc), {cpu}; "
            f"Python {platform.python_version()} on {platform.system()} {platform.release()}")


def load_average() -> str:
    """Other work on the machine skews every figure here; the table says how busy it was."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def cells(stats: dict[str, float] | None) -> list[str]:
    return [f"{stats[k]:.2f}" for k in ("p50", "p99", "mean")] if stats else ["", "", ""]


def row(name: str, through: list[float], direct: list[float] | None = None, target: str = "") -> str:
    """One table line; "added" is the per-pair difference, each pair measured back to back."""
    added = percentiles([t - d for t, d in zip(through, direct)]) if direct else None
    values = cells(percentiles(through)) + cells(percentiles(direct) if direct else None)
    values += [f"{added['p50']:+.2f}", f"{added['p99']:+.2f}"] if added else ["", ""]
    return f"| {name} | " + " | ".join(values) + f" | {target} |"


def verdict(name: str, samples: list[float]) -> str:
    stats = percentiles(samples)
    p50, p99 = TARGETS[name]
    met = stats["p50"] <= p50 and stats["p99"] <= p99
    return f"p50 ≤ {p50:g}, p99 ≤ {p99:g}: {'met' if met else 'MISSED'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="non-streaming requests per side")
    parser.add_argument("--jobs", type=int, default=200, help="serial jobs queued for the dispatch gap")
    parser.add_argument("--streams", type=int, default=100, help="streams per side for time to first chunk")
    args = parser.parse_args(argv)

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        events = Path(tmp) / "events.jsonl"
        with Served(Path(tmp), config_text(events)) as served, httpx.Client(timeout=30) as client:
            chat_call(client, served.base)()  # loads the model
            direct = httpx.get(served.base + "/running").json()["running"][0]["proxy"]
            chat = timed_pairs(chat_call(client, served.base), chat_call(client, direct), args.requests)
            first_chunk = timed_pairs(
                first_chunk_call(client, served.base), first_chunk_call(client, direct), args.streams)
            asyncio.run(queue_serial_jobs(served, args.jobs))
            gaps = dispatch_gaps_ms(events, args.jobs)  # every "end" is logged before its response's last bytes

    added_chat = [t - d for t, d in zip(*chat)]
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/proxy.py --requests {args.requests} --jobs {args.jobs} --streams {args.streams}")
    print()
    print("| ms | llamaswap p50 | p99 | mean | direct p50 | p99 | mean | added p50 | added p99 | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(row(f"chat, non-streaming ({args.requests}×)", *chat, target="added: " + verdict("added latency", added_chat)))
    print(row(f"first SSE chunk ({args.streams}×)", *first_chunk))
    print(row(f"dispatch gap ({args.jobs} queued jobs)", gaps, target=verdict("dispatch gap", gaps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
