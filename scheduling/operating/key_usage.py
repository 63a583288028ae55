"""One API key's usage over a window, for its page in the admin: its requests, tokens, queue waits and the
error statuses it was answered with, per bucket of the Overview's windows (`overview.Window`), drawn by the
same charts.

One statement reads the key's rows of the window through the (api_key, arrived_at) index and groups them by
the bucket each arrived in; waits are counted in the Overview's histogram bins, so a percentile is a bin's
upper edge. Refusals at the door (403 outside the key's scope, 429 over its quota, 400 bad input) leave no row:
their per-minute counts (`KeyRefusals`) are added to the statuses. A 401 names no key it could be counted for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db import connection
from django.db.models import Value

from scheduling.models import KeyRefusals, QueuedRequest
from scheduling.operating.overview import WAIT_EDGES_MS, EpochMs, Window, chart_maker, percentile, wait_bin
from scheduling.operating.svg_charts import Series

# Statuses drawn one by one in the errors chart; the rest are summed under "other".
SHOWN_STATUSES = 6


@dataclass(frozen=True)
class KeyUsage:
    window: Window
    requests: list[int]  # arrived in each bucket
    input_tokens: list[int]
    output_tokens: list[int]
    wait_p50_s: list[float | None]  # of the bucket's arrivals that were dispatched
    wait_p95_s: list[float | None]
    statuses: dict[str, list[int]]  # status (400 and up) → requests answered with it

    @property
    def totals(self) -> dict:
        return {"requests": sum(self.requests), "input_tokens": sum(self.input_tokens),
                "output_tokens": sum(self.output_tokens), "errors": sum(map(sum, self.statuses.values()))}


_PARTS = (
    "SELECT 'arrived', a / %(step)s, 0, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0)"
    " FROM r GROUP BY a / %(step)s",
    "SELECT 'status', a / %(step)s, status_code, COUNT(*), 0, 0 FROM r WHERE status_code >= 400"
    " GROUP BY a / %(step)s, status_code",
    "SELECT 'waited', a / %(step)s, %(bin)s, COUNT(*), 0, 0 FROM r WHERE d IS NOT NULL GROUP BY a / %(step)s, %(bin)s",
)


def summarize(key: str, window: Window) -> KeyUsage:
    """The rows the key `key` sent that arrived in the window, grouped per bucket."""
    count = len(window.starts)
    since_ms = round(window.since.timestamp() * 1000)
    rows = (
        QueuedRequest.objects.filter(api_key=key, arrived_at__gte=window.since, arrived_at__lt=window.until)
        .order_by()
        .annotate(a=EpochMs("arrived_at") - Value(since_ms), d=EpochMs("dispatched_at") - Value(since_ms))
        .values("a", "d", "status_code", "input_tokens", "output_tokens")
    )
    inner, params = rows.query.sql_with_params()
    numbers = {"step": window.step_ms, "bin": wait_bin("(d - a)", 0, len(WAIT_EDGES_MS))}
    with connection.cursor() as cursor:
        cursor.execute(f"WITH r AS ({inner}) {' UNION ALL '.join(part % numbers for part in _PARTS)}", params)
        grouped = cursor.fetchall()
    requests, tokens_in, tokens_out = [0] * count, [0] * count, [0] * count
    histograms = [[0] * len(WAIT_EDGES_MS) for _ in range(count)]
    by_status: dict[int, list[int]] = defaultdict(lambda: [0] * count)
    for kind, b, detail, n, t_in, t_out in grouped:
        if kind == "arrived":
            requests[b], tokens_in[b], tokens_out[b] = n, t_in, t_out
        elif kind == "status":
            by_status[detail][b] += n
        else:
            histograms[b][detail] += n
    door = KeyRefusals.objects.filter(api_key=key, minute__gte=window.since, minute__lt=window.until)
    for minute, status, n in door.values_list("minute", "status", "count"):
        by_status[status][int((minute - window.since) / window.step)] += n
    return KeyUsage(window, requests, tokens_in, tokens_out, [percentile(h, 0.50) for h in histograms],
                    [percentile(h, 0.95) for h in histograms], _top_statuses(by_status, count))


def _top_statuses(by_status: dict[int, list[int]], count: int) -> dict[str, list[int]]:
    ranked = sorted(by_status, key=lambda status: (-sum(by_status[status]), status))
    shown = {str(status): by_status[status] for status in sorted(ranked[:SHOWN_STATUSES])}
    rest = ranked[SHOWN_STATUSES:]
    if rest:
        shown["other"] = [sum(by_status[status][b] for status in rest) for b in range(count)]
    return shown


def charts(usage: KeyUsage) -> list[dict]:
    chart = chart_maker(usage.window)
    return [
        chart("Requests", "Requests the key sent, by the bucket they arrived in.",
              [Series("requests", usage.requests)], stacked_bars=True),
        chart("Tokens", "Tokens of those requests, as the model servers reported them.",
              [Series("input", usage.input_tokens), Series("output", usage.output_tokens)]),
        chart("Queue wait",
              "Median (solid) and 95th percentile (dashed) wait of those that were dispatched, from arrival to "
              "dispatch; exact to the wait histogram's bin, rounded up.",
              [Series("p50", usage.wait_p50_s), Series("p95", usage.wait_p95_s, dashed=True)], unit=" s"),
        chart("Refusals and errors by status",
              "Those answered with a status of 400 or more: refusals at the door (403 outside the key's models, "
              "429 over its quota, 400 …), the scheduler's refusals (429, 503 …) and failures (502 …). A 401 "
              "names no key, so it is not counted here.",
              [Series(status, counts) for status, counts in usage.statuses.items()], stacked_bars=True),
    ]
