"""Swap thrash: how many model swaps a mixed queue costs, with and without the swap-affinity bonus.

    .venv/bin/python bench/thrash.py [--requests 30] [--load-delay 0.2]

Three fake models share one swap group (only one is loaded at a time) and take `--load-delay`
seconds to become healthy. A stream on model a holds the GPU while `--requests` requests of equal
priority queue behind it, one at a time so their arrival order is exact, in a fixed mixed order
(a b a a c a b c …); then the stream is dropped and the queue drains. The run is repeated with
`swapAffinityBonus` 10 and 0, and the swaps are counted from `llamaswap_model_loads_total`.

With bonus 0 the order is strict arrival order, so every change of model in the sequence is a
swap. With a bonus, a request for the loaded model outranks equal-priority requests for others,
so same-model requests are served together — at the price of arrival order.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import load_average, machine, metric_total, until_queued  # noqa: E402
from tests.served import Served, fake_cmd, model_ports, read_events  # noqa: E402

MODELS = ("a", "b", "c")
WEIGHTS = (2, 1, 1)  # a is the popular model
BONUSES = (10, 0)
LOADS = "llamaswap_model_loads_total"


@dataclass(frozen=True)
class Thrash:
    bonus: int
    swaps: int
    served_order: list[str]  # the models, in the order the requests reached them
    drain_s: float  # from dropping the stream to the last answer


def sequence(requests: int, seed: int = 7) -> list[str]:
    """A fixed mixed order that starts like the brief's example and then follows a seeded draw."""
    start = ["a", "b", "a", "a", "c", "a", "b", "c"]
    rng = random.Random(seed)
    return (start + rng.choices(MODELS, WEIGHTS, k=max(0, requests - len(start))))[:requests]


def changes(models: list[str], first: str = "a") -> int:
    """Model changes along `models`, starting from `first` loaded: the swaps arrival order costs."""
    return sum(1 for previous, current in zip([first, *models], models) if previous != current)


def config_text(events: Path, bonus: int, load_delay: float) -> str:
    return yaml.safe_dump({
        "healthCheckTimeout": 15,
        "startPort": model_ports(len(MODELS)),
        "models": {name: {"cmd": fake_cmd(name, events, "--tps", "0", "--load-delay", str(load_delay)),
                          "proxy": "http://127.0.0.1:${PORT}"} for name in MODELS},
        "groups": {"gpu": {"swap": True, "members": list(MODELS)}},
        "routing": {"scheduler": {"use": "serial", "settings": {"serial": {"swapAffinityBonus": bonus}}}},
    }, sort_keys=False)


def _body(model: str, request_id: str, **fake) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "fake": {"id": request_id, **fake}}


async def queue_and_drain(served: Served, models: list[str]) -> tuple[int, float]:
    """Queue the sequence behind a held stream on model a, release it; returns (swaps, drain seconds)."""
    limits = httpx.Limits(max_connections=len(models) + 1, max_keepalive_connections=len(models) + 1)
    async with httpx.AsyncClient(base_url=served.base, limits=limits, timeout=120) as client:
        blocker = _body("a", "blocker", tokens=1_000_000, tps=10) | {"stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=blocker) as held:
            lines = held.aiter_lines()  # kept: a dropped iterator would be finalised and close the stream
            await anext(lines)  # model a is loaded and busy
            pending = []
            for index, model in enumerate(models):
                pending.append(asyncio.create_task(
                    client.post("/v1/chat/completions", json=_body(model, f"q{index}"))))
                await until_queued(served.data_dir, index + 1)
            loads_before = metric_total(served.base, LOADS)
            released = time.perf_counter()
        responses = await asyncio.gather(*pending)
        drain_s = time.perf_counter() - released
    failed = [r.status_code for r in responses if r.status_code != 200]
    if failed:
        raise RuntimeError(f"{len(failed)} queued requests failed: HTTP {sorted(set(failed))}")
    return round(metric_total(served.base, LOADS) - loads_before), drain_s


def measure(bonus: int, models: list[str], load_delay: float) -> Thrash:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        events = Path(tmp) / "events.jsonl"
        with Served(Path(tmp), config_text(events, bonus, load_delay)) as served:
            swaps, drain_s = asyncio.run(queue_and_drain(served, models))
        starts = [e for e in read_events(events) if e["event"] == "start" and str(e["id"]).startswith("q")]
    order = [e["model"] for e in sorted(starts, key=lambda e: e["t"])]
    if len(order) != len(models):
        raise RuntimeError(f"the models saw {len(order)} of {len(models)} queued requests")
    return Thrash(bonus, swaps, order, drain_s)


def rows(results: list[Thrash]) -> list[str]:
    lines = []
    for result in results:
        lines.append(f"| {result.bonus} | {result.swaps} | {changes(result.served_order)} "
                     f"| {result.drain_s:.1f} | {''.join(result.served_order)} |")
    return lines


HEADER = ("| swapAffinityBonus | swaps (model loads) | model changes in served order | drain s | served order |\n"
          "|--:|--:|--:|--:|---|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="queued requests")
    parser.add_argument("--load-delay", type=float, default=0.2, help="seconds each model takes to become healthy")
    args = parser.parse_args(argv)
    models = sequence(args.requests)

    load_before = load_average()
    results = [measure(bonus, models, args.load_delay) for bonus in BONUSES]
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/thrash.py --requests {args.requests} --load-delay {args.load_delay:g}")
    print(f"arrival order: {''.join(models)} ({changes(models)} model changes)")
    print()
    print(HEADER)
    print("\n".join(rows(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
