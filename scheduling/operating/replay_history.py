"""The replay's input read from the request rows, and the what-if the CLI and the admin show.

A window of rows becomes `Recorded` requests (see `scheduling.core.replay`); the rows are read as
plain tuples, never model instances, so a window of 100 000 requests reads in a second or two.
A load is not a row of its own: as in `rows.durations`, a request whose dispatch started its
model spent (sent − arrived) − its queue wait on that start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from scheduling.door import frontdoor
from scheduling.operating.config_inputs import model_specs, swap_policy
from scheduling.core import SerialSettings
from scheduling.core.replay import Fidelity, Recorded, ReplayResult, Setup, fidelity, replay
from scheduling.models import ApiKey, QueuedRequest, SettingsChange
from scheduling.tickets import RequestState
from scheduling.rows.durations import load_time
from scheduling.operating.settings_store import stored_serial_settings

_FIELDS = (
    "id", "model", "priority", "arrived_at", "dispatched_at", "finished_at", "duration_ms", "state", "error",
    "needed_swap", "serial_queue_wait_ms", "route", "stream", "max_wait_s", "api_key",
)


@dataclass(frozen=True)
class RecordedWindow:
    """The recorded requests that arrived in [since, until), times in seconds from `since`."""

    since: datetime
    until: datetime
    records: list[Recorded]
    warm: list[str]  # models up when the window began (their first dispatch in it needed no start)
    settings_changes: int  # audited settings edits within the window: the replay uses today's throughout
    peer_requests: int = 0  # relayed to peers, left out: they never wait in this scheduler's queue


@dataclass(frozen=True)
class Replays:
    window: RecordedWindow
    fidelity: Fidelity  # of `before` against the recording
    before: ReplayResult  # the settings in force
    after: list[ReplayResult]  # each proposal's


@dataclass(frozen=True)
class WhatIf:
    window: RecordedWindow
    fidelity: Fidelity
    before: ReplayResult
    after: ReplayResult


def recorded_window(since: datetime, until: datetime) -> RecordedWindow:
    arrived = QueuedRequest.objects.filter(arrived_at__gte=since, arrived_at__lt=until)
    rows = arrived.filter(peer="").order_by("arrived_at", "id").values_list(*_FIELDS)
    records, first_dispatch = [], {}
    weights = dict(ApiKey.objects.values_list("name", "weight"))  # as they are now: the rows keep no weight
    for row in rows:
        record = _recorded(row, since, weights)
        records.append(record)
        if record.dispatched_s is not None:
            model, needed_swap = row[1], row[9]
            known = first_dispatch.get(model)
            if known is None or record.dispatched_s < known[0]:
                first_dispatch[model] = (record.dispatched_s, needed_swap)
    warm = [model for model, (_, needed_swap) in sorted(first_dispatch.items(), key=lambda kv: kv[1][0])
            if needed_swap is False]
    changes = SettingsChange.objects.filter(changed_at__gte=since, changed_at__lt=until).count()
    return RecordedWindow(since, until, records, warm, changes, arrived.exclude(peer="").count())


def _recorded(row: tuple, since: datetime, weights: dict[str, int]) -> Recorded:
    (ticket_id, model, priority, arrived_at, dispatched_at, finished_at, duration_ms, state, error,
     needed_swap, queue_wait_ms, route, stream, max_wait_s, api_key) = row
    arrival = (arrived_at - since).total_seconds()
    dispatched = None if dispatched_at is None else (dispatched_at - since).total_seconds()
    load = None
    if needed_swap and dispatched_at is not None and queue_wait_ms is not None:
        load = max(0.0, load_time(arrived_at, dispatched_at, queue_wait_ms))
    ran_to_end = state in (RequestState.COMPLETED, RequestState.FAILED) and dispatched is not None
    left = state == RequestState.CANCELLED and finished_at is not None
    return Recorded(
        id=ticket_id,
        model=model,
        priority=priority,
        arrival_s=arrival,
        route=route or "other",
        stream=stream,
        service_s=duration_ms / 1000 if ran_to_end and duration_ms is not None else None,
        left_after_s=(finished_at - arrived_at).total_seconds() if left else None,
        by_operator=left and BY_OPERATOR in error,
        ran_s=duration_ms / 1000 if left and dispatched is not None and duration_ms is not None else None,
        max_wait_s=max_wait_s,
        load_s=load,
        dispatched_s=dispatched,
        refused=_refusal(state, error, max_wait_s),
        key=api_key or None,
        weight=max(1, weights.get(api_key, 1)),  # a 0 written with SQL counts as 1
    )


# What the error of every request an operator ended says ("cancelled by an operator while queued", "model
# 'm' was unloaded by an operator while this request was running"); a client's says "client disconnected".
BY_OPERATOR = "by an operator"


def _refusal(state: str, error: str, max_wait_s: float | None) -> str:
    """Why a refused request is left out of a replay ("" if it is not): a refusal for its maximum
    wait is replayed (the replay refuses it again if it waits as long)."""
    if state != RequestState.REJECTED or (max_wait_s is not None and "maximum wait" in error):
        return ""
    return "failed start" if "failed to start" in error else "refused"


def setup_of(config) -> Setup:
    return Setup(config.scheduler.use, model_specs(config), swap_policy(config), config.hardware)


def settings_in_force(config) -> SerialSettings:
    """The config file's values with the admin's stored overrides, as the service runs them."""
    return stored_serial_settings(config.scheduler.serial, config.models)


def replays(since: datetime, until: datetime, proposals: list[SerialSettings], config=None, tried=None) -> Replays:
    """The window replayed with the settings in force and with each of `proposals`, and how faithful the
    first is to the recording. `config`: the one in force (`frontdoor.current_config()` if None); `tried`:
    another config the proposals run with (its hardware, models' memory, groups or matrix), else `config`."""
    if config is None:
        config = frontdoor.current_config()
    window = recorded_window(since, until)
    setup = setup_of(config)
    other = setup if tried is None else setup_of(tried)
    before = replay(window.records, setup, settings_in_force(config), window.warm)
    after = [replay(window.records, other, proposed, window.warm) for proposed in proposals]
    return Replays(window, fidelity(window.records, before), before, after)


def what_if(since: datetime, until: datetime, proposed: SerialSettings, config=None) -> WhatIf:
    """What `proposed` would have done to the window, beside the settings in force (see `replays`)."""
    played = replays(since, until, [proposed], config)
    return WhatIf(played.window, played.fidelity, played.before, played.after[0])
