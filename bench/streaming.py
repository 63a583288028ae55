"""Streaming throughput: one long stream of small chunks, as fast as the model can write them.

    .venv/bin/python bench/streaming.py [--tokens 20000] [--rounds 5]

The fake model runs at `--tps 0`, so each of its SSE events (one per token) is written as soon as
the previous one is; `max_tokens` sets the stream's length, which every OpenAI-compatible proxy
passes on. Each round streams once through llamaswap and once straight to the model, back to
back, and the ratio of the two rates is taken per round."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CHAT, direct_base, load_average, machine  # noqa: E402
from bench.proxy import served_model  # noqa: E402

TARGET_RATIO = 0.9


@dataclass(frozen=True)
class StreamRun:
    seconds: float  # request sent to last byte read
    bytes: int
    events: int  # SSE `data:` lines the client received

    def tokens_per_second(self, tokens: int) -> float:
        return tokens / self.seconds


def stream_once(client: httpx.Client, base: str, tokens: int) -> StreamRun:
    """Read one whole stream of `tokens` tokens as raw bytes, without parsing it on the way."""
    body = {**CHAT, "max_tokens": tokens, "stream": True}
    started = time.perf_counter()
    with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{base}: HTTP {response.status_code}: {response.read()[:300]!r}")
        data = b"".join(response.iter_raw())
    elapsed = time.perf_counter() - started
    events = data.count(b"data:")
    if events < tokens or b"[DONE]" not in data:
        raise RuntimeError(f"{base}: the stream carried {events} events for {tokens} tokens")
    return StreamRun(elapsed, len(data), events)


def measure_streams(client: httpx.Client, targets: dict[str, str], tokens: int, rounds: int) -> dict[str, list[StreamRun]]:
    """Every target streams once per round, in turn, after one warm-up round."""
    for base in targets.values():
        stream_once(client, base, min(tokens, 1000))
    runs: dict[str, list[StreamRun]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, base in targets.items():
            runs[name].append(stream_once(client, base, tokens))
    return runs


def ratio_to_direct(runs: dict[str, list[StreamRun]], name: str) -> float:
    """Median over rounds of (direct time / this target's time): the share of the model's rate delivered."""
    return statistics.median(d.seconds / t.seconds for t, d in zip(runs[name], runs["direct"], strict=True))


def stream_table(runs: dict[str, list[StreamRun]], tokens: int) -> list[str]:
    """One row per target: upstream chunks (tokens) per second at the client, and the share of direct."""
    lines = [f"| one stream of {tokens:,} chunks, {len(runs['direct'])} rounds | chunks/s p50 | min | MiB/s p50 "
             "| seconds p50 | of direct (p50 of per-round ratios) |", "|---|--:|--:|--:|--:|--:|"]
    for name, target_runs in runs.items():
        rates = [run.tokens_per_second(tokens) for run in target_runs]
        mib_s = [run.bytes / run.seconds / 2**20 for run in target_runs]
        cells = [f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}", f"{statistics.median(mib_s):.1f}",
                 f"{statistics.median(r.seconds for r in target_runs):.2f}",
                 "" if name == "direct" else f"{ratio_to_direct(runs, name):.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def verdict(runs: dict[str, list[StreamRun]]) -> str:
    ratio = ratio_to_direct(runs, "llamaswap")
    return f"≥ {TARGET_RATIO:g} of direct: {'met' if ratio >= TARGET_RATIO else 'MISSED'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000, help="chunks (tokens) per stream")
    parser.add_argument("--rounds", type=int, default=5, help="streams per target")
    args = parser.parse_args(argv)

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with served_model(Path(tmp)) as (served, _), httpx.Client(timeout=300) as client:
            targets = {"direct": direct_base(served.base), "llamaswap": served.base}
            runs = measure_streams(client, targets, args.tokens, args.rounds)

    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/streaming.py --tokens {args.tokens} --rounds {args.rounds}")
    print()
    print("\n".join(stream_table(runs, args.tokens)))
    print()
    print("throughput:", verdict(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
