"""The nemesis of a fault run: a schedule of faults drawn from a seed, applied one at a time to the
cluster while the clients send, each recorded with when it began and when the service was whole
again. Faults: cut, stall or slow one process's path to PostgreSQL or Redis (a partition of that
process alone), cut both at once, the same for every process at once (the server itself away, in
the distributed topology), or kill -9 a process."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from tests.faults.cluster import Cluster
from tests.faults.history import Fault

RELAY_FAULTS = ("cut", "stall", "delay", "partition")


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the run began
    kind: str  # "cut", "stall", "delay", "partition" (cut of every relay of the process) or "kill"
    target: str  # "front end" or "worker": which role, the process drawn when it is applied; or
    # "everyone": the path of every process at once, as when the server itself goes away
    path: str  # "postgres", "redis", "both" or "process"
    seconds: float  # how long it holds (for a kill: how long before the restart)
    pick: float  # in [0, 1): which process of the role


def schedule(seed: int, seconds: float, topology: str) -> list[Planned]:
    rng = random.Random(seed ^ 0x5EED)
    roles = ("front end",) if topology == "single" else ("front end", "worker", "everyone")
    paths = ("postgres",) if topology == "single" else ("postgres", "redis")
    planned, at = [], rng.uniform(1.0, 3.0)
    while at < seconds:
        kind = rng.choice(RELAY_FAULTS + ("kill",))
        role = rng.choice(roles)
        if kind == "kill" and role == "everyone":
            role = rng.choice(roles[:2])  # one process at a time: the service has no whole-cluster restart
        if kind == "kill":
            path, hold = "process", rng.uniform(0.0, 2.0)
        elif kind == "partition":
            path, hold = "both", rng.uniform(1.0, 8.0)
        else:
            path, hold = rng.choice(paths), rng.uniform(1.0, 8.0)
        planned.append(Planned(at, kind, role, path, hold, rng.random()))
        at += hold + rng.uniform(1.0, 4.0)  # quiet time between faults
    return planned


class Nemesis:
    def __init__(self, cluster: Cluster, planned: list[Planned]) -> None:
        self.cluster = cluster
        self.planned = planned
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> Nemesis:
        self._thread.start()
        return self

    def stop(self, timeout: float = 180.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        began = time.monotonic()
        for planned in self.planned:
            if self._stop.wait(max(0.0, began + planned.at - time.monotonic())):
                return
            try:
                self._apply(planned)
            except Exception as exc:  # the run goes on; the report names it
                self.errors.append(f"{planned}: {exc!r}")

    def _apply(self, planned: Planned) -> None:
        cluster = self.cluster
        if planned.target == "everyone":
            processes = cluster.front_ends + cluster.workers
        else:
            pool = cluster.front_ends if planned.target == "front end" else cluster.workers
            processes = [pool[int(planned.pick * len(pool))]]
        start = time.time()
        if planned.kind == "kill":
            process = processes[0]
            process.kill()
            self._stop.wait(planned.seconds)
            cluster.restart(process)
            self.faults.append(Fault("kill", process.name, "process", start, time.time()))
            return
        paths = list(processes[0].relays) if planned.path == "both" else [planned.path]
        relays = [(process, path, process.relays[path]) for process in processes for path in paths]
        for _, _, relay in relays:
            {"cut": relay.cut, "partition": relay.cut, "stall": relay.stall}.get(
                planned.kind, lambda: relay.delay(0.2))()
        self._stop.wait(planned.seconds)
        for _, _, relay in relays:
            relay.restore()
        end = time.time()
        for process, path, _ in relays:
            self.faults.append(Fault(planned.kind, process.name, path, start, end))
        # A worker that lost its instance lock while cut off shuts itself down and its standby takes
        # over: for the checker that is a worker's death, from the fault's start until then.
        for name in cluster.replace_dead_workers():
            self.faults.append(Fault("kill", name, "process", start, time.time()))
