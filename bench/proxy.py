"""What llamaswap itself costs a request: added latency, time to first chunk, the gap between serial jobs.

    .venv/bin/python bench/proxy.py [--requests 300] [--jobs 200] [--streams 100]

Starts its own `llamaswap serve` with one fake model at `--tps 0` (answers take microseconds), so
what remains is the proxy. Latency and first chunk compare the same request through llamaswap and
straight to the model, on one keep-alive client, alternating so drift hits both sides alike. The
dispatch gap is read from the model's own event log: the end of job n to the start of job n+1,
while `--jobs` requests wait in the serial queue; the same gap with one client sending straight
to the model, request after request, is the floor it is compared with."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CHAT, MODEL, added, chat_call, direct_base, first_chunk_call, load_average, machine, stats, timed_rounds,
    until_queued,
)
from tests.served import Served, fake_cmd, model_ports, read_events  # noqa: E402

CONNECT_WAVE = 25  # new connections opened at once while filling the queue
TARGETS_MS = {  # from the project's goals; reported, not enforced
    "dispatch gap": (1.0, 5.0),
    "added latency": (2.0, 10.0),
    "first chunk added": (2.0, None),
}


def config_text(events: Path) -> str:
    return f"""
        healthCheckTimeout: 15
        startPort: {model_ports(1)}
        models:
          {MODEL}:
            cmd: {fake_cmd(MODEL, events, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
    """


@contextmanager
def served_model(tmp: Path, more_config: str = "") -> Iterator[tuple[Served, Path]]:
    """llamaswap with the one fake model loaded (`more_config`: top-level keys added to its config); yields the
    service and the model's event log."""
    events = tmp / "events.jsonl"
    with Served(tmp, textwrap.dedent(config_text(events)) + more_config) as served:
        with httpx.Client(timeout=30) as client:
            chat_call(client, served.base)()  # loads the model
        yield served, events


@dataclass(frozen=True)
class Overhead:
    """Milliseconds per request by target ("direct" is the model itself), one sample per round."""

    chat: dict[str, list[float]]
    first_chunk: dict[str, list[float]]


def measure_overhead(client: httpx.Client, targets: dict[str, str], requests: int, streams: int) -> Overhead:
    """Tiny chat requests and first SSE chunks against every target in turn, round after round."""
    chat = timed_rounds({name: chat_call(client, base) for name, base in targets.items()}, requests)
    first = timed_rounds({name: first_chunk_call(client, base) for name, base in targets.items()}, streams)
    return Overhead(chat, first)


async def queue_serial_jobs(served: Served, jobs: int) -> None:
    """Hold the model with a stream, queue `jobs` requests behind it, then let the queue drain.

    The jobs connect in waves of `CONNECT_WAVE`, each once the previous one is queued, so the
    service's accept backlog never decides the order or adds SYN-retry delays.
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
                await until_queued(served.data_dir, len(pending))
        # Leaving the stream disconnects the blocker; the queue now runs back to back.
        responses = await asyncio.gather(*pending)
    failed = [r.status_code for r in responses if r.status_code != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} queued jobs failed: HTTP {sorted(set(failed))}")


def dispatch_gaps_ms(served: Served, events_path: Path, jobs: int) -> list[float]:
    """Queue `jobs` serial jobs and return, in dispatch order, end of job n to start of job n+1 at the model."""
    asyncio.run(queue_serial_jobs(served, jobs))
    return gaps_at_model(events_path, "job-", jobs)


def floor_gaps_ms(model_base: str, events_path: Path, jobs: int) -> list[float]:
    """The same gap with one client straight to the model, each request sent once the previous answer
    is read: what the model and a client cost between two jobs, the floor for any proxy."""
    with httpx.Client(timeout=30) as client:
        for index in range(jobs):
            chat_call(client, model_base, {**CHAT, "fake": {"id": f"direct-{index}"}})()
    return gaps_at_model(events_path, "direct-", jobs)


def gaps_at_model(events_path: Path, prefix: str, jobs: int) -> list[float]:
    """From the model's event log: end of job n to start of job n+1, for the ids starting with `prefix`.

    The model logs "end" before a response's last bytes, so every answered job has both events."""
    events = [e for e in read_events(events_path) if str(e["id"]).startswith(prefix)]
    starts = {e["id"]: e["t"] for e in events if e["event"] == "start"}
    ends = {e["id"]: e["t"] for e in events if e["event"] == "end"}
    if len(starts) != jobs or len(ends) != jobs:
        raise RuntimeError(f"the model saw {len(starts)} starts and {len(ends)} ends for {jobs} jobs")
    order = sorted(starts, key=starts.get)
    gaps = [(starts[nxt] - ends[prev]) * 1000 for prev, nxt in zip(order, order[1:])]
    if min(gaps) < 0:
        raise RuntimeError("two jobs ran at the same time: they were not serialised")
    return gaps


def verdict(target: str, samples: list[float]) -> str:
    """"met" or "MISSED" against the p50 (and p99, where there is one) target in milliseconds."""
    summary = stats(samples)
    p50, p99 = TARGETS_MS[target]
    met = summary.p50 <= p50 and (p99 is None or summary.p99 <= p99)
    limits = f"p50 ≤ {p50:g} ms" + (f", p99 ≤ {p99:g} ms" if p99 is not None else "")
    return f"{limits}: {'met' if met else 'MISSED'}"


def overhead_table(title: str, samples: dict[str, list[float]]) -> list[str]:
    """One row per target; "added" is the per-round difference to the model itself ("direct")."""
    lines = [f"| {title} | p50 ms | p99 | mean | added p50 | added p99 |", "|---|--:|--:|--:|--:|--:|"]
    for name, through in samples.items():
        summary = stats(through)
        cells = [f"{summary.p50:.2f}", f"{summary.p99:.2f}", f"{summary.mean:.2f}"]
        if name == "direct":
            cells += ["", ""]
        else:
            extra = stats(added(through, samples["direct"]))
            cells += [f"{extra.p50:+.2f}", f"{extra.p99:+.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def gap_table(gaps: list[float], floor: list[float]) -> list[str]:
    lines = [f"| gap between serial jobs at the model, {len(gaps) + 1} jobs | p50 ms | p99 | mean | max |",
             "|---|--:|--:|--:|--:|"]
    for name, samples in (("queued in llamaswap (dispatch gap)", gaps),
                          ("one client straight to the model, sequential (floor)", floor)):
        summary = stats(samples)
        lines.append(f"| {name} | {summary.p50:.2f} | {summary.p99:.2f} | {summary.mean:.2f} | {summary.max:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="non-streaming requests per side")
    parser.add_argument("--jobs", type=int, default=200, help="serial jobs queued for the dispatch gap")
    parser.add_argument("--streams", type=int, default=100, help="streams per side for time to first chunk")
    args = parser.parse_args(argv)

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with served_model(Path(tmp)) as (served, events), httpx.Client(timeout=30) as client:
            targets = {"direct": direct_base(served.base), "llamaswap": served.base}
            overhead = measure_overhead(client, targets, args.requests, args.streams)
            gaps = dispatch_gaps_ms(served, events, args.jobs)
            floor = floor_gaps_ms(targets["direct"], events, args.jobs)

    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/proxy.py --requests {args.requests} --jobs {args.jobs} --streams {args.streams}")
    print()
    print("\n".join(overhead_table(f"chat, non-streaming, {args.requests} rounds", overhead.chat)))
    print()
    print("\n".join(overhead_table(f"first SSE chunk, {args.streams} rounds", overhead.first_chunk)))
    print()
    print("\n".join(gap_table(gaps, floor)))
    print()
    print("added latency:", verdict("added latency", added(overhead.chat["llamaswap"], overhead.chat["direct"])))
    print("first chunk added:", verdict("first chunk added",
                                        added(overhead.first_chunk["llamaswap"], overhead.first_chunk["direct"])))
    print("dispatch gap:", verdict("dispatch gap", gaps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
