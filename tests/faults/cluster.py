"""The service under a fault run, in one of two topologies, each process reaching PostgreSQL and
Redis through relays of its own so a fault can hit one process's path alone.

- "single": one `llamaswap serve` on PostgreSQL.
- "distributed": two front ends (`llamaswap serve` with DATABASE_URL and REDIS_URL), an active
  worker and a standby (a second `llamaswap worker` for the same models waits on the instance
  lock). A killed front end restarts on its port; a killed worker is replaced by the standby,
  and a new standby is started.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

from tests.faults.relay import Relay
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, wait_until

MODEL = "chat"
SERVING = "llamaswap worker serving"
STANDING_BY = "llamaswap worker standing by"


def config_text(events: Path) -> str:
    return textwrap.dedent(f"""
        startPort: {model_ports(2)}
        models:
          {MODEL}: {{cmd: "{fake_cmd(MODEL, events)}"}}
        routing:
          scheduler:
            use: serial
    """)


def _through(url: str, relay: Relay) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.replace(f"{parts.hostname}:{parts.port}", relay.url_host)).geturl()


class Process:
    """One process of the service and its relays ("postgres", "redis")."""

    def __init__(self, name: str, kind: str, relays: dict[str, Relay], handle) -> None:
        self.name = name
        self.kind = kind  # "serve" or "worker"
        self.relays = relays
        self.handle = handle  # a Served or a Worker

    @property
    def proc(self):
        return self.handle.proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        return self.handle.log()

    def close(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except Exception:
                self.kill()
        for relay in self.relays.values():
            relay.close()


class Cluster:
    """The processes of one topology; `front_ends` take the clients' requests."""

    def __init__(self, tmp: Path, topology: str, database_url: str, redis_url: str | None) -> None:
        self.tmp = tmp
        self.topology = topology
        self.database_url = database_url
        self.redis_url = redis_url
        self.events = tmp / "events.jsonl"
        self.text = config_text(self.events)
        self.processes: dict[str, Process] = {}
        self.front_ends: list[Process] = []
        self.workers: list[Process] = []  # the active one first, then the standby
        self.worker_names: set[str] = set()
        self._made = 0

    # -- starting -------------------------------------------------------------------------------
    def start(self) -> Cluster:
        if self.topology == "single":
            self.front_ends.append(self._front_end("serve"))
        else:
            self.workers.append(self._worker(SERVING))
            self.workers.append(self._worker(STANDING_BY))
            self.front_ends += [self._front_end("fe1"), self._front_end("fe2")]
        return self

    def _relays(self, name: str) -> dict[str, Relay]:
        relays = {"postgres": self._relay(self.database_url, f"{name}-postgres")}
        if self.redis_url:
            relays["redis"] = self._relay(self.redis_url, f"{name}-redis")
        return relays

    @staticmethod
    def _relay(url: str, name: str) -> Relay:
        parts = urlsplit(url)
        return Relay(parts.hostname, parts.port, name=name).start()

    def _env(self, name: str, relays: dict[str, Relay]) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO), "LLAMASWAP_DATA_DIR": str(self.tmp / name / "data"),
               "DATABASE_URL": _through(self.database_url, relays["postgres"])}
        if self.redis_url:
            env["REDIS_URL"] = _through(self.redis_url, relays["redis"])
        return env

    def _front_end(self, name: str) -> Process:
        (self.tmp / name).mkdir(parents=True)
        relays = self._relays(name)
        served = Served(self.tmp / name, self.text, env=self._env(name, relays)).start(60)
        process = Process(name, "serve", relays, served)
        self.processes[name] = process
        return process

    def _worker(self, ready: str) -> Process:
        self._made += 1
        name = f"w{self._made}"
        relays = self._relays(name)
        worker = Worker(self.tmp / name, self.text, self._env(name, relays), ready=ready).__enter__()
        process = Process(name, "worker", relays, worker)
        self.processes[name] = process
        self.worker_names.add(name)
        return process

    # -- after a fault --------------------------------------------------------------------------
    def restart(self, process: Process, timeout: float = 90.0) -> None:
        """A killed front end starts again on its port; a killed worker's standby takes over and a
        new standby starts. Returns once the service serves again."""
        if process.kind == "serve":
            process.kill()
            process.handle.start(timeout)
            return
        self.replace_dead_workers(timeout)

    def replace_dead_workers(self, timeout: float = 90.0) -> list[str]:
        """Any worker that exited (killed, or shut down after losing its lock) is replaced; returns their names."""
        dead = [w.name for w in self.workers if not w.alive()]
        if not dead:
            return dead
        self.workers = [w for w in self.workers if w.alive()]
        for worker in self.workers:
            wait_until(lambda: SERVING in worker.log() or not worker.alive(), timeout, 0.05,
                       f"{worker.name} to take over")
        self.workers = [w for w in self.workers if w.alive()]
        while len(self.workers) < 2:
            self.workers.append(self._worker(STANDING_BY if self.workers else SERVING))
        return dead

    def heal(self) -> None:
        """Every relay restored and every process serving."""
        for process in self.processes.values():
            for relay in process.relays.values():
                relay.restore()
        for process in self.front_ends:
            if not process.alive():
                process.handle.start(90)
        self.replace_dead_workers()

    def close(self) -> None:
        for process in self.front_ends + self.workers:
            process.close()
        for process in self.processes.values():
            for relay in process.relays.values():
                relay.close()

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{process.log()[-4000:]}" for name, process in self.processes.items())

