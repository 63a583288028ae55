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
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit, urlunsplit

from scheduling.door.in_process import InProcessFrontDoor
from scheduling.rows.columns import FRONT_END_SILENT
from scheduling.runtime import HandedOver
from scheduling.tickets import Carried, Interrupted, Lease, Outcome, Refused, RequestState
from scheduling.outage_log import OutageLog
from scheduling.door import wire

log = logging.getLogger("llamaswap.worker")

FRONT_END_GONE = Outcome(state=RequestState.CANCELLED, error="the front end cancelled the request")
# How many answered keys a worker remembers, to drop a front end's second submit of one it already answered.
ANSWERED_KEYS = 10_000
# A request queued again under its row once its front end, taken for dead, is heard from again.
HEARD_AGAIN = ("queued again under its own row: its front end, taken for dead after {silence:g} s of silence, "
               "was heard from again")
# How long a worker that starts gathers the requests of its rows and what front ends submit (again),
# before ranking them all at once: its first grant goes to the best of them, not to the first to arrive.
GATHER_S = 0.5


@dataclass
class _Remote:
    """A request a front end submitted, until its lease is given back."""

    reply: str
    task: asyncio.Task | None = None
    released: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class SchedulerWorker:
    def __init__(
        self, door: InProcessFrontDoor, layer, models: Iterable[str], *, advertise: str | None = None,
        front_end_timeout_s: float = wire.FRONT_END_TIMEOUT_S, announce_s: float = wire.ANNOUNCE_S,
        gather_s: float = GATHER_S,
    ) -> None:
        self.runtime = door.runtime
        self.door = door
        self.layer = layer
        self.models = tuple(models)
        self.channel = wire.worker_channel(self.models, layer)
        self.announce_s = announce_s
        self.advertise = advertise
        self.front_end_timeout_s = front_end_timeout_s
        self._remotes: dict[str, _Remote] = {}
        self._heard: dict[str, float] = {}  # front end (reply channel) -> when it was last heard from
        self._reached_at = 0.0  # when this worker last reached Redis itself (a receive or an announce went through)
        self._greeted: set[str] = set()  # front ends sent a Hello since they were last taken for dead
        self._answered: set[str] = set()
        self._interrupted: dict[str, Interrupted] = {}  # by key: what a dead worker had granted (`expect_ends`)
        self._answered_order: deque[str] = deque()
        # A silent front end's queued requests, by key -> ticket id: submitted again once it is heard from
        # (it was cut off, not dead), each is queued under its own row again. This and `_interrupted` keep
        # the latest ANSWERED_KEYS: a front end that really died never claims its entries.
        self._let_go: dict[str, int] = {}
        self._handing_over = False
        self.gather_s = gather_s
        self._gathering: dict[str, Carried] | None = {} if gather_s > 0 else None  # by key, until run() ranks them
        self._sends: set[asyncio.Task] = set()
        self.name = f"pid {os.getpid()} on {socket.gethostname()}"
        self._stop_token = uuid.uuid4().hex  # unique even where a restarted worker gets the same pid
        self._announcing = OutageLog(log, "announcing this worker over Redis")
        self._serving: asyncio.Task | None = None  # run()'s task, for a stop that cannot reach Redis
        self._cut_off = False  # the stop found Redis away: no other goodbye is waited for

    def rebuild(self, carried: list[Carried]) -> None:
        """Serve the requests a previous worker left queued (their rows), for the front ends that
        still hold their clients. A front end that does not show up within `front_end_timeout_s`
        is taken for dead with its requests."""
        keyed = [c for c in carried if c.request.origin and c.request.origin not in self._remotes]
        if not keyed:
            return
        now = asyncio.get_running_loop().time()
        for c in keyed:
            self._heard.setdefault(wire.front_end_of(c.request.origin), now)
            self._queue(c.request.origin, _Remote(wire.front_end_of(c.request.origin)), c)
        log.warning("took over %d queued requests from the rows", len(keyed))

    def expect_ends(self, interrupted: list[Interrupted]) -> None:
        """Requests a previous worker had granted when it died: their streams run from the model to the
        front end, which reports their end to whichever worker is on the channel. Their rows say
        `interrupted` until such a report comes."""
        self._interrupted.update((i.origin, i) for i in interrupted)
        _forget_oldest(self._interrupted)
        if interrupted:
            log.warning("%d requests were running when the previous worker stopped: their rows say interrupted "
                        "until their front ends report how they ended", len(interrupted))

    def take_back(self, waiting: dict[str, int], running: list[Interrupted]) -> None:
        """What a previous worker let go with front ends it took for dead (`recovery.let_go_requests`):
        should one be heard from again, it keeps its requests here too, one row each."""
        self._let_go.update(waiting)
        self._interrupted.update((i.origin, i) for i in running)
        _forget_oldest(self._let_go)
        _forget_oldest(self._interrupted)

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
        self._serving = asyncio.current_task()
        reaper = loop.create_task(self._drop_silent_front_ends())
        announcer = loop.create_task(self._announce())
        try:
            self._reached_at = loop.time()
            while True:
                try:
                    body = await wire.receive_or_retry(self.layer, self.channel)
                except asyncio.CancelledError as cancel:
                    if cancel.args != (self._stop_token,):
                        raise
                    asyncio.current_task().uncancel()
                    return  # stop() could not reach Redis
                self._reached()
                try:
                    message = wire.from_message(body)
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("ignoring a message the worker cannot read (%s): %r", exc, body)
                    continue
                if isinstance(message, wire.Stop):
                    if message.sender == self._stop_token:
                        return
                    log.info("ignoring the stop a previous worker left on this channel")
                    continue
                self.handle(message)
        finally:
            reaper.cancel()
            announcer.cancel()
            if not self._cut_off:
                try:
                    async with asyncio.timeout(wire.GOODBYE_S):
                        await self.layer.group_discard(wire.WORKERS_GROUP, self.channel)
                except Exception as exc:  # Redis gone: the group's expiry drops this channel in time
                    log.warning("could not leave the workers' group: %s", exc or type(exc).__name__)

    def _announcement(self) -> wire.Announce:
        return wire.Announce(self.channel, self.models, self.name)

    async def _announce(self) -> None:
        """Tell every front end which models this worker serves, now and every `announce_s`: a front
        end started later asks (`Discover`), and a standby that takes over is known at once."""
        while True:
            try:
                await self.layer.group_send(wire.FRONT_ENDS_GROUP, wire.to_message(self._announcement()))
                await self.layer.group_add(wire.WORKERS_GROUP, self.channel)
                self._reached()
                self._announcing.worked()
            except asyncio.CancelledError:
                raise
            except RuntimeError:  # a pub/sub layer joins only channels it listens on: the first receive is under way
                pass
            except Exception as exc:  # the next round tries again
                self._announcing.failed(exc)
                if isinstance(exc, wire.REDIS_FAILURES):  # the receive's connection may be broken too: it reconnects
                    await wire.drop_connections(self.layer)
            wire.end_if_cancelled()
            await asyncio.sleep(self.announce_s)

    def _in_outage(self, now: float) -> bool:
        """This worker has not reached Redis for three announce rounds: front ends' silence is its own."""
        return now - self._reached_at > 3 * self.announce_s

    def _reached(self) -> None:
        """This worker reached Redis. After an outage of its own, every front end gets a fresh full
        silence window: what they sent meanwhile is still on its way, and their clients are still there."""
        now = asyncio.get_running_loop().time()
        if self._in_outage(now):
            log.warning("reached Redis again after %.1f s: every front end gets %.1f s to be heard from",
                        now - self._reached_at, self.front_end_timeout_s)
            for reply in self._heard:
                self._heard[reply] = now
        self._reached_at = now

    async def _drop_silent_front_ends(self) -> None:
        """Cancel the requests of front ends not heard from for `front_end_timeout_s`: their
        clients are gone with them, and their leases would hold slots for ever. Silence counts only
        while this worker reaches Redis itself: its own outage is no front end's death."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.front_end_timeout_s / 4)
            if self._in_outage(loop.time()):
                continue
            silent_since = loop.time() - self.front_end_timeout_s
            silent = {reply for reply, heard in self._heard.items() if heard < silent_since}
            for reply in silent:
                del self._heard[reply]
                self._greeted.discard(reply)
                count = sum(remote.reply == reply for remote in self._remotes.values())
                if count:
                    log.warning("front end %s went silent: cancelling its %d requests (queued again under their "
                                "rows if it is heard from again)", reply, count)
            dropped = [key for key, remote in self._remotes.items() if remote.reply in silent]
            self._keep_rows_of(dropped)
            self._drop_all(dropped, f"{FRONT_END_SILENT} for {self.front_end_timeout_s:g} s")

    def _keep_rows_of(self, keys: list[str]) -> None:
        """A silent front end may be cut off from Redis rather than dead. Should it be heard from again,
        a stream it relayed on from the model reports how it ended (as after a dead worker, `expect_ends`),
        and a queued request it submits again is queued under its own row: one row per request."""
        wanted, now = set(keys), asyncio.get_running_loop().time()
        running = []
        for ticket_id, (request, _, granted_at) in self.runtime.running_requests():
            if request.origin in wanted:
                wanted.discard(request.origin)
                granted = datetime.now(timezone.utc) - timedelta(seconds=now - granted_at)
                running.append(Interrupted(ticket_id, request.origin, granted))
        waiting = {key: ticket_id for key in wanted if (ticket_id := self.runtime.ticket_of(key)) is not None}
        self.take_back(waiting, running)

    def _reopen_let_go(self, key: str) -> int | None:
        """The row of a request let go with its silent front end and now submitted again, queued once more."""
        ticket_id = self._let_go.pop(key, None)
        if ticket_id is None and (granted := self._interrupted.pop(key, None)) is not None:
            ticket_id = granted.ticket_id  # granted as its front end went silent: the front end never used the grant
        if ticket_id is not None:
            self.runtime.reopen(ticket_id, HEARD_AGAIN.format(silence=self.front_end_timeout_s))
        return ticket_id

    def _drop_all(self, keys: list[str], reason: str) -> None:
        """These requests' front ends are gone: they end in one step, and only then does the scheduler
        pick again (see `SchedulerRuntime.cancel_all`). One by one, freeing a running one's slot could
        grant a queued one of the same dead front end, and start its model for nobody."""
        self.runtime.cancel_all(self.runtime.tickets_of(set(keys)), reason)
        for key in keys:
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
        """End `run()` once the messages sent before this one are handled. With Redis away (refusing, or silent
        for `GOODBYE_S`) that cannot be waited for: `run()` ends now, leaving no group, and what is still on the
        channel waits there for the next worker."""
        try:
            async with asyncio.timeout(wire.GOODBYE_S):
                await self.layer.send(self.channel, wire.to_message(wire.Stop(self._stop_token)))
        except (*wire.REDIS_FAILURES, TimeoutError) as exc:
            log.warning("Redis is unreachable (%s: %s): stopping without reading the rest of this worker's channel",
                        type(exc).__name__, exc or f"no answer within {GOODBYE_S:g} s")
            self._cut_off = True
            if self._serving is not None:
                self._serving.cancel(msg=self._stop_token)

    def handle(self, message: wire.Message) -> None:
        """Act on one message; never blocks, so messages are taken in the order they came."""
        if isinstance(message, (wire.Submit, wire.Heartbeat)):
            if message.reply not in self._greeted and not self._handing_over:
                self._greeted.add(message.reply)
                wire.send_soon(self.layer, message.reply, wire.Hello(self.name, self.channel), self._sends)
            self._heard[message.reply] = asyncio.get_running_loop().time()
        if isinstance(message, wire.Heartbeat):
            return
        if isinstance(message, wire.Discover):
            wire.send_soon(self.layer, message.reply, self._announcement(), self._sends)
        elif isinstance(message, wire.Submit):
            if message.key in self._remotes or self._handing_over:
                return  # a repeated submit (the first one stands), or one for the worker that takes over
            if message.key in self._answered and message.key not in self._interrupted:
                return  # answered already; only a grant let go with its silent front end is asked for again
            request = dataclasses.replace(message.request, origin=message.key)
            if message.arrived_at is None and self._gathering is None:
                self._start(message.key, _Remote(message.reply), self.runtime.submit(request))
            else:
                arrived = datetime.now(timezone.utc) if message.arrived_at is None else min(
                    datetime.now(timezone.utc), datetime.fromtimestamp(message.arrived_at, timezone.utc)
                )
                carried = Carried(request, arrived, self._reopen_let_go(message.key))
                self._queue(message.key, _Remote(message.reply), carried)
        elif isinstance(message, wire.Cancel):
            self._drop(message.key)
        elif isinstance(message, wire.Release):
            remote = self._remotes.get(message.key)
            if remote is not None and not remote.released.done():
                remote.released.set_result(message.outcome)
            elif (interrupted := self._interrupted.pop(message.key, None)) is not None:
                self.runtime.end_interrupted(interrupted, message.outcome)
        elif isinstance(message, wire.Ask):
            asyncio.get_running_loop().create_task(self._answer(message))
        else:
            log.warning("a worker does not take %s messages", type(message).__name__)

    def _start(self, key: str, remote: _Remote, waiting: Coroutine[None, None, Lease]) -> None:
        self._remotes[key] = remote
        loop = asyncio.get_running_loop()
        remote.task = loop.create_task(self._serve(key, remote, waiting))
        loop.call_soon(self._tell_queued, key, remote)  # after the task's first step: queued, or granted at once

    def _tell_queued(self, key: str, remote: _Remote) -> None:
        """Tell the front end the row of a request that was not granted (or refused) at once; one granted at once
        costs no message."""
        if key in self._answered or self._remotes.get(key) is not remote:
            return
        ticket_id = self.runtime.ticket_of(key)
        if ticket_id is not None:
            wire.send_soon(self.layer, remote.reply, wire.Queued(key, ticket_id), self._sends)

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
            except Refused as exc:
                self._answering(key)
                await self._send(remote.reply, wire.TicketRefused(key, exc))
                return
            except asyncio.CancelledError:
                return  # the runtime cancelled the queued request itself
            outcome = FRONT_END_GONE
            try:
                lease.held_by(asyncio.current_task())
                self._answering(key)
                await self._send(
                    remote.reply,
                    wire.Granted(key, lease.ticket_id, self._advertised(lease.upstream), lease.decision, self.channel),
                )
                outcome = await remote.released
            except asyncio.CancelledError:
                if lease.cut is not None and asyncio.current_task().uncancel() == 0:
                    cut = lease.cut
                    await self._send(remote.reply, wire.Cut(key, cut))
            finally:
                self.runtime.release(lease.ticket_id, outcome)
        finally:
            del self._remotes[key]

    async def _answer(self, ask: wire.Ask) -> None:
        """Answer a front end's question as this process's own front door would (`scheduling.door.questions`)."""
        try:
            value = await self.door.ask(ask.question)
        except Exception as exc:  # the asker gets the failure; the worker keeps serving
            if _database_away(exc):  # expected in an outage: no traceback, and its address stays here
                log.warning("answering %s failed: the database is unreachable (%s)", type(ask.question).__name__, exc)
                await self._send(ask.reply, wire.Answer(ask.key, error=type(exc).__name__, database_away=True))
                return
            log.exception("answering %s failed", type(ask.question).__name__)
            await self._send(ask.reply, wire.Answer(ask.key, error=f"{type(exc).__name__}: {exc}"))
            return
        await self._send(ask.reply, wire.Answer(ask.key, value))

    def _advertised(self, upstream: str) -> str:
        """The model server's address as front ends on other machines reach it."""
        if not self.advertise:
            return upstream
        parts = urlsplit(upstream)
        host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
        return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))

    async def _send(self, channel: str, message: wire.Message) -> None:
        await wire.deliver(self.layer, channel, message)  # a grant made while Redis is away waits for it


def _forget_oldest(remembered: dict) -> None:
    """Keep the latest ANSWERED_KEYS entries (dicts keep insertion order)."""
    while len(remembered) > ANSWERED_KEYS:
        del remembered[next(iter(remembered))]


def _database_away(exc: BaseException) -> bool:
    """Whether `exc` is Django's word for the database being unreachable (or a connection it dropped)."""
    from django.db import InterfaceError, OperationalError  # imported late: the worker imports before Django is set up

    return isinstance(exc, (OperationalError, InterfaceError))
