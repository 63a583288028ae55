"""`GET /api/events`: llama-swap's Server-Sent Events envelope, so dashboards update without polling.

Every event is `event: message` with `data: {"type": T, "data": "<JSON text>"}`: the inner data is
JSON encoded into a string, as llama-swap sends it, so clients written for llama-swap parse it
unchanged. A connection first gets the log history, every model's status, the in-flight table and
the queue and each unfinished batch's progress; then, looking every TICK_S (batches every BATCH_TICK_S), only what
changed since it last sent, and a comment line
when it has been quiet for KEEPALIVE_S (so proxies in between keep the connection open).

What one connection last sent is kept in its `EventStream`, so the diff is per connection and the
service pushes nothing: a dashboard that is not connected costs nothing. A connection is sent what its key
may see (`proxy.api.visibility`): another key's requests and batches, and models outside its scope, never.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Max

from proxy.serving.active_profile import active_profile
from proxy.api.unavailable import as_unavailable
from proxy.api.visibility import own_batches, own_entries, own_rows, told_in
from proxy.api.model_listing import capability_fields
from proxy.upstream.peer_relay import peer_model_states
from scheduling.rows.activity import activity_row
from scheduling.door.questions import LogsSince, Processes, Queue
from scheduling.outage_log import OutageLog
from scheduling.operating.batch_progress import BatchWatch, time_left_s
from scheduling.models import QueuedRequest
from scheduling.tickets import RequestState
from scheduling.core import ModelState
from scheduling.keys.scope import UNRESTRICTED, KeyScope

log = logging.getLogger("llamaswap.proxy")

TICK_S = 0.5
BATCH_TICK_S = 1.0  # a batch's counts are one grouped query over its lines: looked at less often
KEEPALIVE_S = 15.0
PING = ": ping\n\n"
# A queued request's predicted dispatch time moving by less than this is not news.
ETA_SLACK_S = 1.0

IN_FLIGHT_STATES = (RequestState.QUEUED, RequestState.DISPATCHED)


def envelope(kind: str, data: Any) -> str:
    """One SSE event in llama-swap's shape."""
    return f"event: message\ndata: {json.dumps({'type': kind, 'data': json.dumps(data)})}\n\n"


def model_status(config, states: dict[str, str]) -> list[dict[str, Any]]:
    """Every configured model with its process state, by id, in llama-swap's `modelStatus` shape."""
    return [
        {
            "id": model_id,
            "name": model.name,
            "description": model.description,
            "state": states.get(model_id, ModelState.STOPPED),
            "unlisted": model.unlisted,
            "peerID": "",
            "aliases": list(model.aliases),
            **_capability_flags(model),
        }
        for model_id, model in sorted(config.models.items())
    ] + peer_model_states(config)


def _capability_flags(model) -> dict[str, Any]:
    """The dashboard's `capabilities` map, the same as /v1/models gives; absent when the model declares none."""
    flags = capability_fields(model.capabilities).get("capabilities")
    return {"capabilities": flags} if flags else {}


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ActivityWatch:
    """Request rows that are new or changed since the last look (synchronous: run it off the loop).

    Each look is one query by primary key: the rows past the last id seen, and the rows that were
    still in flight last time. A row is watched until it reaches a terminal state.
    """

    def __init__(self) -> None:
        self.last_id = 0
        self.open: dict[int, dict[str, Any]] = {}

    def start(self) -> None:
        """Watch from now on: the rows already there are not news, except when they change."""
        self.last_id = QueuedRequest.objects.aggregate(last=Max("id"))["last"] or 0
        rows = QueuedRequest.objects.filter(state__in=IN_FLIGHT_STATES, id__lte=self.last_id)
        self.open = {row.id: activity_row(row) for row in rows}

    def changes(self) -> list[dict[str, Any]]:
        rows = QueuedRequest.objects.filter(id__gt=self.last_id) | QueuedRequest.objects.filter(id__in=list(self.open))
        changed = []
        for row in rows.order_by("id"):
            data = activity_row(row)
            self.last_id = max(self.last_id, row.id)
            if self.open.get(row.id) == data:
                continue
            changed.append(data)
            if row.state in IN_FLIGHT_STATES:
                self.open[row.id] = data
            else:
                self.open.pop(row.id, None)
        return changed


class EventStream:
    """What one connection has been sent, and the envelopes that bring it up to date."""

    def __init__(self, service, *, viewer: KeyScope = UNRESTRICTED) -> None:
        self.service = service
        self.viewer = viewer
        self.with_logs = viewer.operator  # the models' log text is an operator's (as `/logs`)
        self.log_cursors: dict[str, str] = {}
        self.models: list[dict[str, Any]] | None = None
        self.inflight: dict[int, dict[str, Any]] = {}
        self.queue: list[dict[str, Any]] | None = None
        # When this connection first saw each request arrive and start running (epoch seconds):
        # fixed once seen, so a request's entry changes only when something about it does.
        self.arrived: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self.activity = ActivityWatch()
        self.profile: str | None = None  # the active profile this connection was last told of
        self.batches = BatchWatch()
        self.batches_looked = 0.0
        self.unsent: list[str] = []  # what a `changes()` that failed gathered before it failed

    async def first(self) -> str:
        """Everything: log history, every model's status, the in-flight snapshot and the queue."""
        await sync_to_async(self.activity.start)()
        entries = await self._entries()
        self.inflight = self._inflight_items(entries)
        pieces = await self._logs()
        pieces.append(await self._model_status())
        pieces.append(envelope("inflight", {"op": "snapshot", "requests": list(self.inflight.values())}))
        self.queue = self._queue_items(entries)
        pieces.append(envelope("queue", self.queue))
        pieces += await self._profile_changed()
        pieces += await self._batch_progress()
        return "".join(pieces)

    async def changes(self) -> str:
        """What changed since the last call ("" for nothing). A call that fails (the scheduler or the database away)
        leaves what it gathered before it failed to the next, whose answer begins with it."""
        pieces = self.unsent  # grown in place
        pieces += await self._logs()
        status = await self._model_status()
        if status:
            pieces.append(status)
        rows = own_rows(self.viewer, await sync_to_async(self.activity.changes)())
        pieces += [envelope("activity", told_in(self.viewer, row)) for row in rows]
        entries = await self._entries()
        pieces += self._inflight_changes(self._inflight_items(entries))
        queue = self._queue_items(entries)
        if _queue_changed(self.queue, queue):
            self.queue = queue
            pieces.append(envelope("queue", queue))
        pieces += await self._profile_changed()
        if time.monotonic() - self.batches_looked >= BATCH_TICK_S:
            pieces += await self._batch_progress()
        self.unsent = []
        return "".join(pieces)

    async def _entries(self) -> list:
        """The queue's entries this connection may see."""
        return await own_entries(self.viewer, await self.service.door.ask(Queue()))

    async def _batch_progress(self) -> list[str]:
        """`batchProgress` for each batch whose status or counts changed, with its time left (None: unknown)."""
        self.batches_looked = time.monotonic()
        door = self.service.door
        changed = await own_batches(self.viewer, await sync_to_async(self.batches.changes)())
        return [envelope("batchProgress", {**shown.as_json(), "time_left_s": await time_left_s(door, shown)})
                for shown in changed]

    async def _profile_changed(self) -> list[str]:
        """`profileChanged` when the active profile is not the one this connection was last told of."""
        name = await active_profile(self.service.config)
        if name == self.profile:
            return []
        self.profile = name
        return [envelope("profileChanged", {"activeProfileName": name})]

    async def _logs(self) -> list[str]:
        """New text of each log, as `logData` from the model it belongs to."""
        pieces: list[str] = []
        if not self.with_logs:
            return pieces
        for name, piece in (await self.service.door.ask(LogsSince(self.log_cursors))).items():
            self.log_cursors[name] = piece.cursor
            if piece.text:
                pieces.append(envelope("logData", {"source": piece.log, "data": piece.text}))
        return pieces

    async def _model_status(self) -> str:
        """`modelStatus` with every model when any changed, else ""."""
        models = [model for model in model_status(self.service.config, await self.service.door.ask(Processes()))
                  if self.viewer.sees_model(model["id"])]
        if models == self.models:
            return ""
        self.models = models
        return envelope("modelStatus", models)

    def _inflight_items(self, entries) -> dict[int, dict[str, Any]]:
        """The in-flight table (waiting and running requests), with times fixed when first seen."""
        now = time.time()
        items = {}
        for entry in entries:
            arrived = self.arrived.setdefault(entry.ticket_id, now - entry.waited_s - (entry.running_s or 0.0))
            started = None
            if entry.running_s is not None:
                started = self.started.setdefault(entry.ticket_id, now - entry.running_s)
            items[entry.ticket_id] = {
                "id": entry.ticket_id,
                "model": entry.model,
                "requested_model": entry.requested_model,
                "path": entry.path,
                "client": entry.client,
                "priority": entry.priority,
                "band": entry.band,
                "state": entry.state,
                "arrived_at": _iso(arrived),
                "started_at": _iso(started),
            }
        for gone in set(self.arrived) - set(items):
            self.arrived.pop(gone)
            self.started.pop(gone, None)
        return items

    def _inflight_changes(self, items: dict[int, dict[str, Any]]) -> list[str]:
        pieces = [envelope("inflight", {"op": "remove", "id": gone}) for gone in self.inflight if gone not in items]
        pieces += [
            envelope("inflight", {"op": "upsert", "request": item})
            for ticket_id, item in items.items()
            if self.inflight.get(ticket_id) != item
        ]
        self.inflight = items
        return pieces

    def _queue_items(self, entries) -> list[dict[str, Any]]:
        now = time.time()
        return [{**told_in(self.viewer, entry.as_json()), "eta_at": None if entry.eta_s is None else now + entry.eta_s}
                for entry in entries]


def _queue_changed(sent: list[dict[str, Any]] | None, queue: list[dict[str, Any]]) -> bool:
    """Whether the queue differs in more than time passing: a request came, went, moved or changed
    state, or the predicted dispatch time of one not yet running moved by more than ETA_SLACK_S."""
    if sent is None or len(sent) != len(queue):
        return True
    stable = ("id", "model", "priority", "state", "position")
    for old, new in zip(sent, queue):
        if any(old[key] != new[key] for key in stable):
            return True
        if new["state"] == "running":  # dispatched: its eta is 0, and eta_at just now
            continue
        if (old["eta_at"] is None) != (new["eta_at"] is None):
            return True
        if new["eta_at"] is not None and abs(old["eta_at"] - new["eta_at"]) > ETA_SLACK_S:
            return True
    return False


async def events(stream: EventStream, first: str, *, tick_s: float = TICK_S, keepalive_s: float = KEEPALIVE_S):
    """The response body: `first` (the stream's first payload, asked before the response began: the scheduler or the
    database away answers that 503), then changes; ends when the client leaves (Django cancels the response's task
    then, which cancels the sleep or query this is waiting in). A look the scheduler or the database does not answer
    sends nothing, and the next looks again: a Redis blink or a database outage does not end the stream."""
    yield first
    quiet_since = time.monotonic()
    outage = OutageLog(log, "updating an /api/events stream")
    while True:
        await asyncio.sleep(tick_s)
        try:
            changes = await stream.changes()
        except Exception as exc:
            if as_unavailable(exc) is None:
                raise
            outage.failed(exc)
            changes = ""
        else:
            outage.worked()
        if changes:
            quiet_since = time.monotonic()
            yield changes
        elif time.monotonic() - quiet_since >= keepalive_s:
            quiet_since = time.monotonic()
            yield PING
