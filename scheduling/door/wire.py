"""The messages front ends and a scheduler worker exchange over the channel layer.

Each is a frozen dataclass; `to_message` turns one into the plain dict the channel layer carries
(its `type` names the handler, as Channels expects) and `from_message` turns it back, so both
sides speak in types and only this module knows the wire shape. What messages carry (a request,
a question of `scheduling.door.questions`, its answer) crosses as plain data through one pair,
`encode` and `decode`, which keep dataclasses, enums, tuples and non-string dict keys. Requests are named by a `key`
the front end makes (unique to it) until the worker has given them a ticket id; every message
about a request carries that key, so a grant and a cancel may cross on the wire safely.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import importlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

from scheduling.core import Decision
from scheduling.outage_log import OutageLog
from scheduling.door.questions import Question
from scheduling.tickets import Outcome, Refused, TicketRequest

FRONT_ENDS_GROUP = "llamaswap.frontends"  # every front end's reply channel: workers announce themselves to it
WORKERS_GROUP = "llamaswap.workers"  # every active worker's channel: a front end that starts asks who serves what
RECEIVE_RETRY_S = 1.0  # after the layer failed to deliver (Redis restarting, a network blip)
SEND_RETRY_S = 0.25  # between tries of a send while Redis is away
# How long a process that stops waits on Redis for its last messages (its own stop, leaving a group, a release)
# before it exits without them: Redis silent (a partition) would otherwise hold it for the 30 s read timeout.
GOODBYE_S = 2.0
# What a send or receive raises when Redis is away or a pooled connection to it broke (redis-py drops
# that connection, so the next try opens a fresh one); anything else is no reason to try again.
REDIS_FAILURES = (RedisConnectionError, RedisTimeoutError, OSError)
HEARTBEAT_S = 1.0
ANNOUNCE_S = 1.0
FRONT_END_TIMEOUT_S = 5.0  # a front end silent this long is taken for dead


def worker_channel(models: Iterable[str], layer: Any) -> str:
    """The channel of the worker that serves these models. A standby for the same models computes the
    same one, so what front ends send there waits for whichever of the two is active.

    Redis's pub/sub channels are one namespace for the whole server, whatever the database index: the
    pub/sub layer prefixes the names it makes (groups, new channels) but not a name given to `send()`,
    so this fixed name takes the layer's prefix there, or two deployments on one Redis would hear each
    other. The lists layer prefixes every key itself."""
    digest = hashlib.sha1("\n".join(sorted(models)).encode()).hexdigest()[:12]
    namespace = layer.prefix if isinstance(layer, RedisPubSubChannelLayer) else ""
    return f"{namespace}llamaswap.worker.{digest}"

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
class Queued:
    """Worker → front end, for a request not granted at once: it waits under this row, so a refusal the front end
    makes itself (its key revoked while Redis is away, `ChannelLayerFrontDoor.refuse_key`) names its request id."""

    key: str
    ticket_id: int


@dataclass(frozen=True)
class TicketRefused:
    """Worker → front end: the scheduler answered with an error instead of a grant."""

    key: str
    refused: Refused


@dataclass(frozen=True)
class Cut:
    """Worker → front end: the GPU was taken back mid-request (an operator unloaded the model)."""

    key: str
    refused: Refused


@dataclass(frozen=True)
class Ask:
    """Front end → worker: a question about, or an operator action on, the scheduler and its models
    (`scheduling.door.questions`); the answer goes to `reply`."""

    key: str
    reply: str
    question: Question


@dataclass(frozen=True)
class Answer:
    """Worker → front end: the value (plain data) or, when it could not answer, why. `database_away`: answering
    needed the worker's database, which is unreachable; `error` then names only the failure's type (the
    database's own words name its address and stay in the worker's log)."""

    key: str
    value: Any = None
    error: str = ""
    database_away: bool = False


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


Message = (Submit | Hello | Announce | Discover | Cancel | Release | Granted | Queued | TicketRefused | Cut | Ask | Answer
           | Heartbeat | Stop)
_TYPES: dict[str, type] = {
    "ticket.submit": Submit,
    "worker.hello": Hello,
    "worker.announce": Announce,
    "worker.discover": Discover,
    "ticket.cancel": Cancel,
    "ticket.release": Release,
    "ticket.granted": Granted,
    "ticket.queued": Queued,
    "ticket.refused": TicketRefused,
    "ticket.cut": Cut,
    "scheduler.ask": Ask,
    "scheduler.answer": Answer,
    "frontend.heartbeat": Heartbeat,
    "llamaswap.stop": Stop,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def to_message(message: Message) -> dict[str, Any]:
    """The channel-layer dict for `message`: only str, int, float, bool, None, lists and dicts."""
    body = encode(message)
    del body[_DATACLASS]
    return {"type": _NAMES[type(message)], **body}


def from_message(body: dict[str, Any]) -> Message:
    """The typed message a channel-layer dict carries; ValueError for one this module does not know."""
    cls = _TYPES.get(body.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown message type {body.get('type')!r}")
    return cls(**{name: decode(value) for name, value in body.items() if name != "type"})


_DATACLASS, _ENUM, _TUPLE, _ITEMS = "__dataclass__", "__enum__", "__tuple__", "__items__"
_TAGS = frozenset((_DATACLASS, _ENUM, _TUPLE, _ITEMS))


def encode(value: Any) -> Any:
    """`value` as plain data (str, int, float, bool, None, lists and str-keyed dicts) that `decode`
    turns back: a dataclass or an enum of `scheduling` is named by its type, a tuple and a dict with
    keys other than str are marked as such."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {field.name: encode(getattr(value, field.name)) for field in dataclasses.fields(value) if field.init}
        return {_DATACLASS: _type_name(type(value)), **fields}
    if isinstance(value, enum.Enum):
        return {_ENUM: _type_name(type(value)), "value": value.value}
    if isinstance(value, tuple):
        return {_TUPLE: [encode(item) for item in value]}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, Mapping):
        if all(type(key) is str for key in value) and not _TAGS.intersection(value):  # an upstream's usage may be anything
            return {key: encode(item) for key, item in value.items()}
        return {_ITEMS: [[encode(key), encode(item)] for key, item in value.items()]}
    return value


def decode(data: Any) -> Any:
    """What `encode` made `data` of; ValueError for a type that is not a dataclass or enum of `scheduling`."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if _DATACLASS in data:
        fields = {name: decode(value) for name, value in data.items() if name != _DATACLASS}
        return _known_type(data[_DATACLASS])(**fields)
    if _ENUM in data:
        return _known_type(data[_ENUM])(data["value"])
    if _TUPLE in data:
        return tuple(decode(item) for item in data[_TUPLE])
    if _ITEMS in data:
        return {decode(key): decode(item) for key, item in data[_ITEMS]}
    return {key: decode(item) for key, item in data.items()}


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@cache
def _known_type(name: str) -> type:
    """The dataclass or enum `name` names; only `scheduling`'s own are taken from the wire."""
    module, _, qualname = name.partition(":")
    if not module.startswith("scheduling."):
        raise ValueError(f"the wire does not carry {name!r}")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        raise ValueError(f"the wire does not carry {name!r}") from None
    if not (isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum))):
        raise ValueError(f"the wire does not carry {name!r}")
    return found


def send_soon(layer, channel: str, message: Message, sends: set[asyncio.Task]) -> None:
    """Send from synchronous code (a `finally`, a message handler): the send runs as a task of its own,
    kept in `sends` until it is done, and is tried again while Redis is away (see `deliver`)."""
    task = asyncio.get_running_loop().create_task(deliver(layer, channel, message))
    sends.add(task)
    task.add_done_callback(sends.discard)


async def deliver(layer, channel: str, message: Message) -> None:
    """Send `message`, trying again every `SEND_RETRY_S` while Redis is away, until it is sent or the
    task is cancelled: a release or a cancel lost in a Redis blip would hold its slot for ever. Each
    waiting message is one request's, so what waits is bounded by the requests in flight."""
    failed_at = None
    while True:
        try:
            await layer.send(channel, to_message(message))
        except REDIS_FAILURES as exc:
            if failed_at is None:
                failed_at = time.monotonic()
                await drop_connections(layer)
                log.warning("could not send %s to %s (%s: %s); trying again until Redis answers",
                            type(message).__name__, channel, type(exc).__name__, exc)
            end_if_cancelled()
            await asyncio.sleep(SEND_RETRY_S)
            continue
        if failed_at is not None:
            log.info("sent %s to %s after %.1f s", type(message).__name__, channel, time.monotonic() - failed_at)
        return


async def drop_connections(layer) -> None:
    """Close every connection `layer` holds to Redis, idle or in use; each opens afresh on its next use.
    One found broken makes them all suspect (Redis restarted, or a firewall forgot them without a word),
    and a receive blocked on one would stay deaf until its read timeout (30 s, see llamaswap_site.environment)
    instead of the second `receive_or_retry` waits. Channels' Redis list layer only (its `connection(index)`)."""
    connection = getattr(layer, "connection", None)
    if connection is None:
        return
    for index in range(layer.ring_size):
        await connection(index).connection_pool.disconnect()


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
    outage = OutageLog(log, f"receiving on {channel}")
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage.failed(exc)
            await asyncio.sleep(RECEIVE_RETRY_S)
            continue
        outage.worked()
        return message
