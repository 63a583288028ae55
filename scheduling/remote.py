"""A front end's way to the scheduler workers in other processes: the request path over the channel layer.

Each front end listens on a channel of its own for the workers' answers and announcements, and sends
each request to the worker that announced its model (`scheduling.directory`). A request is submitted
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduling import events
from scheduling.core import Band, SchedulerSnapshot, SerialSettings, band_of
from scheduling.frontdoor import BusyModel, WaitingEntry
from scheduling.queue_view import QueueEntry
from scheduling.runtime import Lease, Outcome, Rejected, TicketRequest
from scheduling.directory import WorkerDirectory
from scheduling.wire import (
    ANNOUNCE_S,
    FRONT_ENDS_GROUP,
    HEARTBEAT_S,
    WORKERS_GROUP,
    Announce,
    Discover,
    Heartbeat,
    Hello,
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
    queue_entry_from,
    queue_from,
    running_from,
    send_soon,
    settings_data,
    snapshot_from,
    to_message,
    waiting_from,
)

# How long a question to the worker may take before the caller is told it did not answer.
ANSWER_TIMEOUT_S = 5.0
# How long a request for a model no worker has announced waits for one (a front end that just started
# hears every live worker within one announcement round).
ROUTE_WAIT_S = 2 * ANNOUNCE_S
CLOSE_TIMEOUT_S = 5.0  # for the listener to take its stop message

log = logging.getLogger("llamaswap.frontend")

LEFT_BEFORE_GRANT = Outcome(state="cancelled", error="client disconnected while queued")


@dataclass
class _Held:
    """A lease this front end holds, with what its metrics need when it ends."""

    key: str
    lease: Lease
    route: str
    granted_at: float  # on this front end's event loop clock, as the relay's first byte
    worker: str  # the channel of the worker that granted it

    def finished(self, outcome: Outcome, now: float) -> events.Finished:
        first_byte = outcome.first_byte_monotonic
        return events.Finished(
            model=self.lease.model, route=self.route, band=self.lease.decision.band, state=outcome.state,
            status=outcome.status_code, seconds=now - self.granted_at,
            ttfb_s=None if first_byte is None else first_byte - self.granted_at, usage=outcome.usage or {},
        )


class ChannelLayerFrontDoor:
    runs_scheduler = False

    def __init__(
        self, config, layer, *, heartbeat_s: float = HEARTBEAT_S,
        observer: Callable[[events.RuntimeEvent], None] | None = None,
    ) -> None:
        self.config = config
        # The requests this front end served are counted here, not at the worker (see scheduling.metrics).
        self._observer = observer or (lambda event: None)
        self.layer = layer
        self.workers = WorkerDirectory()
        self.heartbeat_s = heartbeat_s
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
        self._loop = asyncio.get_running_loop()

    async def submit(self, request: TicketRequest, queued=None) -> Lease:
        try:
            reply = await self._reply_channel()
        except Exception as exc:
            self._opening = None  # the next request tries again
            self._observer(events.Refused(request.model, request.route, 503))
            raise unreachable(exc) from exc
        key = f"{reply}#{next(self._keys)}"
        worker = self.workers.channel_for(request.model) or await self.workers.wait_for(request.model, ROUTE_WAIT_S)
        if worker is None:
            self._observer(events.Refused(request.model, request.route, 503))
            raise Rejected(
                503, "no_worker", f"no scheduler worker serves model {request.model!r}: start `llamaswap worker` with a "
                "config that has it, on the machine that runs it", 5,
            )
        granted = asyncio.get_running_loop().create_future()
        self._waiting[key] = granted
        self._submitted[key] = (request, time.time(), worker)
        try:
            try:
                await self.layer.send(worker, to_message(Submit(key, reply, request)))
            except Exception as exc:
                self._waiting.pop(key, None)
                raise unreachable(exc) from exc
            if queued is not None:
                queued(key)
            answer: Granted = await granted
        except Rejected as exc:
            self._observer(events.Refused(request.model, request.route, exc.status))
            raise
        except asyncio.CancelledError:
            if self._waiting.pop(key, None) is not None:
                self._send_later(Cancel(key), worker)
            elif granted.done() and not granted.cancelled() and granted.exception() is None:  # granted as the client left
                self._send_later(Release(key, LEFT_BEFORE_GRANT), granted.result().worker)
            self._observer(events.Refused(request.model, request.route, 499, cancelled=True))
            raise
        finally:
            del self._submitted[key]
        lease = Lease(answer.ticket_id, request.model, answer.upstream, answer.decision)
        self._leases[answer.ticket_id] = _Held(key, lease, request.route, self._loop.time(), answer.worker)
        return lease

    async def progress(self, handle: str) -> QueueEntry | None:
        submitted = self._submitted.get(handle)
        if submitted is None:
            return None
        entry = await self.ask(submitted[2], "progress", origin=handle)
        return None if entry is None else queue_entry_from(entry)

    async def queue(self) -> list[QueueEntry]:
        """Each worker's queue: a worker's requests compete only with each other, so each has its positions."""
        return [entry for data in await self.ask_all("queue") for entry in queue_from(data)]

    async def queue_entry(self, ticket_id: int) -> QueueEntry | None:
        found = [entry for entry in await self.ask_all("queue_entry", ticket_id=ticket_id) if entry is not None]
        return queue_entry_from(found[0]) if found else None

    async def cancel_request(self, ticket_id: int) -> bool:
        return any(await self.ask_all("cancel_request", ticket_id=ticket_id))

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        held = self._leases.pop(ticket_id, None)
        if held is not None:
            self._send_later(Release(held.key, outcome), held.worker)
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
            ticket_id = await self.ask(
                workers[0], "begin_relayed", request=dataclasses.asdict(request), peer=peer, started_at=started_at,
                explanation=explanation,
            )
        except Exception as exc:  # the peer still answers; only the row is missing
            log.warning("request to peer %s is not recorded: %s", peer, exc)
            return None
        self._relayed[ticket_id] = workers[0]
        return ticket_id

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        worker = self._relayed.pop(ticket_id, None) if ticket_id is not None else None
        if worker is not None:  # answered on the reply channel, where nobody waits for it
            question = Ask(
                f"{self._reply}?{next(self._keys)}", self._reply, "end_relayed",
                {"ticket_id": ticket_id, "outcome": dataclasses.asdict(outcome), "seconds": seconds,
                 "first_byte_s": first_byte_s},
            )
            self._send_later(question, worker)
        self._observer(events.Finished(
            model=request.model, route=request.route, band=band_of(request.priority), state=outcome.state,
            status=outcome.status_code, seconds=seconds, ttfb_s=first_byte_s, usage=outcome.usage or {},
        ))

    async def unload(self, models: list[str] | None) -> None:
        await self._ask_serving(models, "unload", models=models)  # each worker unloads those it has

    async def processes(self) -> dict[str, str]:
        return {model: state for states in await self.ask_all("processes") for model, state in states.items()}

    async def logs(self) -> str:
        return "".join(await self.ask_all("logs"))

    async def logs_since(self, cursors: dict[str, str], model: str | None = None) -> dict[str, list[str]]:
        """The workers' new log text, log by log, with the next cursors (`/logs/stream` polls this). Each
        log is named "<worker channel> <log>": two workers each have a log of their own service."""
        channels = await self._workers_for(None if model is None else [model])

        def of(channel: str) -> dict[str, str]:
            prefix = channel + " "
            return {name[len(prefix):]: cursor for name, cursor in cursors.items() if name.startswith(prefix)}

        answers = await asyncio.gather(
            *(self.ask(channel, "logs_since", cursors=of(channel), model=model) for channel in channels)
        )
        return {f"{channel} {name}": value for channel, answer in zip(channels, answers) for name, value in answer.items()}

    # -- operators, from the admin's threads ----------------------------------------------------
    # Every worker is asked, and their answers put together: each serves a part of the models.
    def snapshot(self) -> SchedulerSnapshot:
        return merged_snapshot([snapshot_from(data) for data in self._from_thread(self.ask_all("snapshot"))])

    def waiting(self) -> list[WaitingEntry]:
        return [entry for data in self._from_thread(self.ask_all("waiting")) for entry in waiting_from(data)]

    def running(self) -> list[BusyModel]:
        return [busy for data in self._from_thread(self.ask_all("running")) for busy in running_from(data)]

    def model_states(self) -> dict[str, str]:
        return self._from_thread(self.processes())

    def cancel_waiting(self, ticket_ids: list[int]) -> list[int]:
        return [tid for done in self._from_thread(self.ask_all("cancel_waiting", ticket_ids=ticket_ids)) for tid in done]

    def reprioritize_waiting(self, ticket_ids: list[int], priority: int) -> list[int]:
        answers = self._from_thread(self.ask_all("reprioritize_waiting", ticket_ids=ticket_ids, priority=priority))
        return [tid for done in answers for tid in done]

    def unload_now(self, models: list[str]) -> None:
        self._from_thread(self.unload(models))

    def retune(self, settings: SerialSettings) -> None:
        self._from_thread(self.ask_all("retune", settings=settings_data(settings)))

    async def close(self) -> None:
        """Stop listening; requests still waiting are refused as the service shuts down."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self._listener is not None:
            await self.layer.send(self._reply, to_message(Stop()))
            done, _ = await asyncio.wait([self._listener], timeout=CLOSE_TIMEOUT_S)
            if not done:
                self._listener.cancel()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(Rejected(503, "shutting_down", "llamaswap is shutting down; retry later", 1))
        await asyncio.gather(*self._sends, return_exceptions=True)

    async def ask_all(self, question: str, **arguments: Any) -> list[Any]:
        """Ask every live worker (see `ask`), in parallel; their answers in the order of the workers."""
        return await self._ask_serving(None, question, **arguments)

    async def _ask_serving(self, among: list[str] | None, question: str, **arguments: Any) -> list[Any]:
        """Ask the live workers that serve any of the models `among` (None: every one)."""
        channels = await self._workers_for(among)
        return list(await asyncio.gather(*(self.ask(channel, question, **arguments) for channel in channels)))

    async def _workers_for(self, among: list[str] | None) -> list[str]:
        """The live workers that serve any of the models `among` (None: every one), this front end listening."""
        await self._reply_channel()
        now = self._loop.time()
        return self.workers.live(now) if among is None else self.workers.serving(among, now)

    async def ask(self, worker: str, question: str, **arguments: Any) -> Any:
        """Ask the worker on channel `worker`; raises TimeoutError when it does not answer in time,
        RuntimeError when it could not answer."""
        reply = await self._reply_channel()
        key = f"{reply}?{next(self._keys)}"
        answer = self._loop.create_future()
        self._answers[key] = answer
        try:
            await self.layer.send(worker, to_message(Ask(key, reply, question, arguments)))
            result: Answer = await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"the scheduler worker did not answer {question!r} within {ANSWER_TIMEOUT_S:g} s") from None
        finally:
            self._answers.pop(key, None)
        if result.error:
            raise RuntimeError(f"the scheduler worker could not answer {question!r}: {result.error}")
        return result.value

    def _from_thread(self, coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _reply_channel(self) -> str:
        if self._opening is None:
            self._opening = self._loop.create_task(self._open())
        return await asyncio.shield(self._opening)

    async def _open(self) -> str:
        """This front end's channel, made on first use: it then joins the front ends' group (workers
        announce themselves there) and asks every worker already up to announce itself now."""
        reply = await self.layer.new_channel("llamaswap.frontend.")  # answers wait there until the listener reads
        await self.layer.group_add(FRONT_ENDS_GROUP, reply)
        await self.layer.group_send(WORKERS_GROUP, to_message(Discover(reply)))
        self._reply = reply  # only now: when Redis failed above, the next request starts over
        self._listener = self._loop.create_task(self._listen(reply))
        self._heartbeat = self._loop.create_task(self._beat(reply))
        return reply

    async def _beat(self, reply: str) -> None:
        """Tell every live worker this front end lives, so none waits on the leases of a dead one (and
        stay in the front ends' group, whose members expire)."""
        while True:
            await self._beat_once(FRONT_ENDS_GROUP, self.layer.group_add(FRONT_ENDS_GROUP, reply))
            # Live workers only: a dead one's channel would just fill up; the one that takes over announces itself.
            for worker in self.workers.live(self._loop.time()):
                await self._beat_once(worker, self.layer.send(worker, to_message(Heartbeat(reply))))
            await asyncio.sleep(self.heartbeat_s)

    @staticmethod
    async def _beat_once(target: str, sending) -> None:
        try:
            await sending
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next beat tries again
            log.warning("could not send a heartbeat to %s: %r", target, exc)
        end_if_cancelled()

    async def _listen(self, reply: str) -> None:
        while True:
            body = await receive_or_retry(self.layer, reply)
            try:
                message = from_message(body)
                if isinstance(message, Stop):
                    return
                if isinstance(message, Hello):
                    await self._submit_again(reply, message)
                elif isinstance(message, Announce):
                    if self.workers.heard(message, self._loop.time()):
                        await self.layer.send(message.channel, to_message(Heartbeat(reply)))
                else:
                    self._answer(message)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring a message the front end cannot read (%s): %r", exc, body)

    async def _submit_again(self, reply: str, hello: Hello) -> None:
        """A worker heard from this front end for the first time (one took over, or was restarted):
        submit to it again, in order and before any later answer is read, what still waits for its grant."""
        again = [key for key, waiting in self._waiting.items()
                 if not waiting.done() and self._submitted[key][2] == hello.channel]
        if again:
            log.warning("scheduler worker %s is serving: submitting the %d waiting requests again", hello.worker, len(again))
        for key in again:
            request, arrived_at, worker = self._submitted[key]
            try:
                await self.layer.send(worker, to_message(Submit(key, reply, request, arrived_at)))
            except Exception as exc:  # the request stays waiting, until its client gives up
                log.warning("could not submit request %s again: %s", key, exc)

    def _answer(self, message: Message) -> None:
        if isinstance(message, Granted):
            waiting = self._waiting.pop(message.key, None)
            if waiting is None or waiting.done():
                self._send_later(Release(message.key, LEFT_BEFORE_GRANT), message.worker)  # the client left as it was granted
            else:
                waiting.set_result(message)
        elif isinstance(message, Refused):
            waiting = self._waiting.pop(message.key, None)
            if waiting is not None and not waiting.done():
                waiting.set_exception(
                    Rejected(message.status, message.code, message.message, message.retry_after, message.ticket_id)
                )
        elif isinstance(message, Answer):
            answer = self._answers.get(message.key)
            if answer is not None and not answer.done():
                answer.set_result(message)
        elif isinstance(message, Cut):
            for ticket_id, held in list(self._leases.items()):
                if held.key == message.key:
                    # Ended as the worker ended it (as the in-process runtime does), not as the client then sees it.
                    self.release(ticket_id, Outcome(state="cancelled", status_code=message.status, error=message.message))
                    held.lease.revoke(Rejected(message.status, message.code, message.message))
        else:
            log.warning("a front end does not take %s messages", type(message).__name__)

    def _send_later(self, message: Message, worker: str) -> None:
        send_soon(self.layer, worker, message, self._sends)


def merged_snapshot(snapshots: list[SchedulerSnapshot]) -> SchedulerSnapshot:
    """One view of several workers' schedulers, for the admin (each worker serves its own models)."""
    if not snapshots:
        return SchedulerSnapshot({band: 0 for band in Band}, {band: 0.0 for band in Band}, (), (), (), 0, SerialSettings())
    return SchedulerSnapshot(
        depth_by_band={band: sum(s.depth_by_band.get(band, 0) for s in snapshots) for band in Band},
        oldest_wait_by_band={band: max(s.oldest_wait_by_band.get(band, 0.0) for s in snapshots) for band in Band},
        running_tickets=tuple(t for s in snapshots for t in s.running_tickets),
        loaded=tuple(m for s in snapshots for m in s.loaded),
        starting=tuple(m for s in snapshots for m in s.starting),
        waiting=sum(s.waiting for s in snapshots),
        settings=snapshots[0].settings,
        running={model: tickets for s in snapshots for model, tickets in s.running.items()},
        slots={model: count for s in snapshots for model, count in s.slots.items()},
    )


def unreachable(exc: Exception) -> Rejected:
    return Rejected(503, "scheduler_unreachable", f"cannot reach the scheduler workers over Redis ({exc!r}); retry later", 1)
