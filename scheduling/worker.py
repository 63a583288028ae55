"""The scheduler worker's side of the channel layer: front ends' messages in, the runtime's answers out.

One worker owns a GPU box (the models of its config): it announces them to the front ends, and its
runtime queues what every front end submits for them, so priority, affinity and aging hold across
front ends. When it starts, it takes over what a previous worker for those models left queued. Each submitted request gets a task here that stands in for the
front end's consumer: it waits in the runtime's queue, sends the grant, then holds the lease
until the front end releases it (or cancels, or the GPU is taken back, which it reports as a cut).
Streams never pass through here: the grant names the model server's address and the front end
relays to it directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from scheduling.in_process import InProcessFrontDoor
from scheduling.runtime import Carried, HandedOver, Lease, Outcome, Rejected, TicketRequest
from scheduling.wire import (
    ANNOUNCE_S,
    FRONT_END_TIMEOUT_S,
    FRONT_ENDS_GROUP,
    WORKERS_GROUP,
    Announce,
    Discover,
    Heartbeat,
    Hello,
    front_end_of,
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
    end_if_cancelled,
    from_message,
    settings_from,
    send_soon,
    snapshot_data,
    to_message,
    worker_channel,
)

log = logging.getLogger("llamaswap.worker")

FRONT_END_GONE = Outcome(state="cancelled", error="the front end cancelled the request")
# How many answered keys a worker remembers, to drop a front end's second submit of one it already answered.
ANSWERED_KEYS = 10_000
# How long a worker that starts gathers the requests of its rows and what front ends submit (again),
# before ranking them all at once: its first grant goes to the best of them, not to the first to arrive.
GATHER_S = 0.5


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

    def queue(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(entry) for entry in self.door.read_queue()]

    def queue_entry(self, ticket_id: int) -> dict[str, Any] | None:
        entry = self.door.read_queue_entry(ticket_id)
        return None if entry is None else dataclasses.asdict(entry)

    def progress(self, origin: str) -> dict[str, Any] | None:
        """Where the request a front end knows as `origin` stands."""
        ticket_id = self.door.runtime.ticket_of(origin)
        return None if ticket_id is None else self.queue_entry(ticket_id)

    def cancel_request(self, ticket_id: int) -> bool:
        return self.door.end_request(ticket_id)

    def begin_relayed(self, request: dict[str, Any], peer: str, started_at: float, explanation: str) -> int:
        """A front end relays a request to a peer: its row (the front end's clock says when it began)."""
        began = datetime.fromtimestamp(started_at, timezone.utc)
        return self.door.runtime.begin_relayed(TicketRequest(**request), peer, began, explanation)

    def end_relayed(self, ticket_id: int, outcome: dict[str, Any], seconds: float, first_byte_s: float | None) -> None:
        self.door.runtime.end_relayed(ticket_id, Outcome(**outcome), seconds, first_byte_s)

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
        self, door: InProcessFrontDoor, layer, models: Iterable[str], *, advertise: str | None = None,
        front_end_timeout_s: float = FRONT_END_TIMEOUT_S, announce_s: float = ANNOUNCE_S, gather_s: float = GATHER_S,
    ) -> None:
        self.runtime = door.runtime
        self.answers = Answers(door)
        self.layer = layer
        self.models = tuple(models)
        self.channel = worker_channel(self.models)
        self.announce_s = announce_s
        self.advertise = advertise
        self.front_end_timeout_s = front_end_timeout_s
        self._remotes: dict[str, _Remote] = {}
        self._heard: dict[str, float] = {}  # front end (reply channel) -> when it was last heard from
        self._greeted: set[str] = set()  # front ends sent a Hello since they were last taken for dead
        self._answered: set[str] = set()
        self._answered_order: deque[str] = deque()
        self._handing_over = False
        self.gather_s = gather_s
        self._gathering: dict[str, Carried] | None = {} if gather_s > 0 else None  # by key, until run() ranks them
        self._sends: set[asyncio.Task] = set()
        self.name = f"pid {os.getpid()} on {socket.gethostname()}"
        self._stop_token = uuid.uuid4().hex  # unique even where a restarted worker gets the same pid

    def rebuild(self, carried: list[Carried]) -> None:
        """Serve the requests a previous worker left queued (their rows), for the front ends that
        still hold their clients. A front end that does not show up within `front_end_timeout_s`
        is taken for dead with its requests."""
        keyed = [c for c in carried if c.request.origin and c.request.origin not in self._remotes]
        if not keyed:
            return
        now = asyncio.get_running_loop().time()
        for c in keyed:
            self._heard.setdefault(front_end_of(c.request.origin), now)
            self._queue(c.request.origin, _Remote(front_end_of(c.request.origin)), c)
        log.warning("took over %d queued requests from the rows", len(keyed))

    def _queue(self, key: str, remote: _Remote, carried: Carried) -> None:
        if self._gathering is None:
            self._start(key, remote, self.runtime.requeue([carried])[0])
        else:
            self._remotes[key] = remote
            self._gathering[key] = carried

    def _rank_gathered(self) -> None:
        gathered, self._gathering = self._gathering or {}, None
        if self._handing_over:
            for key in gathered:  # their front ends submit them again to the next worker
                del self._remotes[key]
        elif gathered:
            for key, waiting in zip(gathered, self.runtime.requeue(list(gathered.values()))):
                self._start(key, self._remotes[key], waiting)

    def hand_over(self) -> int:
        """Stop taking requests and leave the queued ones queued, for the worker that takes over."""
        self._handing_over = True
        gathered = len(self._gathering or ())
        self._rank_gathered()
        return gathered + self.runtime.hand_over()

    async def run(self) -> None:
        """Serve messages until `stop()`."""
        loop = asyncio.get_running_loop()
        if self._gathering is not None:
            loop.call_later(self.gather_s, self._rank_gathered)
        reaper = loop.create_task(self._drop_silent_front_ends())
        announcer = loop.create_task(self._announce())
        try:
            while True:
                body = await receive_or_retry(self.layer, self.channel)
                try:
                    message = from_message(body)
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("ignoring a message the worker cannot read (%s): %r", exc, body)
                    continue
                if isinstance(message, Stop):
                    if message.sender == self._stop_token:
                        return
                    log.info("ignoring the stop a previous worker left on this channel")
                    continue
                self.handle(message)
        finally:
            reaper.cancel()
            announcer.cancel()
            try:
                await self.layer.group_discard(WORKERS_GROUP, self.channel)
            except Exception as exc:  # Redis gone: the group's expiry drops this channel in time
                log.warning("could not leave the workers' group: %s", exc)

    def _announcement(self) -> Announce:
        return Announce(self.channel, self.models, self.name)

    async def _announce(self) -> None:
        """Tell every front end which models this worker serves, now and every `announce_s`: a front
        end started later asks (`Discover`), and a standby that takes over is known at once."""
        while True:
            try:
                await self.layer.group_send(FRONT_ENDS_GROUP, to_message(self._announcement()))
                await self.layer.group_add(WORKERS_GROUP, self.channel)
            except asyncio.CancelledError:
                raise
            except RuntimeError:  # a pub/sub layer joins only channels it listens on: the first receive is under way
                pass
            except Exception as exc:  # the next round tries again
                log.warning("could not announce this worker to the front ends: %s", exc)
            end_if_cancelled()
            await asyncio.sleep(self.announce_s)

    async def _drop_silent_front_ends(self) -> None:
        """Cancel the requests of front ends not heard from for `front_end_timeout_s`: their
        clients are gone with them, and their leases would hold slots for ever."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.front_end_timeout_s / 4)
            silent_since = loop.time() - self.front_end_timeout_s
            for reply in [reply for reply, heard in self._heard.items() if heard < silent_since]:
                del self._heard[reply]
                self._greeted.discard(reply)
                dropped = [key for key, remote in self._remotes.items() if remote.reply == reply]
                if dropped:
                    log.warning("front end %s went silent: cancelling its %d requests", reply, len(dropped))
                for key in dropped:
                    self._drop(key)

    def _drop(self, key: str) -> None:
        """The front end cancelled the request, or is gone: wherever it is, it ends."""
        remote = self._remotes.get(key)
        if remote is None:
            return
        if remote.task is not None:
            remote.task.cancel()
        elif self._gathering is not None and (carried := self._gathering.pop(key, None)) is not None:
            del self._remotes[key]  # not queued yet: nothing to answer, but a row of a previous worker ends
            if carried.ticket_id is not None:
                self.runtime.drop_carried(carried.ticket_id, "the client left while no worker served it")

    async def stop(self) -> None:
        """End `run()` once the messages sent before this one are handled."""
        await self._send(self.channel, Stop(self._stop_token))

    def handle(self, message: Message) -> None:
        """Act on one message; never blocks, so messages are taken in the order they came."""
        if isinstance(message, (Submit, Heartbeat)):
            if message.reply not in self._greeted and not self._handing_over:
                self._greeted.add(message.reply)
                send_soon(self.layer, message.reply, Hello(self.name, self.channel), self._sends)
            self._heard[message.reply] = asyncio.get_running_loop().time()
        if isinstance(message, Heartbeat):
            return
        if isinstance(message, Discover):
            send_soon(self.layer, message.reply, self._announcement(), self._sends)
        elif isinstance(message, Submit):
            if message.key in self._remotes or message.key in self._answered or self._handing_over:
                return  # a repeated submit (the first one stands), or one for the worker that takes over
            request = dataclasses.replace(message.request, origin=message.key)
            if message.arrived_at is None and self._gathering is None:
                self._start(message.key, _Remote(message.reply), self.runtime.submit(request))
            else:
                arrived = datetime.now(timezone.utc) if message.arrived_at is None else min(
                    datetime.now(timezone.utc), datetime.fromtimestamp(message.arrived_at, timezone.utc)
                )
                self._queue(message.key, _Remote(message.reply), Carried(request, arrived))
        elif isinstance(message, Cancel):
            self._drop(message.key)
        elif isinstance(message, Release):
            remote = self._remotes.get(message.key)
            if remote is not None and not remote.released.done():
                remote.released.set_result(message.outcome)
        elif isinstance(message, Ask):
            asyncio.get_running_loop().create_task(self._answer(message))
        else:
            log.warning("a worker does not take %s messages", type(message).__name__)

    def _start(self, key: str, remote: _Remote, waiting: Coroutine[None, None, Lease]) -> None:
        self._remotes[key] = remote
        remote.task = asyncio.get_running_loop().create_task(self._serve(key, remote, waiting))

    def _answering(self, key: str) -> None:
        """Remember that `key` has its answer, so a second submit of it is dropped."""
        self._answered.add(key)
        self._answered_order.append(key)
        if len(self._answered_order) > ANSWERED_KEYS:
            self._answered.discard(self._answered_order.popleft())

    async def _serve(self, key: str, remote: _Remote, waiting: Coroutine[None, None, Lease]) -> None:
        try:
            try:
                lease = await waiting
            except HandedOver:
                return  # its row stays queued for the worker that takes over
            except Rejected as exc:
                self._answering(key)
                await self._send(remote.reply, Refused(key, exc.status, exc.code, exc.message, exc.retry_after, exc.ticket_id))
                return
            except asyncio.CancelledError:
                return  # the runtime cancelled the queued request itself
            outcome = FRONT_END_GONE
            try:
                lease.held_by(asyncio.current_task())
                self._answering(key)
                await self._send(
                    remote.reply,
                    Granted(key, lease.ticket_id, self._advertised(lease.upstream), lease.decision, self.channel),
                )
                outcome = await remote.released
            except asyncio.CancelledError:
                if lease.cut is not None and asyncio.current_task().uncancel() == 0:
                    cut = lease.cut
                    await self._send(remote.reply, Cut(key, cut.status, cut.code, cut.message))
            finally:
                self.runtime.release(lease.ticket_id, outcome)
        finally:
            del self._remotes[key]

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

