"""The request rows in llama-swap's activity shapes: `GET /api/metrics/activity` and `/api/metrics/stats`.

llama-swap's web UI and scripts read these. Only requests that ended are listed (llama-swap records
a request when it finishes); their time is the arrival time, which the indexes cover. Totals are
summed in the database; the speed histograms need every speed, fetched as one column pair.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, Count, F, IntegerField, Q, Sum, When
from django.http import QueryDict

from scheduling.rows.activity import iso_utc
from scheduling.models import QueuedRequest
from scheduling.tickets import TERMINAL_STATES, RequestState
from scheduling.whole_numbers import ROW_ID_MAX, as_typed, whole_number

DEFAULT_LIMIT = 25
MAX_LIMIT = 999
# The last page whose rows the database can be asked for: page × limit stays a 64-bit integer.
MAX_PAGE = (ROW_ID_MAX + 1) // MAX_LIMIT
UNKNOWN = -1  # llama-swap's value for a count or speed that was not reported
# The states of a request not yet ended. Rows are picked by leaving these out: `state IN (ended...)`
# would lead the database to the state index and a sort of every row before the first page.
UNENDED_STATES = tuple(state for state in RequestState.values if state not in TERMINAL_STATES)

# llama-swap's sort keys and the columns behind them. A request's content type is not stored: it is
# the one a request asks for (stream or not), so that key sorts by `stream`. Draft tokens are not
# recorded, so `drafted` leaves the order to the id.
SORT_COLUMNS = {
    "id": "id",
    "time": "arrived_at",
    "model": "model",
    "req_path": "path",
    "resp_status_code": "status_code",
    "resp_content_type": "stream",
    "cached": "cache_tokens",
    "prompt": "input_tokens",
    "generated": "output_tokens",
    "drafted": "id",
    "prompt_speed": "prompt_per_second",
    "gen_speed": "tokens_per_second",
    "duration": "duration_ms",
}


class LlamaSwapQueryError(ValueError):
    """A query parameter the caller must fix; the message names it and says how."""


@dataclass(frozen=True)
class LlamaSwapActivityQuery:
    models: tuple[str, ...] = ()
    owner: str | None = None  # only this API key's requests (None: everyone's)
    start: datetime | None = None
    end: datetime | None = None
    min_id: int | None = None
    max_id: int | None = None
    limit: int = DEFAULT_LIMIT
    page: int = 1
    sort: str = "id"
    descending: bool = True

    @classmethod
    def from_params(cls, params: QueryDict) -> LlamaSwapActivityQuery:
        """Read llama-swap's parameters; like llama-swap, parameters it does not know are ignored."""
        sort = params.get("sort", "").strip() or "id"
        if sort not in SORT_COLUMNS:
            raise LlamaSwapQueryError(f"sort '{sort}' is not a column; use one of {', '.join(SORT_COLUMNS)}")
        order = params.get("order", "").strip().lower() or "desc"
        if order not in ("asc", "desc"):
            raise LlamaSwapQueryError(f"order '{params['order']}' must be asc or desc")
        start, end = _time(params, "start"), _time(params, "end")
        if start is not None and end is not None and start > end:
            raise LlamaSwapQueryError(f"start ({params['start']}) is after end ({params['end']})")
        return cls(
            models=model_names(params),
            start=start,
            end=end,
            min_id=_whole(params, "min_id", 1, ROW_ID_MAX),
            max_id=_whole(params, "max_id", 1, ROW_ID_MAX),
            limit=_whole(params, "limit", 1, MAX_LIMIT) or DEFAULT_LIMIT,
            page=_whole(params, "page", 1, MAX_PAGE) or 1,
            sort=sort,
            descending=order == "desc",
        )


def model_names(params: QueryDict) -> tuple[str, ...]:
    """The `model` values (repeatable), blanks left out: none means every model."""
    return tuple(name for name in (value.strip() for value in params.getlist("model")) if name)


def _time(params: QueryDict, name: str) -> datetime | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None or "T" not in text.upper():
        raise LlamaSwapQueryError(f"{name} '{text}' is not an RFC 3339 time; use e.g. 2025-01-31T09:00:00Z")
    return value


def _whole(params: QueryDict, name: str, low: int, high: int) -> int | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    value = whole_number(text, high)
    if value is None or value < low:
        raise LlamaSwapQueryError(f"{name} '{as_typed(text)}' is not a whole number from {low} to {high}")
    return value


def _ended_rows(models: tuple[str, ...], owner: str | None):
    """The ended requests on `models` (none: every model) of the API key `owner` (None: every key's)."""
    rows = QueuedRequest.objects.exclude(state__in=UNENDED_STATES).exclude(method="LOAD")  # no client's request
    rows = rows.filter(model__in=models) if models else rows
    return rows if owner is None else rows.filter(api_key=owner)


def llama_swap_activity_page(query: LlamaSwapActivityQuery, has_capture: Callable[[int], bool]) -> dict[str, Any]:
    """One page of ended requests in llama-swap's `ActivityPage` shape: data, page, limit, total, total_pages."""
    rows = _ended_rows(query.models, query.owner)
    if query.start is not None:
        rows = rows.filter(arrived_at__gte=query.start)
    if query.end is not None:
        rows = rows.filter(arrived_at__lte=query.end)
    if query.min_id is not None:
        rows = rows.filter(id__gte=query.min_id)
    if query.max_id is not None:
        rows = rows.filter(id__lte=query.max_id)
    total = rows.count()
    column = F(SORT_COLUMNS[query.sort])
    # Unknown values sort as llama-swap's -1 does: below every known one.
    primary = column.desc(nulls_last=True) if query.descending else column.asc(nulls_first=True)
    tie = "-id" if query.descending else "id"
    ordering = (tie,) if SORT_COLUMNS[query.sort] == "id" else (primary, tie)
    offset = (query.page - 1) * query.limit
    page = rows.order_by(*ordering)[offset: offset + query.limit]
    return {
        "data": [activity_entry(row, has_capture(row.id)) for row in page],
        "page": query.page,
        "limit": query.limit,
        "total": total,
        "total_pages": math.ceil(total / query.limit),
    }


def activity_entry(row: QueuedRequest, has_capture: bool) -> dict[str, Any]:
    """A row as llama-swap's `ActivityLogEntry`; what was not reported is -1 (cache, draft, speeds) or 0."""
    entry: dict[str, Any] = {
        "id": row.id,
        "timestamp": iso_utc(row.arrived_at),
        "model": row.model,
        "req_path": row.path,
        "resp_content_type": "text/event-stream" if row.stream else "application/json",
        "resp_status_code": row.status_code or 0,
        "tokens": {
            "cache_tokens": _or(row.cache_tokens, UNKNOWN),
            "draft_tokens": UNKNOWN,
            "draft_acc_tokens": UNKNOWN,
            "input_tokens": _or(row.input_tokens, 0),
            "output_tokens": _or(row.output_tokens, 0),
            "prompt_per_second": _or(row.prompt_per_second, UNKNOWN),
            "tokens_per_second": _or(row.tokens_per_second, UNKNOWN),
        },
        "duration_ms": _or(row.duration_ms, 0),
        "has_capture": has_capture,
    }
    if row.error:
        entry["error_msg"] = row.error
    metadata = _metadata(row)
    if metadata:
        entry["metadata"] = metadata
    return entry


def _or(value, default):
    return default if value is None else value


def _metadata(row: QueuedRequest) -> dict[str, str]:
    """llama-swap's string map of the scheduler's keys (`fifo_priority`, `selector`), plus serial's."""
    if row.scheduler == "fifo":
        pairs = {"fifo_priority": row.fifo_priority}
    else:
        pairs = {
            "serial_priority": row.serial_priority,
            "serial_band": row.serial_band or None,
            "serial_score": row.serial_score,
            "serial_queue_wait_ms": row.serial_queue_wait_ms,
        }
    pairs["selector"] = row.selector or None
    pairs["peer"] = row.peer or None
    return {key: f"{value:g}" if isinstance(value, float) else str(value) for key, value in pairs.items() if value is not None}


def activity_stats(models: tuple[str, ...], owner: str | None = None) -> dict[str, Any]:
    """llama-swap's `ActivityStats`: request and token totals, and prompt/generation speed histograms (of the
    API key `owner`'s requests; None: everyone's)."""
    rows = _ended_rows(models, owner)
    totals = rows.aggregate(
        requests=Count("id"),
        input=Sum("input_tokens"),
        output=Sum("output_tokens"),
        cache=Sum(Case(When(cache_tokens__gt=0, then=F("cache_tokens")), default=0, output_field=IntegerField())),
    )
    prompt: list[float] = []
    generation: list[float] = []
    speeds = rows.filter(Q(prompt_per_second__gt=0) | Q(tokens_per_second__gt=0))
    for prompt_speed, generation_speed in speeds.values_list("prompt_per_second", "tokens_per_second").iterator(
        chunk_size=20_000
    ):
        if prompt_speed is not None and prompt_speed > 0:
            prompt.append(prompt_speed)
        if generation_speed is not None and generation_speed > 0:
            generation.append(generation_speed)
    return {
        "total_requests": totals["requests"],
        "total_input_tokens": totals["input"] or 0,
        "total_output_tokens": totals["output"] or 0,
        "total_cache_tokens": totals["cache"] or 0,
        "prompt_histogram": histogram(prompt),
        "gen_histogram": histogram(generation),
    }


def histogram(values: list[float]) -> dict[str, Any] | None:
    """llama-swap's `HistogramData`: 5 to 20 equal bins (Sturges' rule) and interpolated p50/p95/p99;
    None for no values, one bin of width 0 when all are equal. Sorts `values` in place."""
    if not values:
        return None
    values.sort()
    low, high = values[0], values[-1]
    summary = {"p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99)}
    if low == high:
        return {"bins": [len(values)], "min": low, "max": high, "binSize": 0, **summary}
    count = min(20, max(5, math.ceil(math.log2(len(values))) + 1))
    size = (high - low) / count
    starts = [0] + [bisect.bisect_left(values, low + size * i) for i in range(1, count)] + [len(values)]
    bins = [starts[i + 1] - starts[i] for i in range(count)]
    return {"bins": bins, "min": low, "max": high, "binSize": size, **summary}


def percentile(ordered: list[float], p: float) -> float:
    """The p-th percentile of sorted values, interpolated between the two nearest ranks."""
    rank = p / 100 * (len(ordered) - 1)
    lower, upper = math.floor(rank), math.ceil(rank)
    return ordered[lower] + (rank - lower) * (ordered[upper] - ordered[lower])
