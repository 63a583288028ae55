"""The scheduler worker's side of the channel layer: front ends' messages in, the runtime's answers out.

One worker owns a GPU box: its runtime queues what every front end submits, so priority, affinity
and aging hold across front ends. Each submitted request gets a task here that stands in for the
front end's consumer: it waits in the runtime's queue, sends the grant, then holds the lease
until the front end releases it (or cancels, or the GPU is taken back, which it reports as a cut).
Streams never pass through here: the grant names the model server's address and the front end
relays to it directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from scheduling.in_process import InProcessFrontDoor
from scheduling.runtime import Outcome, Rejected
from scheduling.wire import (
    FRONT_END_TIMEOUT_S,
    WORKER_CHANNEL,
    Heartbeat,
    receive_or_retry,
    Answer,
    Ask,
    Cancel,
    Cut,
    Granted,
    Message,
    Refused,
    Release,
    Stop,
    Submit,
    from_message,
    settings_from,
    snapshot_data,
    to_message,
)

log = logging.getLogger("llamaswap.worker")

FRONT_END_GONE = Outcome(state="cancelled", error="the front end cancelled the request")


@dataclass
class _Remote:
    """A request a front end submitted, until its lease is given back."""

    reply: str
    task: asyncio.Task | None = None
    released: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Answers:
    """The questions front ends may ask the worker, each answered with plain data from this
    process's front door (on the event loop, between two scheduling steps)."""

    def __init__(self, door: InProcessFrontDoor) -> None:
        self.door = door

    async def processes(self) -> dict[str, str]:
        return await self.door.processes()

    def snapshot(self) -> dict[str, Any]:
        return snapshot_data(self.door.snapshot())

    def waiting(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(entry) for entry in self.door.read_waiting()]

    def running(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(busy) for busy in self.door.read_running()]

    def cancel_waiting(self, ticket_ids: list[int]) -> list[int]:
        return [tid for tid in ticket_ids if self.door.runtime.operator_cancel(tid)]

    def reprioritize_waiting(self, ticket_ids: list[int], priority: int) -> list[int]:
        return [tid for tid in ticket_ids if self.door.runtime.reprioritize(tid, priority)]

    async def unload(self, models: list[str] | None) -> None:
        await self.door.unload(models)

    def retune(self, settings: dict[str, Any]) -> None:
        self.door.runtime.retune(settings_from(settings))

    async def logs(self) -> str:
        return await self.door.logs()

    def logs_since(self, cursors: dict[str, str], model: str | None = None) -> dict[str, list[str]]:
        """Each log's text after the cursor the front end holds for it (none: all the text kept), with
        the next cursor: a front end streams the logs by asking again and again. `model`: that log only."""
        logs = self.door.fleet.logs
        names = list(logs) if model is None else [model]
        return {name: list(logs[name].since(cursors.get(name))) for name in names if name in logs}


class SchedulerWorker:
    def __init__(
        self, door: InProcessFrontDoor, layer, *, advertise: str | None = None, channel: str = WORKER_CHANNEL,
        front_end_timeout_s: float = FRONT_END_TIMEOUT_S,
    ) -> None:
        self.runtime = door.runtime
        self.answers = Answers(door)
        self.layer = layer
        self.channel = channel
        self.advertise = advertise
        self.front_end_timeout_s = front_end_timeout_s
        self._remotes: dict[str, _Remote] = {}
        self._heard: dict[str, float] = {}  # front end (reply channel) -> when it was last heard from

    async def run(self) -> None:
        """Serve messages until `stop()`."""
        reaper = asyncio.get_running_loop().create_task(self._drop_silent_front_ends())
        try:
            while True:
                body = await receive_or_retry(self.layer, self.channel)
                try:
                    message = from_message(body)
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("ignoring a message the worker cannot read (%s): %r", exc, body)
                    continue
                if isinstance(message, Stop):
                    return
                self.handle(message)
        finally:
            reaper.cancel()

    async def _drop_silent_front_ends(self) -> None:
        """Cancel the requests of front ends not heard from for `front_end_timeout_s`: their
        clients are gone with them, and their leases would hold slots for ever."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.front_end_timeout_s / 4)
            silent_since = loop.time() - self.front_end_timeout_s
            for reply in [reply for reply, heard in self._heard.items() if heard < silent_since]:
                del self._heard[reply]
                dropped = [remote for remote in self._remotes.values() if remote.reply == reply]
                if dropped:
                    log.warning("front end %s went silent: cancelling its %d requests", reply, len(dropped))
                for remote in dropped:
                    if remote.task is not None:
                        remote.task.cancel()

    async def stop(self) -> None:
        """End `run()` once the messages sent before this one are handled."""
        await self._send(self.channel, Stop())

    def handle(self, message: Message) -> None:
        """Act on one message; never blocks, so messages are taken in the order they came."""
        if isinstance(message, (Submit, Heartbeat)):
            self._heard[message.reply] = asyncio.get_running_loop().time()
        if isinstance(message, Heartbeat):
            return
        if isinstance(message, Submit):
            if message.key in self._remotes:
                return  # a repeated submit: the first one stands
            remote = _Remote(message.reply)
            self._remotes[message.key] = remote
            remote.task = asyncio.get_running_loop().create_task(self._serve(message, remote))
        elif isinstance(message, Cancel):
            remote = self._remotes.get(message.key)
            if remote is not None and remote.task is not None:
                remote.task.cancel()
        elif isinstance(message, Release):
            remote = self._remotes.get(message.key)
            if remote is not None and not remote.released.done():
                remote.released.set_result(message.outcome)
        elif isinstance(message, Ask):
            asyncio.get_running_loop().create_task(self._answer(message))
        else:
            log.warning("a worker does not take %s messages", type(message).__name__)

    async def _serve(self, submit: Submit, remote: _Remote) -> None:
        try:
            try:
                lease = await self.runtime.submit(submit.request)
            except Rejected as exc:
                await self._send(remote.reply, Refused(submit.key, exc.status, exc.code, exc.message, exc.retry_after))
                return
            except asyncio.CancelledError:
                return  # the runtime cancelled the queued request itself
            outcome = FRONT_END_GONE
            try:
                lease.held_by(asyncio.current_task())
                await self._send(
                    remote.reply, Granted(submit.key, lease.ticket_id, self._advertised(lease.upstream), lease.decision)
                )
                outcome = await remote.released
            except asyncio.CancelledError:
                if lease.cut is not None and asyncio.current_task().uncancel() == 0:
                    cut = lease.cut
                    await self._send(remote.reply, Cut(submit.key, cut.status, cut.code, cut.message))
            finally:
                self.runtime.release(lease.ticket_id, outcome)
        finally:
            del self._remotes[submit.key]

    async def _answer(self, ask: Ask) -> None:
        question = getattr(self.answers, ask.question, None) if not ask.question.startswith("_") else None
        if question is None:
            await self._send(ask.reply, Answer(ask.key, error=f"a worker does not answer {ask.question!r}"))
            return
        try:
            value = question(**ask.arguments)
            if asyncio.iscoroutine(value):
                value = await value
        except Exception as exc:  # the asker gets the failure; the worker keeps serving
            log.exception("answering %s failed", ask.question)
            await self._send(ask.reply, Answer(ask.key, error=f"{type(exc).__name__}: {exc}"))
            return
        await self._send(ask.reply, Answer(ask.key, value))

    def _advertised(self, upstream: str) -> str:
        """The model server's address as front ends on other machines reach it."""
        if not self.advertise:
            return upstream
        parts = urlsplit(upstream)
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))

    async def _send(self, channel: str, message: Message) -> None:
        await self.layer.send(channel, to_message(message))
