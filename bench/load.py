"""Nothing lost under load: many concurrent clients across bands and models, one serial GPU.

    .venv/bin/python bench/load.py [--clients 500] [--models 3]

The same run as tests/reliability/test_reliability_load.py at a size of your choosing: one stream
holds the GPU while every client queues (in waves of distinct priorities), then the queue drains
through fake models at `--tps 0`. Prints the request count, how long queueing and draining took,
the drain throughput, the service's CPU time and peak RSS (VmHWM), and checks that every request reached
the model exactly once, in priority-then-arrival order, with one terminal row each. Exits 1 if
anything was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cpu_seconds, load_average, machine, peak_rss_mib  # noqa: E402
from tests.reliability.serial_load import MODELS, load_config, nothing_lost, plan_requests, run_load  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served  # noqa: E402


@dataclass(frozen=True)
class LoadResult:
    requests: int
    models: tuple[str, ...]
    queueing_s: float  # all clients connected and queued behind the held GPU
    draining_s: float  # from releasing the GPU to the last answer
    cpu_s: float  # the service process's user + system time over the run
    peak_rss_mib: float
    problems: list[str]  # empty when every request was served once, in order

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.draining_s


def measure(clients: int, model_count: int) -> LoadResult:
    models = MODELS[:model_count]
    planned = plan_requests(clients, models)
    with tempfile.TemporaryDirectory(prefix="llamaswap-load-") as tmp:
        tmp_path = Path(tmp)
        events = tmp_path / "events.jsonl"
        with Served(tmp_path, load_config(events, models)) as served:
            cpu_before = cpu_seconds(served.proc.pid)
            run = asyncio.run(run_load(served, planned))
            rows = all_rows_terminal(served.data_dir, len(planned) + 1, timeout=60)
            cpu_used = cpu_seconds(served.proc.pid) - cpu_before
            peak_mib = peak_rss_mib(served.proc.pid)
            service_log = served.log()
        problems = nothing_lost(planned, run, events, rows, service_log)
    return LoadResult(len(planned), models, run.queueing_s, run.draining_s, cpu_used, peak_mib, problems)


HEADER = ("| clients | models | queueing s | draining s | requests/s (drain) | service CPU ms/request "
          "| peak RSS MiB | lost or misordered |\n|--:|--:|--:|--:|--:|--:|--:|---|")


def row(result: LoadResult) -> str:
    lost = "none" if not result.problems else "**" + "; ".join(result.problems) + "**"
    return (f"| {result.requests:,} | {len(result.models)} | {result.queueing_s:.2f} | {result.draining_s:.2f} "
            f"| {result.requests_per_s:.0f} | {result.cpu_s / result.requests * 1000:.1f} "
            f"| {result.peak_rss_mib:.0f} | {lost} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500, help="concurrent clients, one request each")
    parser.add_argument("--models", type=int, choices=range(1, len(MODELS) + 1), default=3,
                        help="how many fake models the requests are spread over")
    args = parser.parse_args(argv)

    load_before = load_average()
    result = measure(args.clients, args.models)
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/load.py --clients {args.clients} --models {args.models}")
    print()
    print(HEADER)
    print(row(result))
    if result.problems:
        print("\nLOST OR MISORDERED:\n  " + "\n  ".join(result.problems))
        return 1
    print("\nnothing lost: each request served once, in priority-then-arrival order, one terminal row each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
