"""Run the real service for end-to-end tests: `llamaswap serve` in a subprocess, fake models via `cmd:`."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_ports(count: int) -> int:
    """The first of `count` consecutive free ports below the kernel's ephemeral range.

    Outgoing connections (ours, and other processes' on a shared machine) take ephemeral ports;
    a model port in that range can be taken by one before the model starts, failing its start.
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    low, high = share_of_range(10_000, ephemeral_low)
    for _ in range(100):
        first = _PORT_RANDOM.randrange(low, high - count)
        ports = range(first, first + count)
        if _HANDED_OUT.isdisjoint(ports) and all(_bindable(port) for port in ports):
            _HANDED_OUT.update(ports)
            return first
    raise RuntimeError(f"no {count} consecutive free ports between 10000 and {ephemeral_low}")


def share_of_range(low: int, high: int) -> tuple[int, int]:
    """This pytest process's own slice of [low, high) when pytest-xdist runs several (else all of it):
    what one process checks is free and hands out, another could take before it is bound."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    size = (high - low) // count
    return low + index * size, low + (index + 1) * size


# Its own generator: hypothesis reseeds the global one, which made two calls pick the same port.
_PORT_RANDOM = random.Random()
# Ports this process handed out: one not yet bound by its server must not be handed out twice.
_HANDED_OUT: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def fake_cmd(model: str, events: Path | None = None, *args: str) -> str:
    """A `cmd:` line that starts the shipped fake model server, like llama-server would be started."""
    parts = [sys.executable, "-m", "fakemodel", "--port", "${PORT}", "--model", model, *args]
    if events is not None:
        parts += ["--events", str(events)]
    return " ".join(parts)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "rejected", "interrupted"})


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Served:
    """One `llamaswap serve` process on a free loopback port, with its own data dir."""

    def __init__(self, tmp: Path, config_text: str, *, extra_args: tuple[str, ...] = (), env: dict | None = None,
                 repo: Path = REPO):
        """`repo`: the checkout whose code serves (the benchmarks' A/B runs a baseline commit's beside this one)."""
        self.tmp = tmp
        self.repo = repo
        self.config_path = tmp / "config.yaml"
        config_text = textwrap.dedent(config_text)
        if "startPort" not in config_text:
            # Model ports must not collide with other tests' (or a previous run's) model servers.
            config_text = f"startPort: {model_ports(8)}\n" + config_text
        self.config_path.write_text(config_text)
        self.data_dir = tmp / "data"
        self.port = model_ports(1)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "serve.log"
        self.extra_args = extra_args
        self.env = {
            **os.environ,
            "LLAMASWAP_DATA_DIR": str(self.data_dir),
            "LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT": "1",
            "PYTHONPATH": str(repo),
            **(env or {}),
        }
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> Served:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(self.repo / "manage.py"), "serve", "--config", str(self.config_path),
             "--listen", f"127.0.0.1:{self.port}", *self.extra_args],
            cwd=self.repo, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )

        def healthy():
            if self.proc.poll() is not None:
                raise AssertionError(f"llamaswap exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return httpx.get(self.base + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout, 0.05, "llamaswap to answer /health")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def check_settled(self, model: str, timeout: float = 30.0, **fake) -> list[dict]:
        """The end of every fault test: no row is left unfinished, and the next request works.

        Waits until every request row is in a terminal state, then sends one ordinary chat
        request for `model` (`fake`: the fake model's per-request overrides) and asserts a 200
        with the model's answer; returns the rows once that request's row has finished too.
        """
        settled = self._rows_terminal(timeout)
        body = {"model": model, "messages": [{"role": "user", "content": "are you still there?"}]}
        if fake:
            body["fake"] = fake
        reply = httpx.post(self.base + "/v1/chat/completions", json=body, timeout=timeout)
        assert reply.status_code == 200, f"the request after the fault got {reply.status_code}: {reply.text}"
        answer = reply.json()
        assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"], answer
        return self._rows_terminal(timeout, at_least=len(settled) + 1)

    def rows(self) -> list[dict]:
        """Every request row this instance sees, by id: from its PostgreSQL database (DATABASE_URL; in
        distributed mode the rows of every front end and worker sharing it) or its SQLite file."""
        url = self.env.get("DATABASE_URL")
        if not url:
            from tests.e2e.conftest import db_rows

            return db_rows(self.data_dir)
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(url, connect_timeout=5, row_factory=dict_row) as connection:
            return connection.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id").fetchall()

    def _rows_terminal(self, timeout: float, at_least: int = 0) -> list[dict]:
        """Poll the request table until it holds `at_least` rows and none is queued or dispatched."""

        def settled():
            rows = self.rows()
            done = len(rows) >= at_least and all(r["state"] in TERMINAL_STATES for r in rows)
            return (rows,) if done else None  # a tuple: no rows at all is settled too

        try:
            return wait_until(settled, timeout, 0.05, "every request row to reach a terminal state")[0]
        except AssertionError:
            rows = self.rows()
            stuck = [(r["id"], r["model"], r["state"]) for r in rows if r["state"] not in TERMINAL_STATES]
            raise AssertionError(
                f"{len(rows)} rows (expected at least {at_least}); not terminal after {timeout}s: {stuck}"
            ) from None

    def __enter__(self) -> Served:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.stop()
            if self.proc.poll() is None:
                self.kill()


class Worker:
    """One `llamaswap worker` process, its metrics on a free loopback port."""

    def __init__(
        self, tmp, config_text: str, env: dict, *, ready: str = "llamaswap worker serving", extra_args: tuple[str, ...] = ()
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.extra_args = extra_args
        self.ready = ready  # what its log says once it is up: a standby says "llamaswap worker standing by"
        self.config_path = tmp / "config.yaml"
        self.config_path.write_text(config_text)
        self.log_path = tmp / "worker.log"
        self.env = env
        self.metrics_listen = f"127.0.0.1:{model_ports(1)}"
        self.metrics_url = f"http://{self.metrics_listen}/metrics"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Worker:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "worker", "--config", str(self.config_path),
             "--metrics-listen", self.metrics_listen, *self.extra_args],
            cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )

        def serving():
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited with {self.proc.returncode}:\n{self.log()}")
            return self.ready in self.log()

        wait_until(serving, 60, 0.05, f"the worker to log {self.ready!r}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
