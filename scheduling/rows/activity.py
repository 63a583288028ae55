"""The request history for scripts: the query behind `GET /api/activity` and the shape of its rows.

Rows come newest first and pages are cut with an id cursor (`before_id`), never
an OFFSET, so a page costs the same on a million rows as on ten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.http import QueryDict

from scheduling.models import BandChoice, QueuedRequest
from scheduling.tickets import RequestState
from scheduling.whole_numbers import ROW_ID_MAX, as_typed, whole_number

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
PARAMETERS = ("model", "band", "state", "since", "until", "limit", "before_id", "key")

_DIGITS = re.compile(r"[0-9]+")
# A "+hh:mm" zone arrives as " hh:mm" when the caller forgot to URL-encode the "+".
_UNENCODED_PLUS_ZONE = re.compile(r"(:[0-9]{2}(?:\.[0-9]+)?) ([0-9]{2}(?::?[0-9]{2})?)$")


class ActivityQueryError(ValueError):
    """A query parameter the caller must fix; the message says how."""


@dataclass(frozen=True)
class ActivityQuery:
    models: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()  # API key row names; "" for requests with a config file apiKey or none
    bands: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    limit: int = DEFAULT_LIMIT
    before_id: int | None = None

    @classmethod
    def from_params(cls, params: QueryDict) -> ActivityQuery:
        unknown = sorted(set(params) - set(PARAMETERS))
        if unknown:
            raise ActivityQueryError(
                f"unknown parameter {', '.join(repr(name) for name in unknown)}; use {', '.join(PARAMETERS)}"
            )
        for name in ("since", "until", "limit", "before_id"):
            if len(params.getlist(name)) > 1:
                raise ActivityQueryError(f"'{name}' was given more than once; give it once")
        since = _timestamp(params, "since")
        until = _timestamp(params, "until")
        if since is not None and until is not None and since >= until:
            raise ActivityQueryError(f"'since' ({params['since']}) must be before 'until' ({params['until']})")
        return cls(
            models=tuple(params.getlist("model")),
            keys=tuple(params.getlist("key")),
            bands=_choices(params, "band", BandChoice.values),
            states=_choices(params, "state", RequestState.values),
            since=since,
            until=until,
            limit=_integer(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
            before_id=_integer(params, "before_id", None, 1, ROW_ID_MAX),
        )


def _choices(params: QueryDict, name: str, allowed: list[str]) -> tuple[str, ...]:
    values = tuple(params.getlist(name))
    for value in values:
        if value not in allowed:
            raise ActivityQueryError(f"{name} '{value}' is not one of {', '.join(allowed)}")
    return values


def _timestamp(params: QueryDict, name: str) -> datetime | None:
    text = params.get(name)
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(_UNENCODED_PLUS_ZONE.sub(r"\1+\2", text.strip()))
    except ValueError:
        raise ActivityQueryError(
            f"{name} '{text}' is not an ISO 8601 time; use e.g. 2025-01-31T09:00:00Z (no zone means UTC)"
        ) from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _integer(params: QueryDict, name: str, default: int | None, low: int, high: int) -> int | None:
    text = params.get(name)
    if text is None:
        return default
    wanted = f"a whole number from {low} to {high}"
    if _DIGITS.fullmatch(text.strip()) is None:
        raise ActivityQueryError(f"{name} '{as_typed(text)}' is not {wanted}")
    value = whole_number(text.strip(), high)
    if value is None or value < low:
        raise ActivityQueryError(f"{name} {as_typed(text.strip())} is out of range; use {wanted}")
    return value


def activity_page(query: ActivityQuery) -> dict[str, Any]:
    """One page of rows, newest first, and the cursor for the next (older) page or None."""
    rows = QueuedRequest.objects.exclude(method="LOAD").order_by("-id")  # a lease's or preload's load: no request
    if query.models:
        rows = rows.filter(model__in=query.models)
    if query.keys:
        rows = rows.filter(api_key__in=query.keys)
    if query.bands:
        rows = rows.filter(band__in=query.bands)
    if query.states:
        rows = rows.filter(state__in=query.states)
    if query.since is not None:
        rows = rows.filter(arrived_at__gte=query.since)
    if query.until is not None:
        rows = rows.filter(arrived_at__lt=query.until)
    if query.before_id is not None:
        rows = rows.filter(id__lt=query.before_id)
    page = list(rows[: query.limit + 1])
    more = len(page) > query.limit
    page = page[: query.limit]
    return {
        "data": [activity_row(row) for row in page],
        "next_before_id": page[-1].id if more else None,
    }


def iso_utc(value: datetime | None) -> str | None:
    """A row's time as RFC 3339 in UTC, with `Z`, as both activity APIs give it."""
    return None if value is None else value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def activity_row(row: QueuedRequest) -> dict[str, Any]:
    """A row as JSON: the request, its decision (with the spec's serial_* / fifo_priority keys), times and tokens."""
    dispatched = row.dispatched_at is not None and row.score_priority is not None
    data: dict[str, Any] = {
        "id": row.id,
        "model": row.model,
        "requested_model": row.requested_model,
        "selector": row.selector,  # the selector that picked `model`, "" when none did
        "peer": row.peer,  # the peer the request was relayed to ("" for a local model)
        "method": row.method,
        "path": row.path,
        "stream": row.stream,
        "client": row.client,
        "max_wait_s": row.max_wait_s,
        "api_key": row.api_key,  # the API key row's name, "" for a config file apiKey or none
        "asked_priority": row.asked_priority,  # the header's priority before the key's clamp (null: no header)
        "priority": row.priority,
        "band": row.band,
        "state": row.state,
        "scheduler": row.scheduler,
    }
    if row.scheduler == "fifo":
        data["fifo_priority"] = row.fifo_priority
    else:
        data.update(
            serial_priority=row.serial_priority,
            serial_band=row.serial_band or None,
            serial_score=row.serial_score,
            serial_queue_wait_ms=row.serial_queue_wait_ms,
        )
    data.update(
        score_terms=(
            {"priority": row.score_priority, "affinity": row.score_affinity, "aging": row.score_aging}
            if dispatched
            else None
        ),
        runner_up=(
            {"id": row.runner_up_id, "score": row.runner_up_score} if row.runner_up_id is not None else None
        ),
        changed_pick=[
            term
            for term, flag in (("aging", row.changed_by_aging), ("swap_affinity", row.changed_by_affinity),
                               ("fair_share", row.changed_by_fairness))
            if flag
        ],
        needed_swap=row.needed_swap,
        slot=row.slot,
        waited_because=row.waited_because or None,
        explanation=row.explanation,
        arrived_at=iso_utc(row.arrived_at),
        dispatched_at=iso_utc(row.dispatched_at),
        first_byte_at=iso_utc(row.first_byte_at),
        finished_at=iso_utc(row.finished_at),
        status_code=row.status_code,
        error=row.error,
        duration_ms=row.duration_ms,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cache_tokens=row.cache_tokens,
        prompt_per_second=row.prompt_per_second,
        tokens_per_second=row.tokens_per_second,
        response_bytes=row.response_bytes,
    )
    return data
