"""The admin's Overview: what the queue and the GPUs did over a window, aggregated in the database.

One statement answers every chart, whatever the window holds: it reads the
window's rows once through the `arrived_at` index, turns their times into
integer milliseconds, and groups them five ways per time bucket (integer
arithmetic, the same on SQLite and PostgreSQL); only the group totals come back. Queue depth and GPU
busy share are time averages over each bucket, rebuilt from the events that
change them (arrivals and departures; job starts and ends). Wait percentiles
come from a histogram of fixed wait bins counted in SQL, so they are exact to
the bin: a percentile is the upper edge of the bin its rank falls in.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone

from django.db import connection
from django.db.models import BigIntegerField, F, Value
from django.db.models.expressions import Func
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from scheduling.models import BandChoice, QueuedRequest
from scheduling.operating.svg_charts import PALETTE, Chart, Series, render

PRESETS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_PRESET = "24h"
MAX_BUCKETS = 60
# Bucket lengths in seconds: the shortest that keeps a window within MAX_BUCKETS.
STEPS_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
MAX_SPAN = timedelta(days=366)
EARLIEST = datetime(1971, 1, 1, tzinfo=dt_timezone.utc)
LATEST = datetime(9998, 12, 31, tzinfo=dt_timezone.utc)
# Rows that arrived this long before the window still count in it (they waited or ran into it);
# a request that waited or ran longer than this before the window is left out of its depth and busy share.
LOOKBACK = timedelta(days=1)
# Wait histogram edges in ms: 0, then 10 ms to 100 000 s in steps of at most a third.
WAIT_EDGES_MS = (0,) + tuple(
    int(mantissa * 10 ** exponent)
    for exponent in range(1, 8)
    for mantissa in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
) + (100_000_000,)
BANDS = tuple(BandChoice.values)


class BadWindow(ValueError):
    """The query string does not name a window the page can show; the message says why."""


class EpochMs(Func):
    """A timestamp as whole milliseconds since the Unix epoch, on PostgreSQL and SQLite alike."""

    arity = 1
    output_field = BigIntegerField()
    template = "CAST(ROUND(EXTRACT(EPOCH FROM %(expressions)s) * 1000) AS BIGINT)"

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores datetimes as UTC text; julianday's error (~50 µs) is well under the rounding.
        template = "CAST(ROUND((julianday(%(expressions)s) - 2440587.5) * 86400000.0) AS INTEGER)"
        return self.as_sql(compiler, connection, template=template, **extra)


@dataclass(frozen=True)
class Window:
    """[since, until) cut into buckets of `step` from `since`; the last bucket may be shorter."""

    since: datetime
    until: datetime
    step: timedelta
    preset: str = ""

    @classmethod
    def from_query(cls, query, now: datetime) -> Window:
        """From `?window=24h`, or `?since=…[&until=…]` (ISO date or date and time; until defaults to now)."""
        since_text, until_text = query.get("since", "").strip(), query.get("until", "").strip()
        if since_text:
            since = _moment("since", since_text)
            until = _moment("until", until_text) if until_text else now
            if until <= since:
                raise BadWindow(f"until ({until_text or 'now'}) must be after since ({since_text[:40]}).")
            if until - since > MAX_SPAN:
                raise BadWindow(f"The window is at most {MAX_SPAN.days} days; this one is {(until - since).days}.")
            return cls.covering(since, until)
        if until_text:
            raise BadWindow("until needs a since: give both, or choose a window such as 24h.")
        preset = query.get("window", DEFAULT_PRESET) or DEFAULT_PRESET
        if preset not in PRESETS:
            raise BadWindow(f"window: {preset[:40]!r} is not one of {', '.join(PRESETS)}.")
        window = cls.covering(now - PRESETS[preset], now)
        return cls(window.since, window.until, window.step, preset)

    @classmethod
    def covering(cls, since: datetime, until: datetime) -> Window:
        """Buckets of the shortest listed length that gives at most MAX_BUCKETS, starting at a multiple of it
        (12:00, 12:30, … rather than 12:07, 12:37, …)."""
        span_s = (until - since).total_seconds()
        step_s = next((s for s in STEPS_S if span_s / s <= MAX_BUCKETS), STEPS_S[-1])
        start_ms = _ms(since) - _ms(since) % (step_s * 1000)
        return cls(datetime.fromtimestamp(start_ms / 1000, dt_timezone.utc), until, timedelta(seconds=step_s))

    @property
    def step_text(self) -> str:
        seconds = int(self.step.total_seconds())
        for size, unit in ((86400, "day"), (3600, "h"), (60, "min")):
            if seconds % size == 0:
                count = seconds // size
                return f"{count} {unit}{'s' if unit == 'day' and count > 1 else ''}"
        return f"{seconds} s"

    @property
    def step_ms(self) -> int:
        return int(self.step.total_seconds() * 1000)

    @property
    def span_ms(self) -> int:
        return _ms(self.until) - _ms(self.since)

    @property
    def starts(self) -> list[datetime]:
        return [self.since + self.step * k for k in range(math.ceil(self.span_ms / self.step_ms))]

    def lengths_ms(self) -> list[int]:
        return [min(self.step_ms, self.span_ms - k * self.step_ms) for k in range(len(self.starts))]


def chosen_window(query, now: datetime) -> tuple[Window | None, dict]:
    """A page of window charts' window (None when the query names none it can show) and the template's context
    for the choice: the presets, the problem, and the since and until boxes. Those show the window drawn, in the
    admin's time zone (since starts its first bucket, so 09:07 shows as 09:05 in buckets of 5 min); until stays
    empty while it is now. What was typed stays only when it cannot be shown."""
    context = {"presets": list(PRESETS), "since": query.get("since", ""), "until": query.get("until", "")}
    try:
        window = Window.from_query(query, now)
    except BadWindow as exc:
        return None, {**context, "problem": str(exc)}
    until = _typed(window.until) if query.get("until", "").strip() else ""
    return window, {**context, "since": _typed(window.since), "until": until, "window": window,
                    "step": window.step_text}


def _typed(moment: datetime) -> str:
    """A moment as the boxes take it, in the admin's time zone, to the minute unless it has seconds."""
    local = timezone.localtime(moment)
    return local.strftime("%Y-%m-%dT%H:%M:%S" if local.second or local.microsecond else "%Y-%m-%dT%H:%M")


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _moment(name: str, text: str) -> datetime:
    try:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            moment = None if day is None else datetime(day.year, day.month, day.day)
    except ValueError:  # well formed but impossible, e.g. 2026-02-30
        moment = None
    if moment is None:
        raise BadWindow(f"{name}: {text[:40]!r} is not a date or a date and time (e.g. 2026-12-01 or 2026-12-01T08:00).")
    moment = timezone.make_aware(moment) if timezone.is_naive(moment) else moment
    if not EARLIEST <= moment <= LATEST:  # a day of look-back or a bucket's rounding must stay in the calendar
        raise BadWindow(f"{name}: {text[:40]!r} is outside {EARLIEST:%Y} to {LATEST:%Y}.")
    return moment


@dataclass(frozen=True)
class Overview:
    """Per-bucket series of a window; a value is None where the bucket has nothing to measure."""

    window: Window
    depth: dict[str, list[float]]  # band → time-average number of requests waiting
    wait_p50_s: dict[str, list[float | None]]  # band → median queue wait of the requests dispatched in the bucket
    wait_p95_s: dict[str, list[float | None]]
    dispatches_per_h: list[float]
    reorders_per_h: dict[str, list[float]]  # term ("aging", "swap affinity") → dispatches it changed, per hour
    loads: dict[str, list[int]]  # model → dispatches that had to start it
    busy_share: dict[str, list[float]]  # model → time-average jobs running (1.0 = one job all the time)
    totals: list[dict]  # per band: arrived, dispatched, p50 and p95 wait (s) over the whole window


def summarize(window: Window) -> Overview:
    """Aggregate the window's rows in one statement and shape the series."""
    count, step_ms = len(window.starts), window.step_ms
    lengths = window.lengths_ms()
    depth_in, depth_out, depth0 = _events(count), _events(count), defaultdict(int)
    run_in, run_out, run0 = _events(count), _events(count), defaultdict(int)
    arrived = defaultdict(int)
    dispatched_per_bucket = [0] * count
    reorders = {"aging": [0] * count, "swap affinity": [0] * count}
    loads: dict[str, list[int]] = {}
    histograms: dict[str, list[list[int]]] = {band: [[0] * len(WAIT_EDGES_MS) for _ in range(count)] for band in BANDS}
    for kind, band, model, b, n, t, *more in _grouped(window):
        if kind == "arrived":
            depth_in[band][b] = _add(depth_in[band][b], n, t)
            arrived[band] += n
        elif kind == "left":
            started, t_started, aging, affinity, swaps = more
            depth_out[band][b] = _add(depth_out[band][b], n, t)
            if started:
                run_in[model][b] = _add(run_in[model][b], started, t_started)
            dispatched_per_bucket[b] += started
            reorders["aging"][b] += aging
            reorders["swap affinity"][b] += affinity
            if swaps:
                loads.setdefault(model, [0] * count)[b] += swaps
        elif kind == "ended":
            run_out[model][b] = _add(run_out[model][b], n, t)
        elif kind == "at start":  # n: waiting, t: running
            depth0[band] += n
            run0[model] += t
        else:  # "waited": b is the dispatch's bucket, more[0] the wait's bin
            band_histograms = histograms.setdefault(band, [[0] * len(WAIT_EDGES_MS) for _ in range(count)])
            band_histograms[b][more[0]] += n

    per_hour = [3_600_000 / length for length in lengths]
    models = sorted(set(run0) | set(run_in) | set(run_out))
    return Overview(
        window=window,
        depth={band: _time_average(depth0[band], depth_in[band], depth_out[band], step_ms, lengths)
               for band in BANDS},
        wait_p50_s={band: [percentile(h, 0.50) for h in histograms[band]] for band in BANDS},
        wait_p95_s={band: [percentile(h, 0.95) for h in histograms[band]] for band in BANDS},
        dispatches_per_h=[n * rate for n, rate in zip(dispatched_per_bucket, per_hour)],
        reorders_per_h={term: [n * rate for n, rate in zip(counts, per_hour)] for term, counts in reorders.items()},
        loads=dict(sorted(loads.items())),
        busy_share={model: _time_average(run0[model], run_in[model], run_out[model], step_ms, lengths)
                    for model in models},
        totals=[_band_total(band, arrived[band], histograms[band]) for band in BANDS],
    )


# Each part groups the window's rows one way; every part has the same columns (kind, band, model, bucket,
# count, time sum, then five more) so they come back as one UNION ALL. Times are ms since the window's start.
_PARTS = (
    # Arrivals in the window, per band.
    "SELECT 'arrived', band, '', a / %(step)s, COUNT(*), CAST(SUM(a) AS BIGINT), 0, 0, 0, 0, 0 FROM r"
    " WHERE a >= 0 AND a < %(span)s GROUP BY band, a / %(step)s",
    # Queue departures (dispatch, or leaving unserved) in the window, with the dispatches among them.
    "SELECT 'left', band, model, COALESCE(d, f) / %(step)s, COUNT(*), CAST(SUM(COALESCE(d, f)) AS BIGINT),"
    " COUNT(d), CAST(COALESCE(SUM(d), 0) AS BIGINT), SUM(CASE WHEN aging THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN affinity THEN 1 ELSE 0 END), SUM(CASE WHEN swap THEN 1 ELSE 0 END) FROM r"
    " WHERE COALESCE(d, f) >= 0 AND COALESCE(d, f) < %(span)s GROUP BY band, model, COALESCE(d, f) / %(step)s",
    # Ends of jobs in the window.
    "SELECT 'ended', '', model, f / %(step)s, COUNT(*), CAST(SUM(f) AS BIGINT), 0, 0, 0, 0, 0 FROM r"
    " WHERE d IS NOT NULL AND f >= 0 AND f < %(span)s GROUP BY model, f / %(step)s",
    # At the window's start: requests waiting, jobs running.
    "SELECT 'at start', band, model, 0, SUM(CASE WHEN COALESCE(d, f) IS NULL OR COALESCE(d, f) >= 0 THEN 1 ELSE 0 END),"
    " SUM(CASE WHEN d < 0 AND (f IS NULL OR f >= 0) THEN 1 ELSE 0 END), 0, 0, 0, 0, 0 FROM r"
    " WHERE a < 0 GROUP BY band, model",
    # Waits of the requests dispatched in the window, counted in histogram bins.
    "SELECT 'waited', band, '', d / %(step)s, COUNT(*), 0, %(bin)s, 0, 0, 0, 0 FROM r"
    " WHERE d >= 0 AND d < %(span)s GROUP BY band, d / %(step)s, %(bin)s",
)


def _grouped(window: Window) -> list[tuple]:
    """The window's rows (and those of LOOKBACK before it), their times turned into integers once, grouped."""
    since_ms = _ms(window.since)
    rows = (
        QueuedRequest.objects.filter(arrived_at__gte=window.since - LOOKBACK, arrived_at__lt=window.until)
        .order_by()
        .annotate(
            a=EpochMs("arrived_at") - Value(since_ms), d=EpochMs("dispatched_at") - Value(since_ms),
            f=EpochMs("finished_at") - Value(since_ms),
            aging=F("changed_by_aging"), affinity=F("changed_by_affinity"), swap=F("needed_swap"),
        )
        .values("band", "model", "a", "d", "f", "aging", "affinity", "swap")
    )
    inner, params = rows.query.sql_with_params()
    # Integers only from here on (no user input): the step, the span and the bin edges.
    numbers = {"step": window.step_ms, "span": window.span_ms, "bin": wait_bin("(d - a)", 0, len(WAIT_EDGES_MS))}
    parts = " UNION ALL ".join(part % numbers for part in _PARTS)
    # Used by every part, the CTE is read and converted once (SQLite 3.35+ and PostgreSQL 12+ materialize it).
    with connection.cursor() as cursor:
        cursor.execute(f"WITH r AS ({inner}) {parts}", params)
        return cursor.fetchall()


def _events(count: int) -> defaultdict[str, list[tuple[int, int]]]:
    """Per key and bucket: (how many events, the sum of their times in ms since the window's start)."""
    return defaultdict(lambda: [(0, 0)] * count)


def _add(total: tuple[int, int], n: int, t: int | None) -> tuple[int, int]:
    return total[0] + n, total[1] + (t or 0)


def _time_average(level: int, ins: list[tuple[int, int]], outs: list[tuple[int, int]], step_ms: int,
                  lengths: list[int]) -> list[float]:
    """The average of a level (requests waiting, jobs running) over each bucket, from its value at the window's
    start and the events that raise and lower it: an event at t inside a bucket ending at E counts for E − t."""
    averages = []
    for b, length in enumerate(lengths):
        end = b * step_ms + length
        (n_in, t_in), (n_out, t_out) = ins[b], outs[b]
        averages.append(level + ((n_in * end - t_in) - (n_out * end - t_out)) / length)
        level += n_in - n_out
    return averages


def wait_bin(wait: str, low: int, high: int) -> str:
    """SQL for the index of the first edge at or above the wait, a CASE that halves the edges at each level."""
    if high - low == 1:
        return str(low)
    middle = (low + high) // 2
    return (f"CASE WHEN {wait} <= {WAIT_EDGES_MS[middle - 1]} THEN {wait_bin(wait, low, middle)} "
            f"ELSE {wait_bin(wait, middle, high)} END")


def percentile(histogram: list[int], share: float) -> float | None:
    """The upper edge, in seconds, of the bin holding the request ranked at `share`; None without requests."""
    total = sum(histogram)
    if not total:
        return None
    rank, seen = math.ceil(share * total), 0
    for edge, n in zip(WAIT_EDGES_MS, histogram):
        seen += n
        if seen >= rank:
            return edge / 1000
    return WAIT_EDGES_MS[-1] / 1000  # not reached: the counts add up to the total


def _band_total(band: str, arrived: int, histograms: list[list[int]]) -> dict:
    merged = [sum(column) for column in zip(*histograms)]
    return {"band": band, "arrived": arrived, "dispatched": sum(merged),
            "p50_s": percentile(merged, 0.50), "p95_s": percentile(merged, 0.95)}


def chart_maker(window: Window):
    """`chart(title, about, series, unit, stacked_bars)`: one of the window's charts, its buckets labelled under the
    axis (their starts) and in the tooltips (their spans), as the page's template draws it."""
    long = window.until - window.since > timedelta(days=1)
    tick = "%b %d" if window.step >= timedelta(days=1) else ("%b %d %H:%M" if long else "%H:%M")
    starts = [timezone.localtime(start) for start in window.starts]
    labels = [start.strftime(tick) for start in starts]
    ends = [*starts[1:], timezone.localtime(window.until)]
    until = "%H:%M" if window.step < timedelta(days=1) else "%b %d %H:%M"
    spans = [f"{start:%b %d %H:%M}–{end.strftime(until)}" for start, end in zip(starts, ends)]

    def chart(title: str, about: str, series: list[Series], unit: str = "", stacked_bars: bool = False) -> dict:
        drawn = Chart(title, labels, spans, series, unit, stacked_bars)
        return {"title": title, "about": about, "svg": render(drawn)}

    return chart


def charts(overview: Overview) -> list[dict]:
    """The page's charts: a title, what the numbers mean, and the SVG."""
    chart = chart_maker(overview.window)

    colours = dict(zip(BANDS, PALETTE))
    return [
        chart("Queue depth by band", "Requests waiting for the GPU, averaged over each bucket.",
              [Series(band, overview.depth[band], colour=colours[band]) for band in BANDS]),
        chart("Queue wait by band",
              "Median (solid) and 95th percentile (dashed) wait of the requests dispatched in each bucket; "
              "exact to the wait histogram's bin (at most a third apart), rounded up.",
              [Series(f"{band} {name}", values[band], dashed=name == "p95", colour=colours[band])
               for band in BANDS for name, values in (("p50", overview.wait_p50_s), ("p95", overview.wait_p95_s))],
              unit=" s"),
        chart("Dispatches and reorders per hour",
              "Dispatches, and those whose pick the aging or swap-affinity term changed, as hourly rates.",
              [Series("dispatches", overview.dispatches_per_h)]
              + [Series(f"reordered by {term}", values, dashed=True) for term, values in overview.reorders_per_h.items()],
              unit="/h"),
        chart("Model loads", "Dispatches that had to start their model (a swap), per model.",
              [Series(model, counts) for model, counts in overview.loads.items()], stacked_bars=True),
        chart("GPU busy share",
              "Job time in each bucket ÷ the bucket's length, per model: 100% is one job running all the time "
              "(a model with more slots can pass it).",
              [Series(model, [share * 100 for share in shares]) for model, shares in overview.busy_share.items()],
              unit="%"),
    ]
