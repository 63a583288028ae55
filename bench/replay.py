"""Replay speed and fidelity: how fast recorded traffic replays, and how closely a replay with the
settings in force reproduces what the service recorded.

    .venv/bin/python bench/replay.py [--rows 100000] [--seconds 30]

Speed, the core alone: `--rows` synthetic recorded requests (Poisson arrivals at 0.5/s over models
a and b, which swap, and embed, persistent beside them; interactive short, normal medium, batch long
jobs; the GPU about 70% busy) replayed through the serial scheduler, best of three; then the same
rows written into a fresh SQLite database and read back as the replay reads them (a separate
process, so Django is set up for that database alone).

Fidelity, on a recorded run: the wait-prediction workload (`bench/prediction.py`: Poisson arrivals,
three bands, two models swapping, job lengths drawn log-normal) served for `--seconds` by the real
service with fake models, then `llamaswap replay --json` on its data dir, once plainly and once
sweeping swapAffinityBonus. Same order: of the pairs of requests that waited at the same time in the
recording, the share the replay sends in the same order; wait error: the median |replayed − recorded|
wait.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import prediction  # noqa: E402
from bench.common import REPO, load_average, machine  # noqa: E402
from scheduling.core import ModelSpec, SerialSettings, SwapGroup, SwapPolicy  # noqa: E402
from scheduling.core.replay import Recorded, Setup, replay  # noqa: E402
from tests.reliability.support import all_rows_terminal  # noqa: E402
from tests.served import Served  # noqa: E402

TARGET_PER_S = 50_000
MODELS = ("a", "b", "embed")
LOAD_S = {"a": 2.0, "b": 3.0, "embed": 1.0}
# band: (priority, share of arrivals, mean job seconds)
BANDS = {"interactive": (100, 0.3, 0.3), "normal": (0, 0.5, 0.8), "batch": (-100, 0.2, 2.0)}
SWEEP = (0, 5, 10, 50)  # swapAffinityBonus: the recorded run swaps two models
ARRIVALS_PER_S = 0.5


def setup() -> Setup:
    embed = SwapGroup("embeddings", ("embed",), swap=False, exclusive=False, persistent=True)
    return Setup("serial", {m: ModelSpec(m) for m in MODELS}, SwapPolicy([embed], MODELS))


def synthetic(count: int, seed: int = 7) -> list[Recorded]:
    """`count` requests as the rows would give them: each start's load on the request it was for."""
    rng = random.Random(seed)
    names = list(BANDS)
    shares = [share for _, share, _ in BANDS.values()]
    records, at = [], 0.0
    for ticket_id in range(1, count + 1):
        at += rng.expovariate(ARRIVALS_PER_S)
        priority, _, mean = BANDS[rng.choices(names, shares)[0]]
        model = rng.choices(MODELS, (5, 2, 3))[0]
        records.append(Recorded(ticket_id, model, priority, at, route="chat", service_s=rng.expovariate(1 / mean),
                                load_s=LOAD_S[model], dispatched_s=at))
    played = replay(records, setup(), SerialSettings())  # every start takes its model's load time
    return [
        Recorded(r.id, r.model, r.priority, r.arrival_s, route="chat", service_s=r.service_s,
                 load_s=LOAD_S[r.model] if played.requests[r.id].needed_swap else None,
                 dispatched_s=played.requests[r.id].dispatched_s)
        for r in records
    ]


@dataclass(frozen=True)
class Speed:
    rows: int
    replay_s: float  # best of three
    read_s: float  # the rows read back as the replay reads them
    busy_share: float
    swaps: int

    @property
    def per_s(self) -> float:
        return self.rows / self.replay_s


def measure_speed(rows: int) -> Speed:
    records = synthetic(rows)
    timings = []
    for _ in range(3):
        began = time.perf_counter()
        result = replay(records, setup(), SerialSettings())
        timings.append(time.perf_counter() - began)
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        read = subprocess.run(
            [sys.executable, __file__, "--read-rows", str(rows)], cwd=REPO, capture_output=True, text=True,
            env={**os.environ, "LLAMASWAP_DATA_DIR": tmp, "DJANGO_SETTINGS_MODULE": "llamaswap_site.settings"},
            check=True,
        )
    return Speed(rows, min(timings), float(read.stdout.strip().splitlines()[-1]), result.busy_share, result.swaps)


def read_rows(rows: int) -> float:
    """In a process of its own: write `rows` synthetic rows into a fresh database, time reading them back."""
    import django

    django.setup()
    from datetime import datetime, timedelta, timezone

    from django.core.management import call_command

    from scheduling.core import band_of
    from scheduling.models import QueuedRequest
    from scheduling.operating.replay_history import recorded_window

    call_command("migrate", interactive=False, verbosity=0)
    since = datetime(2026, 1, 1, tzinfo=timezone.utc)
    at = lambda s: since + timedelta(seconds=s)  # noqa: E731
    QueuedRequest.objects.bulk_create(
        (QueuedRequest(
            id=r.id, model=r.model, path="/v1/chat/completions", route=r.route, priority=r.priority,
            band=band_of(r.priority).value, state="completed", arrived_at=at(r.arrival_s),
            dispatched_at=at(r.dispatched_s), finished_at=at(r.dispatched_s + r.service_s),
            duration_ms=round(r.service_s * 1000), needed_swap=r.load_s is not None,
            serial_queue_wait_ms=round((r.dispatched_s - r.arrival_s - (r.load_s or 0)) * 1000),
        ) for r in synthetic(rows)),
        batch_size=5000,
    )
    began = time.perf_counter()
    window = recorded_window(since, at(10 * rows))
    elapsed = time.perf_counter() - began
    assert len(window.records) == rows, len(window.records)
    return elapsed


@dataclass(frozen=True)
class Fidelity:
    requests: int
    plain: dict  # `llamaswap replay --json`
    sweep: dict  # with --sweep swapAffinityBonus=...


def measure_fidelity(seconds: float, seed: int = 11) -> Fidelity:
    with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        with Served(Path(tmp), prediction.config_text()) as served:
            jobs = prediction.workload(seconds, seed)
            asyncio.run(prediction.send_all(served, jobs))
            all_rows_terminal(served.data_dir, None, timeout=30)

            def replayed(*extra: str) -> dict:
                out = subprocess.run(
                    [sys.executable, str(REPO / "manage.py"), "replay", "--config", str(served.config_path),
                     "--since", "2000-01-01T00:00+00:00", "--json", *extra],
                    cwd=REPO, env=served.env, capture_output=True, text=True, check=True,
                )
                return json.loads(out.stdout)

            sweep = "swapAffinityBonus=" + ",".join(map(str, SWEEP))
            return Fidelity(len(jobs), replayed(), replayed("--sweep", sweep))


def method() -> str:
    """How the figures are taken: the docstring's paragraphs after the command line."""
    return " ".join(__doc__.split("\n\n", 2)[2].split())


def speed_rows(speed: Speed) -> list[str]:
    return [
        "| measured | value |", "|---|--:|",
        f"| replay, core only: {speed.rows:,} recorded requests, best of 3 | {speed.replay_s:.2f} s "
        f"= {speed.per_s:,.0f} requests/s |",
        f"| the same rows read from SQLite as the replay reads them | {speed.read_s:.2f} s "
        f"= {speed.rows / speed.read_s:,.0f} rows/s |",
        f"| the synthetic recording: GPU busy share, model starts | {speed.busy_share:.0%}, {speed.swaps:,} |",
    ]


def _waits(run: dict, band: str) -> str:
    w = run["waits"][band]
    return "—" if not w["count"] else f"{w['p50']:.2f} / {w['p95']:.2f} / {w['max']:.2f}"


def fidelity_rows(result: Fidelity) -> list[str]:
    f = result.plain["fidelity"]
    same = "—" if f["same_order"] is None else f"{f['same_order']:.1%}"
    error = "—" if f["wait_error_s"] is None else f"{f['wait_error_s'] * 1000:.0f} ms"
    lines = [
        "| requests | sent in both | pairs that waited together | same order | median \\|wait error\\| |",
        "|--:|--:|--:|--:|--:|",
        f"| {result.plain['window']['requests']} | {f['compared']} | {f['pairs']} | {same} | {error} |",
        "",
        f"| {result.sweep['sweep']['key']} | interactive wait p50 / p95 / max s | normal | batch | model starts "
        "| GPU busy "
        "| picks aging / affinity changed |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    runs = [("in force", result.sweep["in_force"]),
            *((str(run["value"]), run) for run in result.sweep["sweep"]["runs"])]
    for name, run in runs:
        lines.append(f"| {name} | {_waits(run, 'interactive')} | {_waits(run, 'normal')} | {_waits(run, 'batch')} "
                     f"| {run['swaps']} | {run['busy_share']:.0%} | {run['reorders']['aging']} / "
                     f"{run['reorders']['affinity']} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60, help="how long the recorded run's requests keep arriving")
    parser.add_argument("--read-rows", type=int, help=argparse.SUPPRESS)  # the row read's own process
    args = parser.parse_args(argv)
    if args.read_rows:
        print(read_rows(args.read_rows))
        return 0
    load_before = load_average()
    speed = measure_speed(args.rows)
    result = measure_fidelity(args.seconds)
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    print(f"command: .venv/bin/python bench/replay.py --rows {args.rows} --seconds {args.seconds:g}")
    print()
    print("\n".join(speed_rows(speed)))
    print()
    print("\n".join(fidelity_rows(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
