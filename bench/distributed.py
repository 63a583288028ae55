"""Distributed mode beside one process: what Redis adds to a grant and to the gap between serial jobs,
the latency a front end adds, and tiny-request throughput through one and through two front ends.

    .venv/bin/python bench/distributed.py [--grants 300] [--jobs 200] [--requests 300]
                                          [--throughput-requests 300] [--throughput-rounds 3]

Needs the PostgreSQL and Redis the tests use (LLAMASWAP_TEST_POSTGRES, LLAMASWAP_TEST_REDIS); without
either it says why and measures nothing. It makes a database of its own, dropped afterwards, and takes a
Redis database index that holds no keys, flushed afterwards.

- Scheduling over the wire, in this one process: the real serial scheduler and runtime, with a model that
  is always loaded and no rows written, reached through InProcessFrontDoor and through
  ChannelLayerFrontDoor + SchedulerWorker over the local Redis, in turn. The grant round trip is submit
  to lease with the slot free; the dispatch gap is one lease's release to the next queued request's
  lease, `--jobs` queued, as the front door's caller sees them. Beside them, the floor: one bare
  channel-layer message, send to receive (a grant is two: the submit and the answer).
- Real processes: `llamaswap worker` starting the fake model at tps 0 with a slot for every client, two
  `llamaswap serve` front ends, and one `llamaswap serve` without Redis (one process) with a fake model
  of its own. Added latency: the same tiny chat straight to the worker's model, through a front end,
  straight to the one-process service's model and through that service, in turn, each round starting at the other
  pair (so each direct call follows each service's trailing work alike), round after round. Throughput:
  CLIENTS concurrent clients send `--throughput-requests` tiny chats through one front end, then split
  evenly over two, then to the one-process service, then straight to the model, in turn per round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CHAT, MODEL, added, chat_call, direct_base, load_average, machine, stats, timed_rounds,
)
from bench.proxy import CONNECT_WAVE  # noqa: E402
from llamaswap_site.environment import redis_host  # noqa: E402
from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapPolicy  # noqa: E402
from scheduling.in_process import InProcessFrontDoor  # noqa: E402
from scheduling.remote import ChannelLayerFrontDoor  # noqa: E402
from scheduling.runtime import Outcome, SchedulerRuntime, TicketRequest  # noqa: E402
from scheduling.worker import SchedulerWorker  # noqa: E402
from tests.conftest import POSTGRES_ADMIN_URL, REDIS_URL, fresh_redis_db, scratch_database  # noqa: E402
from tests.served import REPO, Served, Worker, fake_cmd, model_ports  # noqa: E402

ADDED_TARGET_MS = 5.0  # p50 a front end may add over the model itself (issue 11)
CLIENTS = 8  # concurrent clients in the throughput rounds, and the model's slots
WARMUP = 20  # grants per side before the timed ones
GAP_BLOCKS = 2  # dispatch-gap blocks per side, alternating
WAIT_S = 30.0  # for the runtime to take a release or a queue to fill
REQUEST = TicketRequest(model=MODEL, path="/v1/chat/completions", priority=0)
DONE = Outcome(state="completed", status_code=200)
ONE_PROCESS, OVER_REDIS = "one process", "over Redis"
DIRECT, FRONT_END = "straight to the worker's model", "through a front end"
ALONE_DIRECT, ALONE = "straight to the one-process service's model", "through llamaswap in one process"
ONE_FRONT_END, TWO_FRONT_ENDS = "one front end", "two front ends"
STRAIGHT = "straight to the model (the clients' ceiling)"


class Unavailable(Exception):
    """PostgreSQL or Redis is not there: the measurement is skipped, saying which."""


# -- scheduling over the wire, in this process ---------------------------------------------------

class LoadedModel:
    """The runtime's fleet: one model that starts at once and keeps running; nothing is behind it."""

    async def swap_in(self, model: str, evict: tuple[str, ...]) -> None:
        return None

    async def stop(self, model: str) -> None:
        return None

    def upstream_url(self, model: str) -> str:
        return "http://127.0.0.1:9"

    def check_exited(self, model: str) -> bool:
        return False


class NoRows:
    """The runtime's recorder, writing nothing: both sides would write the same rows."""

    def create(self, ticket_id: int, **fields) -> None:
        pass

    def update(self, ticket_id: int, **fields) -> None:
        pass


def one_slot_runtime() -> SchedulerRuntime:
    scheduler = SerialScheduler({MODEL: ModelSpec(MODEL)}, SwapPolicy((), (MODEL,)), SerialSettings(slots={}))
    return SchedulerRuntime(scheduler, LoadedModel(), NoRows())


async def settled(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"waited {WAIT_S:g} s for {what}")
        await asyncio.sleep(0.001)


async def grant_ms(door, runtime: SchedulerRuntime) -> float:
    """Submit to lease with the slot free; returns once the runtime has the lease back."""
    started = time.perf_counter()
    lease = await door.submit(REQUEST)
    took = (time.perf_counter() - started) * 1000
    door.release(lease.ticket_id, DONE)
    await settled(lambda: runtime.granted_request(lease.ticket_id) is None, "the release to reach the runtime")
    return took


async def dispatch_gaps_ms(door, runtime: SchedulerRuntime, jobs: int) -> list[float]:
    """Hold the one slot, queue `jobs` requests behind it, then release each lease as it arrives:
    release to the next lease, in dispatch order."""
    held = await door.submit(REQUEST)
    granted: asyncio.Queue = asyncio.Queue()

    async def job() -> None:
        lease = await door.submit(REQUEST)
        granted.put_nowait((time.perf_counter(), lease))

    tasks: list[asyncio.Task] = []
    while len(tasks) < jobs:  # in waves: each submit holds a pooled Redis connection while it is sent, and
        # redis-py's pool refuses more than 100 at once ("Too many connections")
        tasks += [asyncio.create_task(job()) for _ in range(min(CONNECT_WAVE, jobs - len(tasks)))]
        await settled(lambda: runtime.snapshot[1].waiting == len(tasks), f"{len(tasks)} requests to queue")
    gaps, lease = [], held
    for _ in range(jobs):
        released = time.perf_counter()
        door.release(lease.ticket_id, DONE)
        at, lease = await granted.get()
        gaps.append((at - released) * 1000)
    door.release(lease.ticket_id, DONE)
    await asyncio.gather(*tasks)
    await settled(lambda: runtime.granted_request(lease.ticket_id) is None, "the last release to reach the runtime")
    return gaps


async def hop_ms(sender, receiver, channel: str) -> float:
    """One message through the channel layer, send to receive: the floor under every message of the wire."""
    started = time.perf_counter()
    await sender.send(channel, {"type": "bench.hop"})
    await receiver.receive(channel)
    return (time.perf_counter() - started) * 1000


@dataclass(frozen=True)
class Scheduling:
    """Milliseconds by side (ONE_PROCESS, OVER_REDIS), and single channel-layer messages."""

    grant: dict[str, list[float]]
    gap: dict[str, list[float]]
    hop: list[float]


async def measure_scheduling(redis_url: str, grants: int, jobs: int) -> Scheduling:
    """Both sides on this event loop, in turn. Over Redis the worker and the front door share this process
    too, so what differs from in-process is the channel layer and the wire messages, not the processes."""
    from channels_redis.core import RedisChannelLayer

    layers = [RedisChannelLayer(hosts=[redis_host(redis_url)]) for _ in range(2)]
    local = InProcessFrontDoor(one_slot_runtime(), None, None)
    worker = SchedulerWorker(InProcessFrontDoor(one_slot_runtime(), None, None), layers[0], [MODEL])
    serving = asyncio.get_running_loop().create_task(worker.run())
    remote = ChannelLayerFrontDoor(None, layers[1])
    sides = {ONE_PROCESS: (local, local.runtime), OVER_REDIS: (remote, worker.runtime)}
    try:
        grant: dict[str, list[float]] = {side: [] for side in sides}
        for index in range(WARMUP + grants):
            for side, (door, runtime) in sides.items():
                took = await grant_ms(door, runtime)
                if index >= WARMUP:
                    grant[side].append(took)
        gap: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(GAP_BLOCKS):
            for side, (door, runtime) in sides.items():
                gap[side] += await dispatch_gaps_ms(door, runtime, max(2, jobs // GAP_BLOCKS))
        hop = [await hop_ms(layers[1], layers[0], "llamaswap.bench.hop") for _ in range(WARMUP + grants)][WARMUP:]
    finally:
        await remote.close()
        await worker.stop()
        await serving
        for runtime in (local.runtime, worker.runtime):
            await runtime.shutdown(0)
        for layer in layers:
            await layer.close_pools()
    return Scheduling(grant, gap, hop)


# -- real processes ------------------------------------------------------------------------------

def config_text() -> str:
    """One fake model answering at once, with a slot for every throughput client."""
    return yaml.safe_dump({
        "startPort": model_ports(1),
        "models": {MODEL: {"cmd": fake_cmd(MODEL, None, "--tps", "0"), "proxy": "http://127.0.0.1:${PORT}"}},
        "routing": {"scheduler": {"use": "serial", "settings": {"serial": {"slots": {MODEL: CLIENTS}}}}},
    }, sort_keys=False)


@dataclass(frozen=True)
class Cluster:
    """One worker with its front ends over Redis and PostgreSQL, and a one-process service beside them;
    each has its model loaded."""

    worker: Worker
    front_ends: list[Served]
    alone: Served


@contextmanager
def cluster(tmp: Path, database_url: str, redis_url: str, front_ends: int = 2) -> Iterator[Cluster]:
    shared = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    text = config_text()
    with ExitStack() as stack:
        worker_env = {**os.environ, **shared, "PYTHONPATH": str(REPO), "LLAMASWAP_DATA_DIR": str(tmp / "worker" / "data")}
        worker = stack.enter_context(Worker(tmp / "worker", text, worker_env))
        fronts = []
        for n in range(1, front_ends + 1):
            (tmp / f"front-end-{n}").mkdir()
            fronts.append(stack.enter_context(Served(tmp / f"front-end-{n}", text, env=shared)))
        (tmp / "one-process").mkdir()
        alone = stack.enter_context(Served(tmp / "one-process", config_text()))
        with httpx.Client(timeout=60) as client:
            for service in (fronts[0], alone):
                chat_call(client, service.base)()  # loads the model
        yield Cluster(worker, fronts, alone)


async def drain_rps(bases: list[str], requests: int) -> float:
    """Requests per second for `requests` tiny chats from CLIENTS concurrent clients spread evenly over `bases`."""
    left = iter(range(requests))  # shared: each client takes the next request when its last one is answered

    async def client(http: httpx.AsyncClient) -> None:
        for _ in left:
            response = await http.post("/v1/chat/completions", json=CHAT)
            if response.status_code != 200:
                raise RuntimeError(f"{http.base_url}: HTTP {response.status_code}: {response.text[:300]}")

    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=bases[n % len(bases)], timeout=60))
                   for n in range(CLIENTS)]
        started = time.perf_counter()
        await asyncio.gather(*map(client, clients))
        return requests / (time.perf_counter() - started)


@dataclass(frozen=True)
class Processes:
    """Milliseconds per tiny chat by target, one sample per round; requests/s by configuration, one per round."""

    chat: dict[str, list[float]]
    rps: dict[str, list[float]]


def measure_processes(found: Cluster, requests: int, throughput_requests: int, throughput_rounds: int) -> Processes:
    front, second = found.front_ends[0].base, found.front_ends[1].base
    model, alone_model = direct_base(front), direct_base(found.alone.base)
    targets = {DIRECT: model, FRONT_END: front, ALONE_DIRECT: alone_model, ALONE: found.alone.base}
    with httpx.Client(timeout=60) as client:
        chat = timed_rounds({name: chat_call(client, base) for name, base in targets.items()}, requests, shift=2)
    configurations = {ONE_FRONT_END: [front], TWO_FRONT_ENDS: [front, second], ONE_PROCESS: [found.alone.base],
                      STRAIGHT: [model]}
    for bases in configurations.values():  # warm-up: every client's connection and every process's code paths
        asyncio.run(drain_rps(bases, CLIENTS * 5))
    rps: dict[str, list[float]] = {name: [] for name in configurations}
    for _ in range(throughput_rounds):
        for name, bases in configurations.items():
            rps[name].append(asyncio.run(drain_rps(bases, throughput_requests)))
    return Processes(chat, rps)


# -- the whole measurement ---------------------------------------------------------------------------

@contextmanager
def services() -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL) of this run's own; the database is dropped and the Redis index flushed
    afterwards. Unavailable when either server does not answer."""
    try:
        import psycopg
        import redis
    except ImportError as exc:
        raise Unavailable(f"{exc.name} is not installed") from None
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise Unavailable(" ".join(f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}".split())) from None
    with admin:
        try:
            redis_url = fresh_redis_db(REDIS_URL)
        except redis.exceptions.ConnectionError as exc:
            raise Unavailable(" ".join(f"no Redis at {REDIS_URL}: {exc}".split())) from None
        try:
            with scratch_database(admin, POSTGRES_ADMIN_URL) as database_url:
                yield database_url, redis_url
        finally:
            redis.Redis.from_url(redis_url).flushdb()


@dataclass(frozen=True)
class Run:
    scheduling: Scheduling
    processes: Processes

    def added(self, through: str, direct: str) -> list[float]:
        return added(self.processes.chat[through], self.processes.chat[direct])

    def rps_ratio(self, name: str, base: str) -> float:
        """Median over rounds of `name`'s requests/s ÷ `base`'s in the same round."""
        rps = self.processes.rps
        return statistics.median(n / b for n, b in zip(rps[name], rps[base], strict=True))


def measure(grants: int, jobs: int, requests: int, throughput_requests: int, throughput_rounds: int) -> Run:
    """Every measurement, on a database and a Redis index of its own; Unavailable without them."""
    with services() as (database_url, redis_url):
        found_scheduling = asyncio.run(measure_scheduling(redis_url, grants, jobs))
        with tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp, \
                cluster(Path(tmp), database_url, redis_url) as found:
            found_processes = measure_processes(found, requests, throughput_requests, throughput_rounds)
    return Run(found_scheduling, found_processes)


# -- tables --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """One row of the side-by-side table; a measure with only one side (failover) says "—" on the other."""

    what: str
    one_process: str
    distributed: str
    ratio: str


def comparisons(run: Run) -> list[Comparison]:
    def ms(samples: list[float], statistic: str) -> float:
        return getattr(stats(samples), statistic)

    rows = []
    for title, samples in (("grant round trip", run.scheduling.grant), ("dispatch gap", run.scheduling.gap)):
        for statistic in ("p50", "p99"):
            one, over = ms(samples[ONE_PROCESS], statistic), ms(samples[OVER_REDIS], statistic)
            rows.append(Comparison(f"{title}, runtime-level, {statistic} (µs)", f"{one * 1000:.0f}",
                                   f"{over * 1000:.0f}", f"{over / one:.0f}×"))
    for statistic in ("p50", "p95"):
        one, over = ms(run.added(ALONE, ALONE_DIRECT), statistic), ms(run.added(FRONT_END, DIRECT), statistic)
        rows.append(Comparison(f"added latency over the model, tiny chat, {statistic} (ms)", f"{one:+.2f}",
                               f"{over:+.2f}", f"{over / one:.2f}×" if one > 0 else "—"))
    rps = {name: statistics.median(values) for name, values in run.processes.rps.items()}
    for name in (ONE_FRONT_END, TWO_FRONT_ENDS):
        rows.append(Comparison(f"tiny chats/s, {CLIENTS} clients, distributed through {name}, median of rounds",
                               f"{rps[ONE_PROCESS]:.0f}", f"{rps[name]:.0f}", f"{run.rps_ratio(name, ONE_PROCESS):.2f}×"))
    return rows


def comparison_table(rows: list[Comparison]) -> list[str]:
    lines = ["| measure | one process | distributed | distributed ÷ one process |", "|---|--:|--:|--:|"]
    return lines + [f"| {r.what} | {r.one_process} | {r.distributed} | {r.ratio} |" for r in rows]


def scheduling_table(found: Scheduling) -> list[str]:
    lines = ["| runtime-level (both ends in the bench's process), µs | side | n | p50 | p95 | p99 | max |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for title, samples in (("grant round trip (slot free)", found.grant),
                           ("dispatch gap (release to next lease)", found.gap)):
        for side, values in samples.items():
            s = stats(values)
            lines.append(f"| {title} | {side} | {s.n} | {s.p50 * 1000:.0f} | {s.p95 * 1000:.0f} | "
                         f"{s.p99 * 1000:.0f} | {s.max * 1000:.0f} |")
    s = stats(found.hop)
    lines.append(f"| one channel-layer message, send to receive (the floor: a grant takes two) | Redis | {s.n} | "
                 f"{s.p50 * 1000:.0f} | {s.p95 * 1000:.0f} | {s.p99 * 1000:.0f} | {s.max * 1000:.0f} |")
    return lines


def latency_table(run: Run) -> list[str]:
    chat = run.processes.chat
    lines = [f"| tiny chat, {len(chat[DIRECT])} rounds, ms | p50 | p95 | p99 | added p50 | added p95 | added p99 |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for name, direct in ((DIRECT, None), (FRONT_END, DIRECT), (ALONE_DIRECT, None), (ALONE, ALONE_DIRECT)):
        s = stats(chat[name])
        cells = [f"{s.p50:.2f}", f"{s.p95:.2f}", f"{s.p99:.2f}"]
        if direct is None:
            cells += ["", "", ""]
        else:
            extra = stats(run.added(name, direct))
            cells += [f"{extra.p50:+.2f}", f"{extra.p95:+.2f}", f"{extra.p99:+.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def throughput_table(run: Run, throughput_requests: int) -> list[str]:
    rps = run.processes.rps
    rounds = len(rps[ONE_FRONT_END])
    lines = [f"| {throughput_requests:,} tiny chats, {CLIENTS} clients, requests/s | "
             + " | ".join(f"round {n}" for n in range(1, rounds + 1)) + " | median | ÷ one front end |",
             "|---|" + "--:|" * (rounds + 2)]
    for name, values in rps.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.0f}" for v in values)
                     + f" | {statistics.median(values):.0f} | {run.rps_ratio(name, ONE_FRONT_END):.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grants", type=int, default=300, help="grant round trips per side")
    parser.add_argument("--jobs", type=int, default=200, help="queued jobs per side for the dispatch gap")
    parser.add_argument("--requests", type=int, default=300, help="rounds of tiny chats for added latency")
    parser.add_argument("--throughput-requests", type=int, default=300, help="tiny chats per throughput run")
    parser.add_argument("--throughput-rounds", type=int, default=3, help="rounds of throughput runs")
    args = parser.parse_args(argv)

    load_before = load_average()
    try:
        run = measure(args.grants, args.jobs, args.requests, args.throughput_requests, args.throughput_rounds)
    except Unavailable as exc:
        print(f"distributed mode not measured: {exc}")
        return 0
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    for table in (comparison_table(comparisons(run)), scheduling_table(run.scheduling), latency_table(run),
                  throughput_table(run, args.throughput_requests)):
        print()
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
