"""A front end's way to a scheduler worker in another process: the request path over the channel layer.

Each front end listens on a channel of its own for the worker's answers. A request is submitted
under a key of this front end's making, and its consumer waits for the grant as it would for the
in-process runtime. A grant that arrives for a request whose client already left is given back
at once, so a slot never leaks when a grant and a cancel cross on the wire.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduling import events
from scheduling.core import SchedulerSnapshot, SerialSettings
from scheduling.frontdoor import BusyModel, WaitingEntry
from scheduling.runtime import Lease, Outcome, Rejected, TicketRequest
from scheduling.wire import (
    HEARTBEAT_S,
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
    running_from,
    settings_data,
    snapshot_from,
    to_message,
    waiting_from,
)

# How long a question to the worker may take before the caller is told it did not answer.
ANSWER_TIMEOUT_S = 5.0
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
        self, config, layer, *, worker: str = WORKER_CHANNEL, heartbeat_s: float = HEARTBEAT_S,
        observer: Callable[[events.RuntimeEvent], None] | None = None,
    ) -> None:
        self.config = config
        # The requests this front end served are counted here, not at the worker (see scheduling.metrics).
        self._observer = observer or (lambda event: None)
        self.layer = layer
        self.worker = worker
        self.heartbeat_s = heartbeat_s
        self._reply: str | None = None
        self._listener: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._keys = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}
        self._leases: dict[int, _Held] = {}  # by ticket id
        self._sends: set[asyncio.Task] = set()
        self._answers: dict[str, asyncio.Future] = {}
        self._loop = asyncio.get_running_loop()

    async def submit(self, request: TicketRequest) -> Lease:
        reply = await self._reply_channel()
        key = f"{reply}#{next(self._keys)}"
        granted = asyncio.get_running_loop().create_future()
        self._waiting[key] = granted
        try:
            await self.layer.send(self.worker, to_message(Submit(key, reply, request)))
            answer: Granted = await granted
        except Rejected as exc:
            self._observer(events.Refused(request.model, request.route, exc.status))
            raise
        except asyncio.CancelledError:
            if self._waiting.pop(key, None) is not None:
                self._send_later(Cancel(key))
            self._observer(events.Refused(request.model, request.route, 499, cancelled=True))
            raise
        lease = Lease(answer.ticket_id, request.model, answer.upstream, answer.decision)
        self._leases[answer.ticket_id] = _Held(key, lease, request.route, self._loop.time())
        return lease

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        held = self._leases.pop(ticket_id, None)
        if held is not None:
            self._send_later(Release(held.key, outcome))
            self._observer(held.finished(outcome, self._loop.time()))

    async def unload(self, models: list[str] | None) -> None:
        await self.ask("unload", models=models)

    async def processes(self) -> dict[str, str]:
        return await self.ask("processes")

    async def logs(self) -> str:
        return await self.ask("logs")

    async def logs_since(self, cursors: dict[str, str], model: str | None = None) -> dict[str, list[str]]:
        """The worker's new log text, log by log, with the next cursors (`/logs/stream` polls this)."""
        return await self.ask("logs_since", cursors=cursors, model=model)

    # -- operators, from the admin's threads ----------------------------------------------------
    def snapshot(self) -> SchedulerSnapshot:
        return snapshot_from(self._ask_from_thread("snapshot"))

    def waiting(self) -> list[WaitingEntry]:
        return waiting_from(self._ask_from_thread("waiting"))

    def running(self) -> list[BusyModel]:
        return running_from(self._ask_from_thread("running"))

    def model_states(self) -> dict[str, str]:
        return self._ask_from_thread("processes")

    def cancel_waiting(self, ticket_ids: list[int]) -> list[int]:
        return self._ask_from_thread("cancel_waiting", ticket_ids=ticket_ids)

    def reprioritize_waiting(self, ticket_ids: list[int], priority: int) -> list[int]:
        return self._ask_from_thread("reprioritize_waiting", ticket_ids=ticket_ids, priority=priority)

    def unload_now(self, models: list[str]) -> None:
        self._ask_from_thread("unload", models=models)

    def retune(self, settings: SerialSettings) -> None:
        self._ask_from_thread("retune", settings=settings_data(settings))

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

    async def ask(self, question: str, **arguments: Any) -> Any:
        """Ask the worker; raises TimeoutError when it does not answer in time, RuntimeError when it
        could not answer."""
        reply = await self._reply_channel()
        key = f"{reply}?{next(self._keys)}"
        answer = self._loop.create_future()
        self._answers[key] = answer
        try:
            await self.layer.send(self.worker, to_message(Ask(key, reply, question, arguments)))
            result: Answer = await asyncio.wait_for(answer, ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise TimeoutError(f"the scheduler worker did not answer {question!r} within {ANSWER_TIMEOUT_S:g} s") from None
        finally:
            self._answers.pop(key, None)
        if result.error:
            raise RuntimeError(f"the scheduler worker could not answer {question!r}: {result.error}")
        return result.value

    def _ask_from_thread(self, question: str, **arguments: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(self.ask(question, **arguments), self._loop).result()

    async def _reply_channel(self) -> str:
        if self._reply is None:
            self._reply = await self.layer.new_channel("llamaswap.frontend.")
            loop = asyncio.get_running_loop()
            self._listener = loop.create_task(self._listen(self._reply))
            self._heartbeat = loop.create_task(self._beat(self._reply))
        return self._reply

    async def _beat(self, reply: str) -> None:
        """Tell the worker this front end lives, so it never waits on the leases of a dead one."""
        while True:
            try:
                await self.layer.send(self.worker, to_message(Heartbeat(reply)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next beat tries again
                log.warning("could not send a heartbeat to the scheduler worker: %s", exc)
            await asyncio.sleep(self.heartbeat_s)

    async def _listen(self, reply: str) -> None:
        while True:
            body = await receive_or_retry(self.layer, reply)
            try:
                message = from_message(body)
                if isinstance(message, Stop):
                    return
                self._answer(message)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("ignoring a message the front end cannot read (%s): %r", exc, body)

    def _answer(self, message: Message) -> None:
        if isinstance(message, Granted):
            waiting = self._waiting.pop(message.key, None)
            if waiting is None or waiting.done():
                self._send_later(Release(message.key, LEFT_BEFORE_GRANT))  # the client left as it was granted
            else:
                waiting.set_result(message)
        elif isinstance(message, Refused):
            waiting = self._waiting.pop(message.key, None)
            if waiting is not None and not waiting.done():
                waiting.set_exception(Rejected(message.status, message.code, message.message, message.retry_after))
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

    def _send_later(self, message: Message) -> None:
        """Send from synchronous code (a `finally`, a cancelled task): the send runs on its own."""
        task = asyncio.get_running_loop().create_task(self.layer.send(self.worker, to_message(message)))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
