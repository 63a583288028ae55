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
import os
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.reliability.serial_load import MODELS, load_config, nothing_lost, plan_requests, run_load  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served  # noqa: E402


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


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    return f"{len(os.sched_getaffinity(0))} CPUs usable, {cpu}; Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=500, help="concurrent clients, one request each")
    parser.add_argument("--models", type=int, choices=range(1, len(MODELS) + 1), default=3,
                        help="how many fake models the requests are spread over")
    args = parser.parse_args(argv)
    models = MODELS[: args.models]
    planned = plan_requests(args.clients, models)

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

    print(f"machine: {machine()}")
    print(f"command: .venv/bin/python bench/load.py --clients {args.clients} --models {args.models}")
    print(f"requests: {len(planned)} over {len(models)} models ({', '.join(models)})")
    print(f"queueing: {run.queueing_s:.2f} s (all clients connected and queued behind the held GPU)")
    print(f"draining: {run.draining_s:.2f} s, {len(planned) / run.draining_s:.0f} requests/s through the serial queue")
    print(f"service CPU: {cpu_used:.2f} s for the run, {cpu_used / len(planned) * 1000:.1f} ms per request")
    print(f"service peak RSS (VmHWM): {peak_mib:.0f} MiB")
    if problems:
        print("LOST OR MISORDERED:\n  " + "\n  ".join(problems))
        return 1
    print("nothing lost: each request served once, in priority-then-arrival order, one terminal row each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
