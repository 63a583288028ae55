"""One upstream model server process: start it, wait until it is healthy, stop it leaving nothing behind.

A model server owns GPU memory, so a stray process after a stop or a failed start blocks the next
model from loading. Each model therefore runs in its own process group and every stop ends with
the whole group gone (SIGTERM or the configured stop command first, SIGKILL after the timeout).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any, Callable, Coroutine, Protocol, Sequence, TypeVar

import httpx

from proxy.logring import LogRing

logger = logging.getLogger(__name__)
T = TypeVar("T")

PID_PLACEHOLDER = "${PID}"
LOG_TAIL_LINES = 20

# Readiness is polled quickly at first so swaps of fast-loading models are fast, then backs off.
HEALTH_POLL_FIRST_S = 0.05
HEALTH_POLL_MAX_S = 0.5
HEALTH_POLL_BACKOFF = 1.25
HEALTH_TRY_TIMEOUT_S = 2.0

GROUP_POLL_INTERVAL_S = 0.02
# SIGKILL cannot be ignored, but a process in uninterruptible sleep (e.g. a GPU driver call) takes a moment.
KILL_GRACE_S = 5.0
OUTPUT_DRAIN_TIMEOUT_S = 1.0


class ModelConfig(Protocol):
    """The part of a model's configuration this module needs."""

    id: str
    cmd: tuple[str, ...]
    cmd_stop: tuple[str, ...]
    proxy: str
    check_endpoint: str | None
    env: tuple[tuple[str, str], ...]
    unload_timeout: float


class ModelStartError(Exception):
    """A model server could not be brought to the ready state."""

    def __init__(self, model: str, reason: str, log_tail: str = ""):
        self.model = model
        self.reason = reason
        self.log_tail = log_tail
        super().__init__(model, reason, log_tail)

    def __str__(self) -> str:
        message = f"model {self.model!r} could not start: {self.reason}"
        if self.log_tail:
            return f"{message}; last log lines:\n{self.log_tail}"
        return f"{message}; it printed nothing"


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
    ):
        self.config = config
        self.health_check_timeout = health_check_timeout
        self.log = log
        self.on_exit = on_exit
        self.state = "stopped"
        self.pid: int | None = None
        self.pgid: int | None = None
        self.started_at: float | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._output_copier: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._abort = asyncio.Event()

    def __repr__(self) -> str:
        return f"<ModelProcess {self.config.id!r} {self.state} pid={self.pid}>"

    async def start(self) -> None:
        """Return once the model is ready; raise ModelStartError if it cannot get there."""
        if self._stop_task is not None:
            await asyncio.shield(self._stop_task)
        if self.state == "ready":
            return
        if self._start_task is None:
            self.state = "starting"
            self._abort = asyncio.Event()
            self._start_task = _background(self._start_sequence())
        # Shielded: a caller that gives up (client disconnect) must not abort a start others wait for.
        await asyncio.shield(self._start_task)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop the model (gracefully for up to `timeout` seconds, then SIGKILL) and its whole group."""
        if self._stop_task is None:
            if self.state == "stopped":
                return
            self.state = "stopping"
            self._abort.set()
            grace = self.config.unload_timeout if timeout is None else timeout
            self._stop_task = _background(self._stop_sequence(grace))
        await asyncio.shield(self._stop_task)

    # -- starting ---------------------------------------------------------------------------

    async def _start_sequence(self) -> None:
        try:
            await self._spawn()
            await self._wait_until_healthy()
            if self._abort.is_set():
                raise _StartFailure("aborted")
        except _StartFailure as failure:
            spawned = self._process is not None
            if not self._abort.is_set():  # an aborting stop cleans up after itself
                await self._kill_group()
                self._forget_process()
                self.state = "stopped"
            logger.warning("model %r could not start: %s", self.config.id, failure.reason)
            tail = "\n".join(self.log.tail(LOG_TAIL_LINES)) if spawned else ""
            raise ModelStartError(self.config.id, failure.reason, tail) from None
        except asyncio.CancelledError:
            self._signal_group(signal.SIGKILL)
            self._forget_process()
            self.state = "stopped"
            raise
        finally:
            self._start_task = None
        self.state = "ready"
        logger.info("model %r ready after %.1fs (pid %s)", self.config.id, time.time() - self.started_at, self.pid)

    async def _spawn(self) -> None:
        cmd = self.config.cmd
        if not cmd:
            raise _StartFailure("no command configured")
        env = {**os.environ, **dict(self.config.env)}
        try:
            process = await asyncio.create_subprocess_exec(
                *cmd,
                env=env,
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
        self.pid = process.pid
        self.pgid = process.pid  # start_new_session makes the child the leader of its own group
        self.started_at = time.time()
        self._output_copier = _background(self._copy_output(process))
        _background(self._watch_exit(process))
        logger.info("model %r starting (pid %d): %s", self.config.id, process.pid, " ".join(cmd))

    async def _wait_until_healthy(self) -> None:
        process = self._process
        assert process is not None
        if self.config.check_endpoint is None:
            return
        exited = asyncio.create_task(process.wait())
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
            raise _StartFailure("aborted")
        if healthy in done:
            return
        if exited in done:
            raise _StartFailure(f"{describe_exit(exited.result())} before becoming healthy")
        raise _StartFailure(f"health check timed out after {self.health_check_timeout:g}s")

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

    async def _copy_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            self.log.append(chunk)

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        """Turn an exit of a ready model into `stopped` plus `on_exit`; other exits are expected."""
        returncode = await process.wait()
        if self._process is not process or self.state != "ready":
            return
        logger.warning("model %r exited unexpectedly: %s", self.config.id, describe_exit(returncode))
        self._signal_group(signal.SIGKILL)  # children left behind would keep holding GPU memory
        self._forget_process()
        self.state = "stopped"
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
            self.state = "stopped"
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
            cmd = [token.replace(PID_PLACEHOLDER, str(self.pid)) for token in self.config.cmd_stop]
            try:
                command = await asyncio.create_subprocess_exec(
                    *cmd,
                    env={**os.environ, **dict(self.config.env)},
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
            _signal_group(self.pgid, sig)

    def _forget_process(self) -> None:
        self._process = None
        self._output_copier = None
        self.pid = None
        self.pgid = None
        self.started_at = None


def describe_exit(returncode: int) -> str:
    """'exited with status 3' or 'was killed by SIGKILL' (asyncio reports signals as negative codes)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


def process_group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies waiting to be reaped do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = _running_group_members(pgid)
    return True if members is None else bool(members)


def kill_process_group(pgid: int, *, expect_cmdline: Sequence[str] | None = None, timeout: float = 5.0) -> bool:
    """SIGTERM a process group, SIGKILL it after `timeout`; used to clean up after a proxy crash.

    With `expect_cmdline`, the group is only killed while its leader still runs that exact command:
    a recorded pgid may have been reused by an unrelated process since. Returns whether it killed.
    """
    if not process_group_alive(pgid):
        return False
    if expect_cmdline is not None and _cmdline(pgid) != list(expect_cmdline):
        logger.info("not killing process group %d: its leader no longer runs the recorded command", pgid)
        return False
    if not _signal_group(pgid, signal.SIGTERM):
        return False
    if not _wait_group_gone_blocking(pgid, timeout):
        _signal_group(pgid, signal.SIGKILL)
        if not _wait_group_gone_blocking(pgid, KILL_GRACE_S):
            logger.error("process group %d survived SIGKILL", pgid)
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        logger.error("not allowed to signal process group %d", pgid)
        return False
    return True


def _wait_group_gone_blocking(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_INTERVAL_S)
    return True


def _running_group_members(pgid: int) -> list[int] | None:
    """Pids of the group's non-zombie processes, read from /proc; None where there is no /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # exited while we looked
        # Format: pid (comm) state ppid pgrp ...; comm may itself contain spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry))
    return members


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            raw = cmdline_file.read()
    except OSError:
        return None
    return [os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]]


async def _finish_stop_command(command: asyncio.subprocess.Process, timeout: float) -> None:
    """Give cmdStop the rest of the stop budget to exit, then kill it so it cannot linger."""
    try:
        await asyncio.wait_for(command.wait(), timeout)
    except TimeoutError:
        _signal_group(command.pid, signal.SIGKILL)
        await command.wait()
    if command.returncode:
        logger.warning("stop command (pid %d) %s", command.pid, describe_exit(command.returncode))


def _background(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task whose failure is retrieved even if every awaiter went away (no 'never retrieved' noise)."""
    task = asyncio.create_task(coro)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task
