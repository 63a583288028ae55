"""The messages front ends and a scheduler worker exchange over the channel layer.

Each is a frozen dataclass; `to_message` turns one into the plain dict the channel layer carries
(its `type` names the handler, as Channels expects) and `from_message` turns it back, so both
sides speak in types and only this module knows the wire shape. Requests are named by a `key`
the front end makes (unique to it) until the worker has given them a ticket id; every message
about a request carries that key, so a grant and a cancel may cross on the wire safely.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduling.core import Band, Decision, SchedulerSnapshot, ScoreTerms, SerialSettings
from scheduling.frontdoor import BusyModel, RunningEntry, WaitingEntry
from scheduling.queue_view import QueueEntry
from scheduling.runtime import Outcome, TicketRequest

FRONT_ENDS_GROUP = "llamaswap.frontends"  # every front end's reply channel: workers announce themselves to it
WORKERS_GROUP = "llamaswap.workers"  # every active worker's channel: a front end that starts asks who serves what
RECEIVE_RETRY_S = 1.0  # after the layer failed to deliver (Redis restarting, a network blip)
HEARTBEAT_S = 1.0
ANNOUNCE_S = 1.0
FRONT_END_TIMEOUT_S = 5.0  # a front end silent this long is taken for dead


def worker_channel(models: Iterable[str]) -> str:
    """The channel of the worker that serves these models. A standby for the same models computes the
    same one, so what front ends send there waits for whichever of the two is active."""
    digest = hashlib.sha1("\n".join(sorted(models)).encode()).hexdigest()[:12]
    return f"llamaswap.worker.{digest}"

log = logging.getLogger("llamaswap.wire")


@dataclass(frozen=True)
class Submit:
    """Front end → worker: queue this request; answer on `reply`. A request submitted again to a
    worker that took over (see `Hello`) carries when it first arrived (Unix time), so its wait so
    far counts for aging; a first submit arrives when the worker reads it."""

    key: str
    reply: str
    request: TicketRequest
    arrived_at: float | None = None


@dataclass(frozen=True)
class Hello:
    """Worker → front end, the first time this worker hears from it: submit again every request
    still waiting for a grant. One queued with a worker that died may have reached it unrecorded;
    the worker drops the ones it already has."""

    worker: str
    channel: str


@dataclass(frozen=True)
class Announce:
    """Worker → front ends, every `ANNOUNCE_S` and when asked: send requests for `models` to `channel`."""

    channel: str
    models: tuple[str, ...]
    worker: str


@dataclass(frozen=True)
class Discover:
    """Front end → every worker (`WORKERS_GROUP`): announce yourselves to `reply` now."""

    reply: str


@dataclass(frozen=True)
class Cancel:
    """Front end → worker: the client left; drop the request wherever it is."""

    key: str


@dataclass(frozen=True)
class Release:
    """Front end → worker: the granted request ended."""

    key: str
    outcome: Outcome


@dataclass(frozen=True)
class Granted:
    """Worker → front end: send the request to `upstream` now."""

    key: str
    ticket_id: int
    upstream: str
    decision: Decision
    worker: str  # the worker's channel, where the release goes


@dataclass(frozen=True)
class Refused:
    """Worker → front end: the scheduler answered with an error instead of a grant."""

    key: str
    status: int
    code: str
    message: str
    retry_after: float | None = None
    ticket_id: int | None = None  # the request's row, when it had one


@dataclass(frozen=True)
class Cut:
    """Worker → front end: the GPU was taken back mid-request (an operator unloaded the model)."""

    key: str
    status: int
    code: str
    message: str


@dataclass(frozen=True)
class Ask:
    """Front end → worker: a question about, or an operator action on, the scheduler and its models
    (`question` names a method of `scheduling.worker.Answers`); the answer goes to `reply`."""

    key: str
    reply: str
    question: str
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """Worker → front end: the value (plain data) or, when it could not answer, why."""

    key: str
    value: Any = None
    error: str = ""


@dataclass(frozen=True)
class Heartbeat:
    """Front end → worker, every `HEARTBEAT_S`: this front end (its reply channel) is alive. A worker
    that hears nothing from a front end for `FRONT_END_TIMEOUT_S` drops its requests."""

    reply: str


@dataclass(frozen=True)
class Stop:
    """A process to its own channel: end the receive loop. Cancelling a receive that is blocked in
    Redis can leave the task hanging in the client's cleanup; a message always ends it.

    `sender`: the worker that sent it. Workers for the same models share a channel, and channels_redis
    keeps a copy of each message read until its reader's cleanup task runs: a worker that exits as it
    reads its stop leaves the copy, which the next worker on the channel then reads first."""

    sender: str = ""


Message = Submit | Hello | Announce | Discover | Cancel | Release | Granted | Refused | Cut | Ask | Answer | Heartbeat | Stop
_TYPES: dict[str, type] = {
    "ticket.submit": Submit,
    "worker.hello": Hello,
    "worker.announce": Announce,
    "worker.discover": Discover,
    "ticket.cancel": Cancel,
    "ticket.release": Release,
    "ticket.granted": Granted,
    "ticket.refused": Refused,
    "ticket.cut": Cut,
    "scheduler.ask": Ask,
    "scheduler.answer": Answer,
    "frontend.heartbeat": Heartbeat,
    "llamaswap.stop": Stop,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def to_message(message: Message) -> dict[str, Any]:
    """The channel-layer dict for `message`: only str, int, float, bool, None, lists and dicts."""
    body = dataclasses.asdict(message)
    if isinstance(message, Granted):
        body["decision"]["band"] = str(message.decision.band)
    return {"type": _NAMES[type(message)], **body}


def from_message(body: dict[str, Any]) -> Message:
    """The typed message a channel-layer dict carries; ValueError for one this module does not know."""
    fields = {name: value for name, value in body.items() if name != "type"}
    cls = _TYPES.get(body.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown message type {body.get('type')!r}")
    if cls is Submit:
        fields["request"] = TicketRequest(**fields["request"])
    elif cls is Announce:
        fields["models"] = tuple(fields["models"])
    elif cls is Release:
        fields["outcome"] = Outcome(**fields["outcome"])
    elif cls is Granted:
        decision = dict(fields["decision"])
        decision["band"] = Band(decision["band"])
        decision["terms"] = ScoreTerms(**decision["terms"])
        fields["decision"] = Decision(**decision)
    return cls(**fields)


def send_soon(layer, channel: str, message: Message, sends: set[asyncio.Task]) -> None:
    """Send from synchronous code (a `finally`, a message handler): the send runs as a task of its own,
    kept in `sends` until it is done."""
    task = asyncio.get_running_loop().create_task(layer.send(channel, to_message(message)))
    sends.add(task)
    task.add_done_callback(sends.discard)


def end_if_cancelled() -> None:
    """For a loop that sends over Redis: end the task if it was cancelled while the Redis client
    swallowed the cancel mid-send."""
    if asyncio.current_task().cancelling():
        raise asyncio.CancelledError


def front_end_of(key: str) -> str:
    """The reply channel of the front end that made `key` (a front end's keys are its reply channel,
    "#" and a number)."""
    return key.rpartition("#")[0]


async def receive_or_retry(layer, channel: str) -> dict[str, Any]:
    """The next message on `channel`; a failure of the layer is logged and the receive tried again,
    so one Redis hiccup does not leave a front end or a worker deaf for good."""
    while True:
        try:
            return await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("the channel layer failed to deliver on %s (%s: %s); retrying", channel, type(exc).__name__, exc)
            await asyncio.sleep(RECEIVE_RETRY_S)


# -- what answers carry -----------------------------------------------------------------------


def settings_data(settings: SerialSettings) -> dict[str, Any]:
    return {"aging_divisor": settings.aging_divisor, "swap_affinity_bonus": settings.swap_affinity_bonus,
            "slots": dict(settings.slots)}


def settings_from(data: dict[str, Any]) -> SerialSettings:
    return SerialSettings(data["aging_divisor"], data["swap_affinity_bonus"], data["slots"])


def snapshot_data(snapshot: SchedulerSnapshot) -> dict[str, Any]:
    return {
        "depth_by_band": {str(band): depth for band, depth in snapshot.depth_by_band.items()},
        "oldest_wait_by_band": {str(band): wait for band, wait in snapshot.oldest_wait_by_band.items()},
        "running_tickets": list(snapshot.running_tickets),
        "loaded": list(snapshot.loaded),
        "starting": list(snapshot.starting),
        "waiting": snapshot.waiting,
        "settings": settings_data(snapshot.settings),
        "running": {model: list(tickets) for model, tickets in snapshot.running.items()},
        "slots": dict(snapshot.slots),
    }


def snapshot_from(data: dict[str, Any]) -> SchedulerSnapshot:
    return SchedulerSnapshot(
        depth_by_band={Band(band): depth for band, depth in data["depth_by_band"].items()},
        oldest_wait_by_band={Band(band): wait for band, wait in data["oldest_wait_by_band"].items()},
        running_tickets=tuple(data["running_tickets"]),
        loaded=tuple(data["loaded"]),
        starting=tuple(data["starting"]),
        waiting=data["waiting"],
        settings=settings_from(data["settings"]),
        running={model: tuple(tickets) for model, tickets in data["running"].items()},
        slots=dict(data["slots"]),
    )


def waiting_from(data: list[dict[str, Any]]) -> list[WaitingEntry]:
    return [WaitingEntry(**{**entry, "terms": ScoreTerms(**entry["terms"])}) for entry in data]


def queue_from(data: list[dict[str, Any]]) -> list[QueueEntry]:
    return [queue_entry_from(entry) for entry in data]


def queue_entry_from(entry: dict[str, Any]) -> QueueEntry:
    terms = entry["terms"]
    return QueueEntry(**{**entry, "terms": None if terms is None else ScoreTerms(**terms)})


def running_from(data: list[dict[str, Any]]) -> list[BusyModel]:
    return [
        BusyModel(busy["model"], busy["slots"], tuple(RunningEntry(**entry) for entry in busy["requests"]))
        for busy in data
    ]

