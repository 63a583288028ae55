"""Interactive wait under batch saturation: the serial scheduler against fifo, same model, same load.

    .venv/bin/python bench/interactive.py [--jobs 50] [--job-seconds 1] [--every 3]

One model server with a single slot (bench/single_slot_model.py, like llama-server with
`--parallel 1`). At the start `--jobs` batch requests of `--job-seconds` each are sent at once;
then an interactive request (tiny: one token at once) is sent every `--every` seconds, each
shifted by a random part of a job, until the batch work is done. The interactive request's wait is its response time at the client, which for
a request that costs nothing is the time it spent waiting for the GPU.

- serial: every request waits in llamaswap's queue and the best score goes next, so an interactive
  request waits at most for the batch job in progress (target: p99 ≤ one job + 50 ms).
- fifo: llamaswap's fifo scheduler lets every request for a ready model through at once (its fast
  path) and the model server's own queue, first come first served, decides: an interactive request
  waits behind every batch job sent before it. `concurrencyLimit` is raised above the number of
  requests in flight; at llama-swap's default of 10, fifo would instead refuse the 11th request
  (batch or interactive) with 429.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import MODEL, Stats, load_average, machine, stats  # noqa: E402
from tests.e2e.conftest import db_rows  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served, model_ports  # noqa: E402

SINGLE_SLOT_MODEL = Path(__file__).resolve().parent / "single_slot_model.py"
SCHEDULERS = ("serial", "fifo")
SLACK_S = 0.05


@dataclass(frozen=True)
class Saturation:
    scheduler: str
    interactive_ms: list[float]  # response time at the client of each interactive request
    queue_wait_ms: list[float]  # the same requests' wait in llamaswap's queue (arrival to dispatch)
    batch_seconds: float  # from sending the batch to its last answer

    @property
    def wait(self) -> Stats:
        return stats(self.interactive_ms)


def config_text(scheduler: str, jobs: int) -> str:
    model = {
        "cmd": f"{sys.executable} {SINGLE_SLOT_MODEL} --port ${{PORT}} --model {MODEL} --tps 0",
        "proxy": "http://127.0.0.1:${PORT}",
        "concurrencyLimit": jobs + 100,  # fifo admits every request; serial ignores the limit
    }
    return yaml.safe_dump({
        "healthCheckTimeout": 15,
        "startPort": model_ports(1),
        "models": {MODEL: model},
        "routing": {"scheduler": {"use": scheduler}},
    }, sort_keys=False)


def chat(priority: str, **fake) -> tuple[dict, dict]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "fake": fake}
    return body, {"X-LlamaSwap-Priority": priority}


async def saturate(served: Served, scheduler: str, jobs: int, job_seconds: float,
                   every: float) -> tuple[list[float], float]:
    """Send the batch, then interactive requests on a fixed schedule; returns their ms and the batch's s."""
    limits = httpx.Limits(max_connections=jobs + 200, max_keepalive_connections=jobs + 200)
    async with httpx.AsyncClient(base_url=served.base, limits=limits, timeout=jobs * job_seconds + 120) as client:
        async def post(priority: str, **fake) -> float:
            body, headers = chat(priority, **fake)
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"{scheduler}: a {priority} request got HTTP {response.status_code}: "
                                   f"{response.text[:300]}")
            return (time.perf_counter() - started) * 1000

        await post("normal")  # loads the model
        began = time.perf_counter()
        phases = random.Random(1)
        async with asyncio.TaskGroup() as requests:  # one failure cancels the rest
            batch = [requests.create_task(post("batch", delay=job_seconds)) for _ in range(jobs)]
            interactive = []
            while not all(task.done() for task in batch):
                # The load pattern's own clock: one interactive request every `every` seconds, each
                # shifted by a random part of a job so arrivals fall anywhere within the job they wait for.
                due = began + every * (len(interactive) + 1) + phases.uniform(0, job_seconds)
                await asyncio.wait(batch, timeout=due - time.perf_counter())
                if not all(task.done() for task in batch):
                    interactive.append(requests.create_task(post("interactive")))
            await asyncio.gather(*batch)
            batch_seconds = time.perf_counter() - began
        return [task.result() for task in interactive], batch_seconds


def queue_waits_ms(data_dir: Path) -> list[float]:
    """Arrival to dispatch of the interactive requests, from the service's request table."""
    def at(value: str) -> datetime:
        return datetime.fromisoformat(value)

    rows = db_rows(data_dir, "priority >= 50 AND dispatched_at IS NOT NULL")
    return [(at(r["dispatched_at"]) - at(r["arrived_at"])).total_seconds() * 1000 for r in rows]


def measure(scheduler: str, jobs: int, job_seconds: float, every: float) -> Saturation:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with Served(Path(tmp), config_text(scheduler, jobs)) as served:
            interactive_ms, batch_seconds = asyncio.run(saturate(served, scheduler, jobs, job_seconds, every))
            if not interactive_ms:
                raise RuntimeError(f"the batch finished before the first interactive request at {every:g} s")
            all_rows_terminal(served.data_dir, None, timeout=30)
            waits = queue_waits_ms(served.data_dir)
    return Saturation(scheduler, interactive_ms, waits, batch_seconds)


def target_s(job_seconds: float) -> float:
    return job_seconds + SLACK_S


def rows(results: list[Saturation], job_seconds: float) -> list[str]:
    """Table lines: interactive wait at the client, llamaswap's own queue wait, the batch's duration."""
    lines = []
    for result in results:
        wait, queued = result.wait, stats(result.queue_wait_ms)
        verdict = ""
        if result.scheduler == "serial":
            met = wait.p99 <= target_s(job_seconds) * 1000
            verdict = f"p99 ≤ {target_s(job_seconds) * 1000:g} ms: {'met' if met else 'MISSED'}"
        lines.append(
            f"| {result.scheduler} | {wait.n} | {wait.p50:,.0f} | {wait.p99:,.0f} | {wait.max:,.0f} "
            f"| {queued.p50:,.0f} | {queued.max:,.0f} | {result.batch_seconds:.1f} | {verdict} |"
        )
    return lines


HEADER = ("| scheduler | interactive requests | wait p50 ms | p99 | max | in llamaswap's queue p50 ms | max "
          "| batch done s | target |\n|---|--:|--:|--:|--:|--:|--:|--:|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help="batch jobs sent at once")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="how long each batch job holds the model")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between interactive requests")
    parser.add_argument("--scheduler", choices=SCHEDULERS, action="append", help="default: both")
    args = parser.parse_args(argv)

    load_before = load_average()
    results = [measure(s, args.jobs, args.job_seconds, args.every) for s in args.scheduler or SCHEDULERS]
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/interactive.py --jobs {args.jobs} --job-seconds {args.job_seconds:g} "
          f"--every {args.every:g}")
    print()
    print(HEADER)
    print("\n".join(rows(results, args.job_seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
