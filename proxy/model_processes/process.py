"""One upstream model server process: start it, wait until it is healthy, stop it leaving nothing behind.

A model server owns GPU memory, so a stray process after a stop or a failed start blocks the next
model from loading. Each model therefore runs in its own process group and every stop ends with
the whole group gone (SIGTERM or the configured stop command first, SIGKILL after the timeout).
The group is announced (`on_spawn`) the moment it exists, with what identifies it after this
service is gone, so a restart after a crash can find it even when it never became ready.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, TypeVar

import httpx

from proxy.model_processes import proctable
from proxy.config import ModelConfig
from proxy.config.model import GPUS_REF
from proxy.config.secrets import hidden_values, scrubbed, shown_argv, shown_url
from proxy.model_processes.log_output import copy_model_output
from proxy.model_processes.child_environment import child_environment, resolve_console_script
from proxy.model_processes.logring import LogRing
from proxy.model_processes.process_groups import (
    GROUP_POLL_INTERVAL_S, KILL_GRACE_S, describe_exit, process_group_alive, signal_group,
)
from scheduling.core import ModelState

logger = logging.getLogger("llamaswap.processes")
T = TypeVar("T")

PID_PLACEHOLDER = "${PID}"
LOG_TAIL_LINES = 20
ATTEMPT_LOG_CHARS = 16_000
STOPPED_WHILE_STARTING = "it was stopped before it became ready (unloaded, swapped out or shutting down)"

# Readiness is polled quickly at first so swaps of fast-loading models are fast, then backs off.
HEALTH_POLL_FIRST_S = 0.05
HEALTH_POLL_MAX_S = 0.5
HEALTH_POLL_BACKOFF = 1.25
HEALTH_TRY_TIMEOUT_S = 2.0
# A health answer not provably from the model's own process (a container's port forward, a remote
# host, no /proc) counts once the process has stayed alive this long after it: a server that
# could not bind its port exits at once, while someone else's server answers in its place.
HEALTH_SETTLE_S = 0.5

OUTPUT_DRAIN_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class SpawnedProcess:
    """What identifies a model's process group after this service is gone (see `proxy.model_processes.orphans`).

    The group leader's pid is also the group id. `start_ticks` (None without /proc) tells the
    leader from a later process that reused its pid; `marker` is in the environment of every
    process of the group.
    """

    model: str
    pid: int
    start_ticks: int | None
    marker: str
    cmdline: tuple[str, ...]


class ModelStartError(Exception):
    """A model server could not be brought to the ready state.

    Its text is the reason and this attempt's output; whoever reports it names the model.
    `log_tail` is None when no process was started.
    """

    def __init__(self, model: str, reason: str, log_tail: str | None = None):
        self.model = model
        self.reason = reason
        self.log_tail = log_tail
        super().__init__(model, reason, log_tail)

    def __str__(self) -> str:
        if self.log_tail is None:
            return self.reason
        if self.log_tail:
            return f"{self.reason}; last log lines:\n{self.log_tail}"
        return f"{self.reason}; it printed nothing"


class _StartFailure(Exception):
    """Internal: why a start attempt failed, before cleanup adds the log tail."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ModelProcess:
    """Lifecycle of one model server: stopped → starting → ready → stopping → stopped.

    `start` and `stop` may be called concurrently from many requests: concurrent starts share one
    attempt, a stop during a start aborts it, and a start during a stop waits for the stop first.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        health_check_timeout: float,
        log: LogRing,
        on_exit: Callable[[ModelProcess, int | None], None] | None = None,
        on_spawn: Callable[[SpawnedProcess], None] | None = None,
        on_gone: Callable[[SpawnedProcess], None] | None = None,
        owner: str | None = None,
    ):
        """`on_spawn` hears of each process group as soon as it exists, `on_gone` once it is stopped;
        `owner` ("<data> <pid> <start ticks>") goes into the group's environment with the model's id."""
        self.config = config
        self.health_check_timeout = health_check_timeout
        self.log = log
        self.on_exit = on_exit
        self.on_spawn = on_spawn
        self.on_gone = on_gone
        self.owner = owner
        self.state = ModelState.STOPPED
        self.pid: int | None = None
        self.pgid: int | None = None
        self.started_at: float | None = None
        # The GPUs placement gave the running process (None: not placed; () on the CPU).
        self.gpus: tuple[str, ...] | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._spawned: SpawnedProcess | None = None
        # This start attempt's output alone, for the failure message (the model's log keeps them all).
        self._attempt_log = LogRing(ATTEMPT_LOG_CHARS)
        self._hidden: tuple[bytes, ...] = ()  # credential values of the command line, masked in its output
        # The proxy's port when it is on this machine: the health check verifies who holds it.
        self._local_port: int | None = None
        self._output_copier: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._abort = asyncio.Event()

    def __repr__(self) -> str:
        return f"<ModelProcess {self.config.id!r} {self.state} pid={self.pid}>"

    async def start(self, gpus: tuple[str, ...] | None = None) -> None:
        """Return once the model is ready; raise ModelStartError if it cannot get there.

        `gpus` (placement's; () for the CPU) become the process's CUDA_VISIBLE_DEVICES and fill
        ${GPUS} in its cmd; a start already under way, or a ready model, keeps the GPUs it has."""
        if self._stop_task is not None:
            await asyncio.shield(self._stop_task)
        if self.state == ModelState.READY:
            return
        if self._start_task is None:
            self.state = ModelState.STARTING
            self._abort = asyncio.Event()
            self._start_task = _background(self._start_sequence(gpus))
        # Shielded: a caller that gives up (client disconnect) must not abort a start others wait for.
        await asyncio.shield(self._start_task)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop the model (gracefully for up to `timeout` seconds, then SIGKILL) and its whole group."""
        if self._stop_task is None:
            if self.state == ModelState.STOPPED:
                return
            self.state = ModelState.STOPPING
            self._abort.set()
            grace = self.config.unload_timeout if timeout is None else timeout
            self._stop_task = _background(self._stop_sequence(grace))
        await asyncio.shield(self._stop_task)

    # -- starting ---------------------------------------------------------------------------

    async def _start_sequence(self, gpus: tuple[str, ...] | None) -> None:
        try:
            await self._spawn(gpus)
            await self._wait_until_healthy()
            if self._abort.is_set():
                raise _StartFailure(STOPPED_WHILE_STARTING)
        except _StartFailure as failure:
            spawned = self._process is not None
            if not self._abort.is_set():  # an aborting stop cleans up after itself
                await self._kill_group()
                self._forget_process()
                self.state = ModelState.STOPPED
            tail = "\n".join(self._attempt_log.tail(LOG_TAIL_LINES)) if spawned else None
            raise ModelStartError(self.config.id, failure.reason, tail) from None
        except asyncio.CancelledError:
            self._signal_group(signal.SIGKILL)
            self._forget_process()
            self.state = ModelState.STOPPED
            raise
        finally:
            self._start_task = None
        self.state = ModelState.READY
        logger.info("model %r ready after %.1fs (pid %s)", self.config.id, time.time() - self.started_at, self.pid)

    async def _spawn(self, gpus: tuple[str, ...] | None) -> None:
        if not self.config.cmd:
            raise _StartFailure("it has no cmd, and llamaswap serves only models it starts (a server that runs on "
                                "its own goes under peers:, see the warning at load)")
        cmd = _placed(self.config.cmd, gpus)
        await self._check_port_is_free()
        marker = uuid.uuid4().hex
        try:
            process = await asyncio.create_subprocess_exec(
                *resolve_console_script(cmd),
                env=child_environment(
                    self.config.env, marker, None if self.owner is None else f"{self.owner} {self.config.id}", gpus
                ),
                start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except FileNotFoundError:
            raise _StartFailure(f"command not found: {cmd[0]}") from None
        except PermissionError:
            raise _StartFailure(f"permission denied running {cmd[0]} (is it executable?)") from None
        except OSError as exc:
            raise _StartFailure(f"could not run {cmd[0]}: {exc.strerror or exc}") from None
        self._process = process
        self.gpus = gpus
        self.pid = process.pid
        self.pgid = process.pid  # start_new_session makes the child the leader of its own group
        self.started_at = time.time()
        # Not reaped yet, so the pid cannot have been reused: these are the child's own start ticks.
        self._spawned = SpawnedProcess(self.config.id, process.pid, proctable.start_ticks(process.pid), marker, cmd)
        self._notify(self.on_spawn, "spawn")
        self._attempt_log = LogRing(ATTEMPT_LOG_CHARS)
        self._hidden = hidden_values(cmd)
        self._output_copier = _background(self._copy_output(process, self._attempt_log))
        _background(self._watch_exit(process))
        logger.info("model %r starting (pid %d): %s", self.config.id, process.pid, " ".join(shown_argv(cmd)))

    async def _check_port_is_free(self) -> None:
        """Refuse to start when something on this machine already listens on the model's port.

        The model server would fail to bind, and its health check would pass against the other
        server, whose answers would then be served as the model's.
        """
        address = _host_and_port(self.config.proxy)
        self._local_port = None
        if address is None:
            return
        host, port = address
        verdict = await _probe_port(host, port)
        if verdict == "in use":
            raise _StartFailure(f"port {port} (from its proxy {shown_url(self.config.proxy)}) is in use by another process")
        if verdict == "free":
            self._local_port = port

    async def _wait_until_healthy(self) -> None:
        process = self._process
        assert process is not None
        if self.config.check_endpoint is None:
            return
        exited = asyncio.create_task(_exit_of(process))
        aborted = asyncio.create_task(self._abort.wait())
        healthy = asyncio.create_task(self._poll_health())
        waiters = {exited, aborted, healthy}
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=self.health_check_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
        if aborted in done:
            raise _StartFailure(STOPPED_WHILE_STARTING)
        if exited in done:
            raise _StartFailure(f"{describe_exit(exited.result())} before becoming healthy")
        if healthy in done:
            if (error := healthy.exception()) is not None:
                raise _StartFailure(f"its health check could not run: {describe_error(error)}")
            await self._confirm_the_answer_is_ours(process)
            return
        raise _StartFailure(f"health check timed out after {self.health_check_timeout:g}s")

    async def _confirm_the_answer_is_ours(self, process: asyncio.subprocess.Process) -> None:
        """A 200 makes the model ready only if its own process gave it.

        When the port is on this machine and a process of the model's group listens on it, it
        did. Otherwise (a container's port forward, a remote host, no /proc) the process must
        still run `HEALTH_SETTLE_S` later: one that lost its port to another server exits.
        """
        if process.returncode is not None:
            raise _StartFailure(f"{describe_exit(process.returncode)} before becoming healthy")
        if self._local_port is not None and proctable.group_listens_on(process.pid, self._local_port):
            return
        try:
            returncode = await asyncio.wait_for(_exit_of(process), HEALTH_SETTLE_S)
        except TimeoutError:
            return
        raise _StartFailure(
            f"{describe_exit(returncode)} before becoming healthy, while another process answered its health check"
        )

    async def _poll_health(self) -> None:
        """Return once the health endpoint answers 200; anything else (refused, 503…) means not yet."""
        assert self.config.check_endpoint is not None
        url = self.config.proxy.rstrip("/") + "/" + self.config.check_endpoint.lstrip("/")
        interval = HEALTH_POLL_FIRST_S
        async with httpx.AsyncClient(trust_env=False, timeout=HEALTH_TRY_TIMEOUT_S) as client:
            while True:
                try:
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(interval)
                interval = min(interval * HEALTH_POLL_BACKOFF, HEALTH_POLL_MAX_S)

    # -- running ----------------------------------------------------------------------------

    async def _copy_output(self, process: asyncio.subprocess.Process, attempt_log: LogRing | None = None) -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            chunk = scrubbed(chunk, self._hidden)  # a server that prints its own command line shows no key
            self.log.append(chunk)
            copy_model_output(chunk)
            if attempt_log is not None:
                attempt_log.append(chunk)

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        """Turn an exit of a ready model into `stopped` plus `on_exit`; other exits are expected."""
        returncode = await process.wait()
        if self._process is not process or self.state != ModelState.READY:
            return
        self._exited(describe_exit(returncode), returncode)

    def check_exited(self) -> bool:
        """Whether a ready model's process group is gone, reported at once (as `_watch_exit` would,
        later). Its clients see the connection drop before the exit is reaped, even before the
        process is a zombie; a request granted in between would go to a dead server instead of
        starting the model again. So a process already exiting counts as gone here."""
        if self.state != ModelState.READY or self.pgid is None or process_group_alive(self.pgid, exiting=False):
            return False
        returncode = None if self._process is None else self._process.returncode  # None until reaped
        self._exited("exited" if returncode is None else describe_exit(returncode), returncode)
        return True

    def _exited(self, how: str, returncode: int | None) -> None:
        logger.warning("model %r exited unexpectedly: %s", self.config.id, how)
        self._signal_group(signal.SIGKILL)  # children left behind would keep holding GPU memory
        self._forget_process()
        self.state = ModelState.STOPPED
        if self.on_exit is not None:
            try:
                self.on_exit(self, returncode)
            except Exception:
                logger.exception("exit handler of model %r failed", self.config.id)

    # -- stopping ---------------------------------------------------------------------------

    async def _stop_sequence(self, timeout: float) -> None:
        try:
            if self._start_task is not None:
                await asyncio.wait({self._start_task})
            await self._terminate(timeout)
        finally:
            self._forget_process()
            self.state = ModelState.STOPPED
            self._stop_task = None

    async def _terminate(self, timeout: float) -> None:
        process = self._process
        if process is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        stop_command = None
        if process.returncode is None or process_group_alive(self.pgid):
            stop_command = await self._ask_to_exit()
            if not await self._wait_group_gone(process, deadline):
                logger.warning(
                    "model %r did not stop within %gs; killing process group %s", self.config.id, timeout, self.pgid
                )
                await self._kill_group()
        if stop_command is not None:
            await _finish_stop_command(stop_command, max(deadline - loop.time(), 0.0))
        await self._drain_output()
        logger.info("model %r stopped", self.config.id)

    async def _ask_to_exit(self) -> asyncio.subprocess.Process | None:
        """Run cmdStop if configured, otherwise SIGTERM the group; returns the cmdStop process."""
        if self.config.cmd_stop:
            cmd = [token.replace(PID_PLACEHOLDER, str(self.pid)) for token in _placed(self.config.cmd_stop, self.gpus)]
            try:
                command = await asyncio.create_subprocess_exec(
                    *cmd,
                    env=child_environment(self.config.env, gpus=self.gpus),
                    start_new_session=True,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
            except OSError as exc:
                logger.warning(
                    "stop command of model %r could not run (%s: %s); sending SIGTERM instead",
                    self.config.id, cmd[0], exc.strerror or exc,
                )
            else:
                _background(self._copy_output(command))
                return command
        self._signal_group(signal.SIGTERM)
        return None

    async def _kill_group(self) -> None:
        process = self._process
        if process is None:
            return
        self._signal_group(signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + KILL_GRACE_S
        if not await self._wait_group_gone(process, deadline):
            logger.error("process group %s of model %r survived SIGKILL", self.pgid, self.config.id)
        await self._drain_output()

    async def _wait_group_gone(self, process: asyncio.subprocess.Process, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while process.returncode is None or process_group_alive(self.pgid):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(GROUP_POLL_INTERVAL_S)
        return True

    async def _drain_output(self) -> None:
        """Let the output copier read what the process printed last, so log tails are complete."""
        if self._output_copier is None:
            return
        done, _ = await asyncio.wait({self._output_copier}, timeout=OUTPUT_DRAIN_TIMEOUT_S)
        if not done:
            logger.warning("output of model %r is still open after it stopped", self.config.id)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.pgid is not None:
            signal_group(self.pgid, sig)

    def _forget_process(self) -> None:
        if self._spawned is not None:
            self._notify(self.on_gone, "stop")
        self._process = None
        self._spawned = None
        self._output_copier = None
        self.gpus = None
        self.pid = None
        self.pgid = None
        self.started_at = None

    def _notify(self, hook: Callable[[SpawnedProcess], None] | None, what: str) -> None:
        if hook is not None and self._spawned is not None:
            try:
                hook(self._spawned)
            except Exception:
                logger.exception("%s handler of model %r failed", what, self.config.id)


async def _exit_of(process: asyncio.subprocess.Process) -> int:
    """The process's exit status, as soon as it exits.

    Not `process.wait()`: that also waits for its output pipe to close, which a child it left
    behind (or another server it started) can keep open long after.
    """
    while process.returncode is None:
        await asyncio.sleep(GROUP_POLL_INTERVAL_S)
    return process.returncode


def _placed(argv: tuple[str, ...], gpus: tuple[str, ...] | None) -> tuple[str, ...]:
    """`argv` with ${GPUS} filled in with the GPUs placement gave (left as written when not placed)."""
    if gpus is None:
        return argv
    return tuple(token.replace(GPUS_REF, ",".join(gpus)) for token in argv)


def describe_error(error: BaseException) -> str:
    """An exception as words, never empty: some (timeouts, bare errors) have no message of their own."""
    return str(error) or type(error).__name__


def _host_and_port(url: str) -> tuple[str, int] | None:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


async def _probe_port(host: str, port: int) -> str:
    """'in use' when a listener on this machine holds host:port, 'free', or 'not local'/'unknown'.

    Binding tells all three: the address is not ours (EADDRNOTAVAIL), someone listens there
    (EADDRINUSE), or it is free. SO_REUSEADDR, as servers set it, lets connections our previous
    server left in TIME_WAIT not count as a listener.
    """
    try:
        addresses = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:  # the name does not resolve: the health check will say what is wrong
        return "unknown"
    verdict = "not local"
    for family, kind, protocol, _, address in addresses:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            if exc.errno != errno.EADDRNOTAVAIL and verdict == "not local":
                verdict = "unknown"  # e.g. a port below 1024 without the right to bind it
            continue
        verdict = "free"
    return verdict


async def _finish_stop_command(command: asyncio.subprocess.Process, timeout: float) -> None:
    """Give cmdStop the rest of the stop budget to exit, then kill it so it cannot linger."""
    try:
        await asyncio.wait_for(command.wait(), timeout)
    except TimeoutError:
        signal_group(command.pid, signal.SIGKILL)
        await command.wait()
    if command.returncode:
        logger.warning("stop command (pid %d) %s", command.pid, describe_exit(command.returncode))


def _background(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task whose failure is retrieved even if every awaiter went away (no 'never retrieved' noise)."""
    task = asyncio.create_task(coro)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task
