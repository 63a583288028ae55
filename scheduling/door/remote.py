"""A front end's way to the scheduler workers in other processes: the request path over the channel layer.

Each front end listens on a channel of its own for the workers' answers and announcements, and sends
each request to the worker that announced its model (`scheduling.door.directory`). A request is submitted
under a key of this front end's making, and its consumer waits for the grant as it would for the
in-process runtime. A grant that arrives for a request whose client already left is given back
at once, so a slot never leaks when a grant and a cancel cross on the wire.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from scheduling import events
from scheduling.door.frontdoor import DatabaseAway, Unanswered
from scheduling.outage_log import OutageLog
from scheduling.door.refusal_rows import RefusalRows
from scheduling.door.questions import BeginRelayed, EndRelayed, Question, RefuseKey, StillGranted
from scheduling.tickets import Lease, Outcome, Refused, RequestState, TicketRequest
from scheduling.door.directory import WorkerDirectory
from scheduling.door import wire

# How long a question to the worker may take before the caller is told it did not answer.
ANSWER_TIMEOUT_S = 5.0
# How long a new request waits for Redis to come back before it is refused (a blip only delays it).
REDIS_WAIT_S = 5.0
# How long a request for a model no worker has announced waits for one (a front end that just started
# hears every live worker within one announcement round).
ROUTE_WAIT_S = 2 * wire.ANNOUNCE_S
CLOSE_TIMEOUT_S = 5.0  # for the listener to take its stop message
# How many requests refused here a front end remembers, for a grant that crossed the refusal on the wire.
REFUSED_KEPT = 10_000
# Heartbeats failing this long may become a worker's FRONT_END_TIMEOUT_S of silence: grants are checked from then on.
SUSPECT_SILENCE_S = 2 * wire.HEARTBEAT_S

log = logging.getLogger("llamaswap.frontend")

LEFT_BEFORE_GRANT = Outcome(state=RequestState.CANCELLED, error="client disconnected while queued")


@dataclass
class _Held:
    """A lease this front end holds, with what its metrics need when it ends."""

    key: str
    lease: Lease
    route: str
    granted_at: float  # on this front end's event loop clock, as the relay's first byte
    worker: str  # the channel of the worker that granted it
    api_key: str = ""  # the API key row's name, for its per-key series

    def finished(self, outcome: Outcome, now: float) -> events.Finished:
        return events.Finished.of_granted(self.lease.model, self.route, self.lease.decision, outcome,
                                          self.granted_at, now, self.api_key)


class ChannelLayerFrontDoor:
    runs_scheduler = False

    def __init__(
        self, config, layer, *, heartbeat_s: float = wire.HEARTBEAT_S, redis_wait_s: float = REDIS_WAIT_S,
        observer: Callable[[events.RuntimeEvent], None] | None = None,
    ) -> None:
        self.config = config
        # The requests this front end served are counted here, not at the worker (see scheduling.metrics).
        self._observer = observer or (lambda event: None)
        self.layer = layer
        self.workers = WorkerDirectory()
        self.heartbeat_s = heartbeat_s
        self.redis_wait_s = redis_wait_s
        self._beats = OutageLog(log, "sending heartbeats over Redis")
        self._reply: str | None = None
        self._opening: asyncio.Task | None = None
        self._listener: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._keys = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}
        # By key: the request, when it came (Unix time) and the channel of the worker it went to.
        self._submitted: dict[str, tuple[TicketRequest, float, str]] = {}
        self._leases: dict[int, _Held] = {}  # by ticket id
        self._relayed: dict[int, str] = {}  # requests relayed to a peer: ticket id -> the worker writing its row
        self._sends: set[asyncio.Task] = set()
        self._answers: dict[str, asyncio.Future] = {}
        self._submitting: set[str] = set()  # keys whose submit is still being sent
        self._rows: dict[str, int] = {}  # by key: the row of a request its worker said is queued (`Queued`)
        # By key: how a request refused here ended, for the release of a grant that crossed the refusal.
        self._refused: dict[str, Outcome] = {}
        self._loop = asyncio.get_running_loop()
        self.refusals = RefusalRows(self._loop)
        # When a heartbeat last went through, and when a silence long enough for a worker to take this front end
        # for dead last ended: a grant read after such a silence may have been let go meanwhile (`_check_grant`).
        self._beat_at = self._loop.time()
        self._long_silence_ended_at = float("-inf")

    async def submit(self, request: TicketRequest, queued=None) -> Lease:
        arrived_at = time.time()
        deadline = self._loop.time() + self.redis_wait_s
        try:
            reply = await self._through_redis(self._reply_channel, deadline)
        except Refused as exc:
            await self._refused_here(request, "", arrived_at, exc)
            self._observer(events.Unserved(request.model, request.route, 503, key=request.api_key))
            raise
        key = f"{reply}#{next(self._keys)}"
        worker = self.workers.channel_for(request.model) or await self.workers.wait_for(request.model, ROUTE_WAIT_S)
        if worker is None:
            self._observer(events.Unserved(request.model, request.route, 503, key=request.api_key))
            raise Refused(
                503, "no_worker", f"no scheduler worker serves model {request.model!r}: start `llamaswap worker` with a "
                "config that has it, on the machine that runs it", 5,
            )
        granted = asyncio.get_running_loop().create_future()
        self._waiting[key] = granted
        self._submitted[key] = (request, arrived_at, worker)
        try:
            try:
                self._submitting.add(key)
                await self._through_redis(
                    lambda: self.layer.send(worker, wire.to_message(wire.Submit(key, reply, request))), deadline)
            except Refused as exc:
                self._waiting.pop(key, None)
                self._send_later(wire.Cancel(key), worker)  # in case the submit reached the worker after all
                await self._refused_here(request, key, arrived_at, exc)
                raise
            finally:
                self._submitting.discard(key)
            if queued is not None:
                queued(key)
            answer: wire.Granted = await granted
        except Refused as exc:
            self._observer(events.Unserved(request.model, request.route, exc.status, key=request.api_key))
            raise
        except asyncio.CancelledError:
            if self._waiting.pop(key, None) is not None:
                self._send_later(wire.Cancel(key), worker)
            elif granted.done() and not granted.cancelled() and granted.exception() is None:  # granted as the client left
                self._send_later(wire.Release(key, LEFT_BEFORE_GRANT), granted.result().worker)
            self._observer(events.Unserved(request.model, request.route, 499, cancelled=True, key=request.api_key))
            raise
        finally:
            del self._submitted[key]
            self._rows.pop(key, None)
        lease = Lease(answer.ticket_id, request.model, answer.upstream, answer.decision)
        self._leases[answer.ticket_id] = _Held(key, lease, request.route, self._loop.time(), answer.worker,
                                               request.api_key)
        return lease

    async def _refused_here(self, request: TicketRequest, key: str, arrived_at: float, refusal: Refused) -> None:
        """No worker heard of a request refused for want of Redis: its row is this front end's to write."""
        refusal.ticket_id = await self.refusals.record(dataclasses.replace(request, origin=key), arrived_at, refusal)

    async def _through_redis(self, attempt: Callable[[], Awaitable[Any]], deadline: float) -> Any:
        """What `attempt()` (a call over Redis) returns once it goes through. A failure is tried again at
        once on fresh connections (`drop_connections`: a blip can break every pooled one), then every
        `SEND_RETRY_S` while Redis stays away, until `deadline` (on the loop's clock): a brief outage only
        delays a request. Past it, `unreachable`."""
        tries = 0
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that comes as the send
                # completes, and a client that left would then wait on for a grant nobody releases.
                async with asyncio.timeout(max(deadline - self._loop.time(), wire.SEND_RETRY_S)):
                    return await attempt()
            except (*wire.REDIS_FAILURES, TimeoutError) as exc:
                tries += 1
                if tries == 1:
                    await wire.drop_connections(self.layer)
                    continue
                left = deadline - self._loop.time()
                if left <= 0:
                    raise unreachable(exc) from exc
                await asyncio.sleep(min(left, wire.SEND_RETRY_S))
            except Exception as exc:  # not Redis being away (a full channel, say): no reason to wait
                raise unreachable(exc) from exc

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        held = self._leases.pop(ticket_id, None)
        if held is not None:
            self._send_later(wire.Release(held.key, outcome), held.worker)
            self._observer(held.finished(outcome, self._loop.time()))

    async def begin_relayed(self, request: TicketRequest, peer: str, explanation: str) -> int | None:
        """The row of a request relayed to a peer is written by a live worker (any: it only records it)."""
        started_at = time.time()
        try:
            workers = await self._workers_for(None)
            if not workers and self.config.models:  # just started: the workers announce themselves to it now
                await self.workers.wait_for(next(iter(self.config.models)), ROUTE_WAIT_S)
                workers = self.workers.live(self._loop.time())
            if not workers:
                raise RuntimeError("no scheduler worker is up")
            ticket_id = await self._ask_worker(workers[0], BeginRelayed(request, peer, started_at, explanation))
        except Exception as exc:  # the peer still answers; only the row is missing
            log.warning("request to peer %s is not recorded: %s", peer, exc)
            return None
        self._relayed[ticket_id] = workers[0]
        return ticket_id

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        worker = self._relayed.pop(ticket_id, None) if ticket_id is not None else None
        if worker is not None:  # answered on the reply channel, where nobody waits for it
            question = EndRelayed(ticket_id, outcome, seconds, first_byte_s)
            self._send_later(wire.Ask(f"{self._reply}?{next(self._keys)}", self._reply, question), worker)
        self._observer(events.Finished.of_relayed(request, outcome, seconds, first_byte_s))

    async def refuse_key(self, key: str, why: str) -> int:
        """This front end's requests of `key` waiting at a worker are refused here at once, Redis or not, each naming
        its row when its worker said it (`Queued`); each worker holding one is sent a `RefuseKey` of its own,
        delivered once Redis answers, after the submits, which lets them go from its queue and writes their rows
        (`cancelled`, 401, `why`). A grant that crossed the refusal is given back saying the same (`_refused`). One
        whose submit is still being sent is left to the sweep's next call (`proxy.serving.key_watch`), or to its 503."""
        mine = [handle for handle, (request, _, _) in self._submitted.items() if request.api_key == key
                and handle in self._waiting and not self._waiting[handle].done() and handle not in self._submitting]
        for handle in mine:
            self._refused[handle] = Outcome(state=RequestState.CANCELLED, status_code=401, error=why)
            self._waiting.pop(handle).set_exception(Refused(401, "invalid_api_key", why, ticket_id=self._rows.get(handle)))
        while len(self._refused) > REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        for worker in {self._submitted[handle][2] for handle in mine}:  # answered where nobody waits for it
            self._send_later(wire.Ask(f"{self._reply}?{next(self._keys)}", self._reply, RefuseKey(key, why)), worker)
        return len(mine)

    async def ask(self, question: Question) -> Any:
        """Ask the live workers the question names (`Question.workers`), in parallel, and merge their answers.
        A Redis blip only delays the question; `Unanswered` when Redis stays away, or a worker does not answer,
        for `ANSWER_TIMEOUT_S`, or one could not answer."""
        deadline = self._loop.time() + ANSWER_TIMEOUT_S
        await self._listening(question, deadline)
        reach = _Reach(self.workers, self._loop.time(), self._submitted)
        channels = question.workers(reach)
        answers = await asyncio.gather(*(self._ask_worker(channel, question.put_to(channel), deadline)
                                         for channel in channels))
        return question.merge(dict(zip(channels, answers)))

    def ask_now(self, question: Question) -> Any:
        return asyncio.run_coroutine_threadsafe(self.ask(question), self._loop).result()

    async def close(self) -> None:
        """Stop listening; requests still waiting are refused as the service shuts down. With Redis away, the
        messages still unsent (releases, cancels) are given up after `GOODBYE_S`: the worker lets a silent front
        end's requests go after its silence limit, their rows saying so."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._listener is not None:
            try:
                async with asyncio.timeout(wire.GOODBYE_S):
                    await self.layer.send(self._reply, wire.to_message(wire.Stop()))
                await asyncio.wait([self._listener], timeout=CLOSE_TIMEOUT_S)
            except (*wire.REDIS_FAILURES, TimeoutError) as exc:
                log.warning("Redis is unreachable (%s): the front end stops without its last messages",
                            exc or f"no answer within {GOODBYE_S:g} s")
            self._listener.cancel()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(Refused(503, "shutting_down", "llamaswap is shutting down; retry later", 1))
        if self._sends:
            _, unsent = await asyncio.wait(self._sends, timeout=wire.GOODBYE_S)
            for send in unsent:
                send.cancel()
        await self.refusals.close()

    async def _workers_for(self, among: list[str] | None) -> list[str]:
        """The live workers that serve any of the models `among` (None: every one), this front end listening."""
        await self._reply_channel()
        now = self._loop.time()
        return self.workers.live(now) if among is None else self.workers.serving(among, now)

    async def _listening(self, question: Question, deadline: float) -> str:
        """This front end's reply channel, listened on (`_reply_channel`), Redis let `deadline` pass for it."""
        try:
            return await self._through_redis(self._reply_channel, deadline)
        except Refused as exc:
            raise _unreachable(question, exc) from exc

    async def _ask_worker(self, worker: str, question: Question, deadline: float | None = None) -> Any:
        """Ask the worker on channel `worker` (by `deadline`, on the loop's clock: within `ANSWER_TIMEOUT_S`);
        `Unanswered` when it cannot be reached or does not answer by then, or could not answer."""
        deadline = self._loop.time() + ANSWER_TIMEOUT_S if deadline is None else deadline
        reply = await self._listening(question, deadline)
        key = f"{reply}?{next(self._keys)}"
        answer = self._loop.create_future()
        self._answers[key] = answer
        name = type(question).__name__
        try:
            await self._through_redis(
                lambda: self.layer.send(worker, wire.to_message(wire.Ask(key, reply, question))), deadline)
            async with asyncio.timeout_at(deadline):
                result: wire.Answer = await answer
        except Refused as exc:
            raise _unreachable(question, exc) from exc
        except TimeoutError:
            raise Unanswered(f"the scheduler worker did not answer {name!r} within {ANSWER_TIMEOUT_S:g} s") from None
        finally:
            self._answers.pop(key, None)
        if result.database_away:
            raise DatabaseAway(f"the scheduler worker could not answer {name!r}: its database is unreachable "
                               f"({result.error})", result.error)
        if result.error:
            raise Unanswered(f"the scheduler worker could not answer {name!r}: {result.error}")
        return result.value

    async def _reply_channel(self) -> str:
        if self._opening is None or (self._opening.done() and self._reply is None):  # Redis failed it: again
            self._opening = self._loop.create_task(self._open())
        return await asyncio.shield(self._opening)

    async def _open(self) -> str:
        """This front end's channel, made on first use: it then joins the front ends' group (workers
        announce themselves there) and asks every worker already up to announce itself now."""
        self.refusals.prepare()  # its ids are taken now, while the database answers: an outage may take both
        reply = await self.layer.new_channel("llamaswap.frontend.")  # answers wait there until the listener reads
        await self.layer.group_add(wire.FRONT_ENDS_GROUP, reply)
        await self.layer.group_send(wire.WORKERS_GROUP, wire.to_message(wire.Discover(reply)))
        self._reply = reply  # only now: when Redis failed above, the next request starts over
        self._listener = self._loop.create_task(self._listen(reply))
        self._heartbeat = self._loop.create_task(self._beat(reply))
        return reply

    async def _beat(self, reply: str) -> None:
        """Tell every live worker this front end lives, so none waits on the leases of a dead one (and
        stay in the front ends' group, whose members expire)."""
        while True:
            await self._beat_once(wire.FRONT_ENDS_GROUP, self.layer.group_add(wire.FRONT_ENDS_GROUP, reply))
            # Live workers only: a dead one's channel would just fill up; the one that takes over announces itself.
            for worker in self.workers.live(self._loop.time()):
                await self._beat_once(worker, self.layer.send(worker, wire.to_message(wire.Heartbeat(reply))))
            await asyncio.sleep(self.heartbeat_s)

    async def _beat_once(self, target: str, sending) -> None:
        try:
            await sending
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next beat tries again
            self._beats.failed(exc)
            if isinstance(exc, wire.REDIS_FAILURES):  # the listener's connection may be broken too
                await wire.drop_connections(self.layer)
        else:
            self._beats.worked()
            now = self._loop.time()
            if now - self._beat_at >= SUSPECT_SILENCE_S:
                self._long_silence_ended_at = now
            self._beat_at = now
        wire.end_if_cancelled()

    def _grants_suspect(self) -> bool:
        """Whether this front end has been (or is) silent long enough that a worker may have let its requests
        go: from a silence of `SUSPECT_SILENCE_S` until the worker's own limit has passed twice since it ended."""
        now = self._loop.time()
        return (now - self._beat_at >= SUSPECT_SILENCE_S
                or now - self._long_silence_ended_at < 2 * wire.FRONT_END_TIMEOUT_S)

    async def _listen(self, reply: str) -> None:
        while True:
            body = await wire.receive_or_retry(self.layer, reply)
            try:
                message = wire.from_message(body)
                if isinstance(message, wire.Stop):
                    return
                if isinstance(message, wire.Hello):
                    await self._submit_again(reply, message)
                elif isinstance(message, wire.Announce):
                    if self.workers.heard(message, self._loop.time()):
                        await self.layer.send(message.channel, wire.to_message(wire.Heartbeat(reply)))
                else:
                    self._answer(message)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring a message the front end cannot read (%s): %r", exc, body)

    async def _submit_again(self, reply: str, hello: wire.Hello) -> None:
        """A worker heard from this front end for the first time (one took over, or was restarted):
        submit to it again, in order and before any later answer is read, what still waits for its grant."""
        again = [key for key, waiting in self._waiting.items()
                 if not waiting.done() and self._submitted[key][2] == hello.channel]
        if again:
            log.warning("scheduler worker %s is serving: submitting the %d waiting requests again", hello.worker, len(again))
        for key in again:
            request, arrived_at, worker = self._submitted[key]
            try:
                await self.layer.send(worker, wire.to_message(wire.Submit(key, reply, request, arrived_at)))
            except Exception as exc:  # the request stays waiting, until its client gives up
                log.warning("could not submit request %s again: %s", key, exc)

    def _answer(self, message: wire.Message) -> None:
        if isinstance(message, wire.Granted):
            waiting = self._waiting.pop(message.key, None)
            if waiting is None or waiting.done():  # the client left, or was refused here, as it was granted
                self._send_later(wire.Release(message.key, self._refused.pop(message.key, LEFT_BEFORE_GRANT)),
                                 message.worker)
            elif self._grants_suspect():
                task = self._loop.create_task(self._check_grant(message, waiting))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)
            else:
                waiting.set_result(message)
        elif isinstance(message, wire.Queued):
            if message.key in self._waiting:
                self._rows[message.key] = message.ticket_id
        elif isinstance(message, wire.TicketRefused):
            self._refused.pop(message.key, None)
            waiting = self._waiting.pop(message.key, None)
            if waiting is not None and not waiting.done():
                waiting.set_exception(message.refused)
        elif isinstance(message, wire.Answer):
            answer = self._answers.get(message.key)
            if answer is not None and not answer.done():
                answer.set_result(message)
        elif isinstance(message, wire.Cut):
            for ticket_id, held in list(self._leases.items()):
                if held.key == message.key:
                    # Ended as the worker ended it (as the in-process runtime does), not as the client then sees it.
                    cut = message.refused
                    self.release(ticket_id, Outcome(state=RequestState.CANCELLED, status_code=cut.status, error=cut.message))
                    held.lease.revoke(cut)
        else:
            log.warning("a front end does not take %s messages", type(message).__name__)

    async def _check_grant(self, granted: wire.Granted, waiting: asyncio.Future) -> None:
        """A grant read after a long silence: the worker may have taken this front end for dead and let the
        request go, giving its slot (even its model) to another; using the grant would then send a second job to
        a one-slot model, or to one stopped meanwhile. Ask the worker; a grant it let go is asked for again, under
        the request's own row, and waited for anew."""
        key = granted.key
        held = False
        while not waiting.done():
            try:
                held = await self._ask_worker(granted.worker, StillGranted(key))
                break
            except Unanswered as exc:
                log.warning("could not ask whether request %s is still granted (%s); asking again", key, exc)
                await asyncio.sleep(wire.SEND_RETRY_S)
        if waiting.done():  # the client left meanwhile (before the answer, or while it was on its way)
            self._send_later(wire.Release(key, LEFT_BEFORE_GRANT), granted.worker)
            return
        if held:
            waiting.set_result(granted)
            return
        log.warning("request %s was let go while this front end was cut off from Redis: asking for it again", key)
        self._waiting[key] = waiting
        request, arrived_at, worker = self._submitted[key]
        self._send_later(wire.Submit(key, self._reply, request, arrived_at), worker)

    def _send_later(self, message: wire.Message, worker: str) -> None:
        wire.send_soon(self.layer, worker, message, self._sends)


@dataclass(frozen=True)
class _Reach:
    """The workers a front end can ask now (see `scheduling.door.questions.Reach`)."""

    directory: WorkerDirectory
    now: float
    submitted: dict[str, tuple[TicketRequest, float, str]]

    def live(self) -> list[str]:
        return self.directory.live(self.now)

    def serving(self, models: list[str]) -> list[str]:
        return self.directory.serving(models, self.now)

    def holding(self, handle: str) -> list[str]:
        submitted = self.submitted.get(handle)
        return [] if submitted is None else [submitted[2]]


def _unreachable(question: Question, refused: Refused) -> Unanswered:
    """A question that could not be sent: Redis stayed away (`_through_redis`'s refusal says why)."""
    why = type(refused.__cause__).__name__ if refused.__cause__ else refused.message
    return Unanswered(f"cannot reach the scheduler workers over Redis ({why}) to ask {type(question).__name__!r}")


def unreachable(exc: Exception) -> Refused:
    return Refused(503, "scheduler_unreachable", f"cannot reach the scheduler workers over Redis ({exc!r}); retry later", 1)
