"""Distributed mode beside one process: what Redis adds to a grant and to the gap between serial jobs,
the latency a front end adds, and tiny-request throughput through one and through two front ends, over
each channel layer (LLAMASWAP_CHANNEL_LAYER lists and pubsub); and how long a failover takes.

    .venv/bin/python bench/distributed.py [--grants 300] [--jobs 200] [--requests 300]
                                          [--throughput-requests 300] [--throughput-rounds 3] [--failovers 3]

Needs the PostgreSQL and Redis the tests use (LLAMASWAP_TEST_POSTGRES, LLAMASWAP_TEST_REDIS); without
either it says why and measures nothing. It makes a database of its own, dropped afterwards, and takes a
Redis database index that holds no keys, flushed afterwards.

- Scheduling over the wire, in this one process: the real serial scheduler and runtime, with a model that
  is always loaded and no rows written, reached through InProcessFrontDoor and through
  ChannelLayerFrontDoor + SchedulerWorker over the local Redis, once per channel layer, in turn. The
  grant round trip is submit to lease with the slot free; the dispatch gap is one lease's release to the
  next queued request's lease, `--jobs` queued, as the front door's caller sees them. Beside them, the
  floor: one bare channel-layer message, send to receive (a grant is two: the submit and the answer).
- Real processes: `llamaswap worker` starting the fake model at tps 0 with a slot for every client, two
  `llamaswap serve` front ends, and one `llamaswap serve` without Redis (one process) with a fake model
  of its own. Added latency: the same tiny chat straight to the worker's model, through a front end,
  straight to the one-process service's model and through that service, in turn, each round starting at the other
  pair (so each direct call follows each service's trailing work alike), round after round. Throughput:
  CLIENTS concurrent clients send `--throughput-requests` tiny chats through one front end, then split
  evenly over two, then to the one-process service, then straight to the model, in turn per round.
  All of this once per channel layer: a worker and front ends of their own, the one-process service beside
  them in the same rotation.
- Failover, on the default layer: a worker serving one front end, a standby standing by beside it (a data
  dir of its own, as on another machine), a stream holding the model's one slot and FAILOVER_QUEUED tiny
  chats queued behind it; `kill -9` of the worker, then the time to the standby's log saying it serves,
  to the first queued chat's row dispatched and to its answer at the client. The standby then serves, a
  new standby stands by beside it, and the next kill is of it. Beside them the fake model's own start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from django.utils.module_loading import import_string

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CHAT, MODEL, added, chat_call, direct_base, load_average, machine, stats, timed_rounds,
)
from bench.proxy import CONNECT_WAVE  # noqa: E402
from llamaswap_site.environment import CHANNEL_LAYER_BACKENDS, redis_host  # noqa: E402
from scheduling.core import ModelSpec, SerialScheduler, SerialSettings, SwapPolicy  # noqa: E402
from scheduling.door.in_process import InProcessFrontDoor  # noqa: E402
from scheduling.door.remote import ChannelLayerFrontDoor  # noqa: E402
from scheduling.runtime import SchedulerRuntime  # noqa: E402
from scheduling.tickets import Outcome, TicketRequest
from scheduling.door.worker import GATHER_S, SchedulerWorker  # noqa: E402
from tests.conftest import POSTGRES_ADMIN_URL, REDIS_URL, fresh_redis_db, scratch_database  # noqa: E402
from tests.e2e.held import HeldStream  # noqa: E402
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, wait_until  # noqa: E402

ADDED_TARGET_MS = 5.0  # p50 a front end may add over the model itself: the distributed mode's target
CLIENTS = 8  # concurrent clients in the throughput rounds, and the model's slots
WARMUP = 20  # grants per side before the timed ones
GAP_BLOCKS = 2  # dispatch-gap blocks per side, alternating
WAIT_S = 30.0  # for the runtime to take a release or a queue to fill
REQUEST = TicketRequest(model=MODEL, path="/v1/chat/completions", priority=0)
DONE = Outcome(state="completed", status_code=200)
LAYERS = tuple(CHANNEL_LAYER_BACKENDS)  # LLAMASWAP_CHANNEL_LAYER's values: "lists" (the default), "pubsub"
DEFAULT_LAYER = "lists"
FAILOVERS = 3  # kills of the serving worker, each taken over by a standby started for it
FAILOVER_QUEUED = 4  # tiny chats queued behind a running stream at each kill
ONE_PROCESS = "one process"
DIRECT, FRONT_END = "straight to the worker's model", "through a front end"
ALONE_DIRECT, ALONE = "straight to the one-process service's model", "through llamaswap in one process"
ONE_FRONT_END, TWO_FRONT_ENDS = "one front end", "two front ends"
STRAIGHT = "straight to the model (the clients' ceiling)"


class Unavailable(Exception):
    """PostgreSQL or Redis is not there: the measurement is skipped, saying which."""


def over(layer: str) -> str:
    """The runtime-level side through one channel layer (the other side is ONE_PROCESS)."""
    return f"over Redis ({layer})"


# -- scheduling over the wire, in this process ---------------------------------------------------

class LoadedModel:
    """The runtime's fleet: one model that starts at once and keeps running; nothing is behind it."""

    async def swap_in(self, model: str, evict: tuple[str, ...], gpus: tuple[str, ...] | None = None) -> None:
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

    def backlogged(self) -> bool:
        return False  # nothing is written, so nothing waits to be


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
    """One message through the channel layer, send to receive: the floor under every message of the wire.
    `channel` is one the receiver made (new_channel), so a pub/sub layer listens on it before the first send."""
    started = time.perf_counter()
    await sender.send(channel, {"type": "bench.hop"})
    await receiver.receive(channel)
    return (time.perf_counter() - started) * 1000


@dataclass(frozen=True)
class Scheduling:
    """Milliseconds by side (ONE_PROCESS and over(layer) for each of LAYERS), and single channel-layer
    messages by layer."""

    grant: dict[str, list[float]]
    gap: dict[str, list[float]]
    hop: dict[str, list[float]]


def redis_layer(layer: str, redis_url: str):
    """A channel layer of LLAMASWAP_CHANNEL_LAYER's kind `layer`, on `redis_url`, as the settings make it."""
    return import_string(CHANNEL_LAYER_BACKENDS[layer])(hosts=[redis_host(redis_url)])


async def close_layer(layer) -> None:
    """The core layer closes its connection pools; the pub/sub one has none, and its flush closes its connections."""
    await (layer.close_pools() if hasattr(layer, "close_pools") else layer.flush())


async def measure_scheduling(redis_url: str, grants: int, jobs: int) -> Scheduling:
    """Every side on this event loop, in turn. Over Redis the worker and the front door share this process
    too, so what differs from in-process is the channel layer and the wire messages, not the processes."""
    local = InProcessFrontDoor(one_slot_runtime(), None, None)
    sides = {ONE_PROCESS: (local, local.runtime)}
    # By layer: the worker's and the front door's.
    pairs = {layer: (redis_layer(layer, redis_url), redis_layer(layer, redis_url)) for layer in LAYERS}
    workers = [SchedulerWorker(InProcessFrontDoor(one_slot_runtime(), None, None), pair[0], [MODEL])
               for pair in pairs.values()]
    serving = [asyncio.get_running_loop().create_task(worker.run()) for worker in workers]
    remotes = [ChannelLayerFrontDoor(None, pair[1]) for pair in pairs.values()]
    for layer, remote, worker in zip(LAYERS, remotes, workers, strict=True):
        sides[over(layer)] = (remote, worker.runtime)
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
        hop: dict[str, list[float]] = {}
        for layer, (receiver, sender) in pairs.items():
            channel = await receiver.new_channel("llamaswap.bench.hop.")
            hop[layer] = [await hop_ms(sender, receiver, channel) for _ in range(WARMUP + grants)][WARMUP:]
    finally:
        for remote in remotes:
            await remote.close()
        for worker in workers:
            await worker.stop()
        await asyncio.gather(*serving)
        for runtime in (local.runtime, *(worker.runtime for worker in workers)):
            await runtime.shutdown(0)
        for pair in pairs.values():
            for layer in pair:
                await close_layer(layer)
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


def distributed_env(database_url: str, redis_url: str, layer: str = DEFAULT_LAYER) -> dict[str, str]:
    """What a worker and its front ends share."""
    return {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "LLAMASWAP_CHANNEL_LAYER": layer}


@contextmanager
def cluster(tmp: Path, database_url: str, redis_url: str, layer: str, front_ends: int = 2) -> Iterator[Cluster]:
    shared = distributed_env(database_url, redis_url, layer)
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


# -- failover ------------------------------------------------------------------------------------

def failover_config() -> str:
    """One fake model with the serial scheduler's one slot: a stream holds it while chats queue."""
    return yaml.safe_dump({
        "startPort": model_ports(1),
        "models": {MODEL: {"cmd": fake_cmd(MODEL, None, "--tps", "0"), "proxy": "http://127.0.0.1:${PORT}"}},
        "routing": {"scheduler": {"use": "serial"}},
    }, sort_keys=False)


@dataclass(frozen=True)
class Failover:
    """Milliseconds from each `kill -9` of the serving worker to the standby's log saying it serves, to the
    first queued chat's row dispatched and to its answer at the client; the fake model's own start, spawn
    to healthy."""

    serving: list[float]
    dispatched: list[float]
    answered: list[float]
    model_start: list[float]


def queued_ids(database_url: str, count: int) -> list[int] | None:
    """The queued rows' ids once there are `count` of them."""
    import psycopg

    with psycopg.connect(database_url) as connection:
        ids = [row[0] for row in connection.execute("SELECT id FROM scheduling_queuedrequest WHERE state = 'queued'")]
    return ids if len(ids) == count else None


def first_dispatched(database_url: str, ids: list[int]) -> float | None:
    """Unix time the first of these rows was dispatched; None until each has a dispatched_at (the worker
    writes rows behind its answers)."""
    import psycopg

    with psycopg.connect(database_url) as connection:
        times = [row[0] for row in connection.execute(
            "SELECT dispatched_at FROM scheduling_queuedrequest WHERE id = ANY(%s)", (ids,))]
    return None if None in times else min(times).timestamp()


def kill_ms(front: Served, active: Worker, standby: Worker, database_url: str) -> tuple[float, float, float]:
    """Kill the serving worker with a stream running and FAILOVER_QUEUED chats queued behind it: ms from
    the kill to the standby's log saying it serves, to the first queued chat's row dispatched, and to
    the first queued chat's answer."""
    held = HeldStream(front, MODEL, tokens=100_000, tps=50, request_id="held")

    def chat() -> tuple[float, httpx.Response]:
        response = httpx.post(front.base + "/v1/chat/completions", json=CHAT, timeout=60)
        return time.perf_counter(), response

    with ThreadPoolExecutor(FAILOVER_QUEUED) as pool:
        answers = [pool.submit(chat) for _ in range(FAILOVER_QUEUED)]
        ids = wait_until(lambda: queued_ids(database_url, FAILOVER_QUEUED), 30, 0.02,
                         f"{FAILOVER_QUEUED} chats to queue")
        killed, killed_at = time.perf_counter(), time.time()
        os.kill(active.proc.pid, signal.SIGKILL)
        wait_until(lambda: "llamaswap worker serving" in standby.log(), 60, 0.002, "the standby to take over")
        serving = time.perf_counter()
        answered = [answer.result() for answer in answers]
    held.close()
    active.proc.wait(10)
    failed = [response.text[:300] for _, response in answered if response.status_code != 200]
    if failed:
        raise RuntimeError(f"queued chats failed across the failover: {failed}")
    dispatched = wait_until(lambda: first_dispatched(database_url, ids), 30, 0.05, "the chats' rows to be written")
    return (serving - killed) * 1000, (dispatched - killed_at) * 1000, (min(at for at, _ in answered) - killed) * 1000


def model_start_ms() -> float:
    """The fake model's own start, spawn to a healthy /health: the model's part of a failover, not llamaswap's."""
    port = model_ports(1)
    started = time.perf_counter()
    model = subprocess.Popen(fake_cmd(MODEL, None, "--tps", "0").replace("${PORT}", str(port)).split(), cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def healthy() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 30, 0.002, "the fake model to answer /health")
        return (time.perf_counter() - started) * 1000
    finally:
        model.terminate()
        model.wait(10)


def measure_failover(tmp: Path, database_url: str, redis_url: str, kills: int) -> Failover:
    """One front end throughout; each kill's standby was started beside the worker it takes over from,
    with a data dir of its own as on another machine, and serves until the next kill."""
    text = failover_config()
    shared = distributed_env(database_url, redis_url)

    def worker(n: int, ready: str) -> Worker:
        env = {**os.environ, **shared, "PYTHONPATH": str(REPO), "LLAMASWAP_DATA_DIR": str(tmp / f"worker-{n}" / "data")}
        return Worker(tmp / f"worker-{n}", text, env, ready=ready)

    serving, dispatched, answered = [], [], []
    with ExitStack() as stack:
        active = stack.enter_context(worker(0, "llamaswap worker serving"))
        (tmp / "front-end").mkdir()
        front = stack.enter_context(Served(tmp / "front-end", text, env=shared))
        for n in range(1, kills + 1):
            standby = stack.enter_context(worker(n, "llamaswap worker standing by"))
            spans = kill_ms(front, active, standby, database_url)
            for found, ms in zip((serving, dispatched, answered), spans, strict=True):
                found.append(ms)
            active = standby
    return Failover(serving, dispatched, answered, [model_start_ms() for _ in range(kills)])


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
    processes: dict[str, Processes]  # by channel layer
    failover: Failover

    def added(self, through: str, direct: str, layer: str = DEFAULT_LAYER) -> list[float]:
        chat = self.processes[layer].chat
        return added(chat[through], chat[direct])

    def rps_ratio(self, name: str, base: str, layer: str = DEFAULT_LAYER) -> float:
        """Median over rounds of `name`'s requests/s ÷ `base`'s in the same round."""
        rps = self.processes[layer].rps
        return statistics.median(n / b for n, b in zip(rps[name], rps[base], strict=True))

    def meets_target(self, layer: str) -> bool:
        return stats(self.added(FRONT_END, DIRECT, layer)).p50 <= ADDED_TARGET_MS


def measure(grants: int, jobs: int, requests: int, throughput_requests: int, throughput_rounds: int,
            failovers: int = FAILOVERS) -> Run:
    """Every measurement, on a database and a Redis index of its own; Unavailable without them. The
    process-level rows once per channel layer, a cluster of their own each; the failover on the default layer."""
    with services() as (database_url, redis_url), tempfile.TemporaryDirectory(prefix="llamaswap-bench-") as tmp:
        found_scheduling = asyncio.run(measure_scheduling(redis_url, grants, jobs))
        found_processes = {}
        for layer in LAYERS:
            with cluster(Path(tmp) / layer, database_url, redis_url, layer) as found:
                found_processes[layer] = measure_processes(found, requests, throughput_requests, throughput_rounds)
        found_failover = measure_failover(Path(tmp) / "failover", database_url, redis_url, failovers)
    return Run(found_scheduling, found_processes, found_failover)


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
    for layer in LAYERS:
        for title, samples in (("grant round trip", run.scheduling.grant), ("dispatch gap", run.scheduling.gap)):
            for statistic in ("p50", "p99"):
                one, over_layer = ms(samples[ONE_PROCESS], statistic), ms(samples[over(layer)], statistic)
                rows.append(Comparison(f"{title}, runtime-level, {layer} layer, {statistic} (µs)", f"{one * 1000:.0f}",
                                       f"{over_layer * 1000:.0f}", f"{over_layer / one:.0f}×"))
    for layer in LAYERS:
        for statistic in ("p50", "p95"):
            one = ms(run.added(ALONE, ALONE_DIRECT, layer), statistic)
            through = ms(run.added(FRONT_END, DIRECT, layer), statistic)
            target = (f"; target ≤ {ADDED_TARGET_MS:g} ms {'met' if run.meets_target(layer) else 'not met'}"
                      if statistic == "p50" else "")
            rows.append(Comparison(f"added latency over the model, tiny chat, {layer} layer, {statistic} (ms){target}",
                                   f"{one:+.2f}", f"{through:+.2f}", f"{through / one:.2f}×" if one > 0 else "—"))
    for layer in LAYERS:
        rps = {name: statistics.median(values) for name, values in run.processes[layer].rps.items()}
        for name in (ONE_FRONT_END, TWO_FRONT_ENDS):
            rows.append(Comparison(
                f"tiny chats/s, {CLIENTS} clients, distributed through {name}, {layer} layer, median of rounds",
                f"{rps[ONE_PROCESS]:.0f}", f"{rps[name]:.0f}", f"{run.rps_ratio(name, ONE_PROCESS, layer):.2f}×"))
    answered = stats(run.failover.answered)
    rows.append(Comparison(f"failover: `kill -9` of the serving worker to the first queued chat's answer, a standby "
                           f"taking over, median (max) of {answered.n} (ms)", "—",
                           f"{answered.p50:.0f} ({answered.max:.0f})", "—"))
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
    for layer, values in found.hop.items():
        s = stats(values)
        lines.append(f"| one channel-layer message, send to receive (the floor: a grant takes two) | Redis ({layer}) | "
                     f"{s.n} | {s.p50 * 1000:.0f} | {s.p95 * 1000:.0f} | {s.p99 * 1000:.0f} | {s.max * 1000:.0f} |")
    return lines


def latency_table(run: Run) -> list[str]:
    """Each layer's cluster has its own rotation, its one-process service in it."""
    rounds = len(run.processes[DEFAULT_LAYER].chat[DIRECT])
    lines = [f"| tiny chat, {rounds} rounds, ms | cluster's channel layer | p50 | p95 | p99 | added p50 | added p95 "
             "| added p99 |", "|---|---|--:|--:|--:|--:|--:|--:|"]
    for layer in LAYERS:
        chat = run.processes[layer].chat
        for name, direct in ((DIRECT, None), (FRONT_END, DIRECT), (ALONE_DIRECT, None), (ALONE, ALONE_DIRECT)):
            s = stats(chat[name])
            cells = [f"{s.p50:.2f}", f"{s.p95:.2f}", f"{s.p99:.2f}"]
            if direct is None:
                cells += ["", "", ""]
            else:
                extra = stats(run.added(name, direct, layer))
                cells += [f"{extra.p50:+.2f}", f"{extra.p95:+.2f}", f"{extra.p99:+.2f}"]
            lines.append(f"| {name} | {layer} | " + " | ".join(cells) + " |")
    return lines


def throughput_table(run: Run, throughput_requests: int) -> list[str]:
    rounds = len(run.processes[DEFAULT_LAYER].rps[ONE_FRONT_END])
    lines = [f"| {throughput_requests:,} tiny chats, {CLIENTS} clients, requests/s | cluster's channel layer | "
             + " | ".join(f"round {n}" for n in range(1, rounds + 1)) + " | median | ÷ one front end |",
             "|---|---|" + "--:|" * (rounds + 2)]
    for layer in LAYERS:
        for name, values in run.processes[layer].rps.items():
            lines.append(f"| {name} | {layer} | " + " | ".join(f"{v:.0f}" for v in values)
                         + f" | {statistics.median(values):.0f} | {run.rps_ratio(name, ONE_FRONT_END, layer):.2f} |")
    return lines


def failover_table(found: Failover) -> list[str]:
    """What each span holds, so the model's and llamaswap's parts can be told apart."""
    def row(what: str, values: list[float]) -> str:
        s = stats(values)
        return f"| {what} | {s.n} | {s.p50:.0f} | {s.max:.0f} |"

    return [
        f"| failover: `kill -9` of the serving worker, {FAILOVER_QUEUED} tiny chats queued behind a running stream, "
        "a standby standing by and one front end, ms | n | median | max |", "|---|--:|--:|--:|",
        row("kill to the standby's log saying it serves: PostgreSQL releases the dead worker's advisory lock, the "
            "standby checks migrations, stops the model process the dead worker left running and rebuilds the "
            "queue from the rows", found.serving),
        row(f"kill to the first queued chat's row dispatched: also the {GATHER_S:g} s the new worker gathers front "
            "ends' resubmits before ranking, and starting the model again", found.dispatched),
        row("kill to the first queued chat's answer at its client (the front end kept the client)", found.answered),
        row("the fake model's own start, spawn to a healthy /health (inside the two rows above)", found.model_start),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grants", type=int, default=300, help="grant round trips per side")
    parser.add_argument("--jobs", type=int, default=200, help="queued jobs per side for the dispatch gap")
    parser.add_argument("--requests", type=int, default=300, help="rounds of tiny chats for added latency")
    parser.add_argument("--throughput-requests", type=int, default=300, help="tiny chats per throughput run")
    parser.add_argument("--throughput-rounds", type=int, default=3, help="rounds of throughput runs")
    parser.add_argument("--failovers", type=int, default=FAILOVERS, help="kills of the serving worker")
    args = parser.parse_args(argv)

    load_before = load_average()
    try:
        run = measure(args.grants, args.jobs, args.requests, args.throughput_requests, args.throughput_rounds,
                      args.failovers)
    except Unavailable as exc:
        print(f"distributed mode not measured: {exc}")
        return 0
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before: {load_before}, after: {load_average()}")
    for table in (comparison_table(comparisons(run)), scheduling_table(run.scheduling), latency_table(run),
                  throughput_table(run, args.throughput_requests), failover_table(run.failover)):
        print()
        print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
