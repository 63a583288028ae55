"""What the Batch API costs a line, and what a large batch costs the service's memory.

    .venv/bin/python bench/batches.py [--lines 10000] [--memory-lines 10000 50000 100000]

Starts its own `llamaswap serve` with one fake model at `--tps 0` and one slot. The same tiny chat requests run
twice: as one batch of `--lines` lines (the runner sends one at a time: the model's one slot), and from a client
sending them itself, one after another (the same concurrency) through the same service. Added per line is the
batch's wall time from `in_progress` to `completed` less the client's, over the lines. Memory: for each
`--memory-lines` file, a fresh service's peak RSS (VmHWM) after uploading it, creating the batch, waiting for its
lines to be read into rows, cancelling it and waiting for its files to be written, and how long that cancel took (a batch file holds at most
50 000 lines by default, as OpenAI's; the service is given `maxBatchFileLines` for the larger files)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CHAT, MODEL, chat_call, peak_rss_mib  # noqa: E402
from bench.proxy import served_model  # noqa: E402
from tests.served import wait_until  # noqa: E402

TARGET_ADDED_MS = 2.0
ENDED = {"completed", "failed", "expired", "cancelled"}


@dataclass(frozen=True)
class PerLine:
    lines: int
    batch_s: float
    client_s: float

    @property
    def added_ms(self) -> float:
        return (self.batch_s - self.client_s) / self.lines * 1000


def jsonl(lines: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions",
                                "body": CHAT}).encode() + b"\n" for n in range(lines))


def ended(api: openai.OpenAI, batch_id: str, timeout: float):
    return wait_until(lambda: (b := api.batches.retrieve(batch_id)).status in ENDED and b, timeout, 0.05,
                      f"batch {batch_id} to end")


def measure_per_line(lines: int) -> PerLine:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with served_model(Path(tmp)) as (served, _), httpx.Client(timeout=60) as client:
            call = chat_call(client, served.base)
            started = time.monotonic()
            for _ in range(lines):
                call()
            client_s = time.monotonic() - started
            api = openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0)
            uploaded = api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
            batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
            done = ended(api, batch.id, 60 + lines * 0.1)
            if done.status != "completed" or done.request_counts.completed != lines:
                raise RuntimeError(f"the batch ended {done.status} with {done.request_counts}")
    return PerLine(lines, done.completed_at - done.in_progress_at, client_s)


@dataclass(frozen=True)
class LargeBatch:
    peak_mib: float  # the service's peak RSS through it all
    cancel_s: float  # from the cancel's answer to the batch `cancelled`, its files written


def large_batch(lines: int) -> LargeBatch:
    """A `lines`-line batch read into rows, cancelled and its files written: the service's peak RSS, and how long
    the cancel took to end every line."""
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with served_model(Path(tmp), f"maxBatchFileLines: {max(lines, 50_000)}\n") as (served, _):
            api = openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0, timeout=600)
            uploaded = api.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
            batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                       completion_window="24h")
            wait_until(lambda: api.batches.retrieve(batch.id).request_counts.total == lines, 600, 0.2,
                       "the lines to be read")
            api.batches.cancel(batch.id)
            asked = time.monotonic()
            ended(api, batch.id, 600)
            return LargeBatch(peak_rss_mib(served.proc.pid), time.monotonic() - asked)


def per_line_table(result: PerLine) -> list[str]:
    return ["| lines | batch, in_progress → completed | client, one after another | added per line |",
            "| ---: | ---: | ---: | ---: |",
            f"| {result.lines:,} | {result.batch_s:.1f} s | {result.client_s:.1f} s | {result.added_ms:.2f} ms |"]


def memory_table(large: dict[int, LargeBatch]) -> list[str]:
    return ["| lines in the file | service peak RSS | cancel → cancelled |", "| ---: | ---: | ---: |",
            *(f"| {lines:,} | {run.peak_mib:.0f} MiB | {run.cancel_s:.1f} s |" for lines, run in large.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--memory-lines", type=int, nargs="*", default=[10_000, 50_000, 100_000])
    args = parser.parse_args()
    result = measure_per_line(args.lines)
    print("\n".join(per_line_table(result)))
    print(f"\ntarget: ≤ {TARGET_ADDED_MS:g} ms added per line ({MODEL}, one slot)\n")
    print("\n".join(memory_table({lines: large_batch(lines) for lines in args.memory_lines})))


if __name__ == "__main__":
    main()
