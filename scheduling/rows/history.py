"""Browsing the request history in the admin without reading the whole table.

The history grows by a row per request, so the admin's defaults that are fine
for small tables (a full COUNT per page, SELECT DISTINCT over every row for the
date drill-down, LIKE searches) turn into seconds per page at a million rows.
Everything here answers the same questions through the table's indexes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.functional import cached_property

from scheduling.whole_numbers import whole_number


def _start_of(moment: datetime, kind: str) -> datetime:
    if kind == "year":
        return moment.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    if kind == "month":
        return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def _next_start(start: datetime, kind: str) -> datetime:
    if kind == "year":
        return start.replace(year=start.year + 1)
    if kind == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return start + timedelta(days=1)  # wall-clock arithmetic: the next local midnight, DST or not


class HistoryQuerySet(QuerySet):
    """Request rows whose date drill-down (`datetimes` on `arrived_at`) seeks the index once per period.

    The default runs a per-row truncation function over every matching row;
    this finds the first row, then the first row of the next period, and so on.
    """

    def datetimes(self, field_name, kind, order="ASC", tzinfo=None):
        if field_name != "arrived_at" or kind not in ("year", "month", "day") or order != "ASC":
            return super().datetimes(field_name, kind, order, tzinfo)
        zone = tzinfo or timezone.get_current_timezone()
        arrivals = self.order_by("arrived_at").values_list("arrived_at", flat=True)
        periods = []
        arrival = arrivals.first()
        while arrival is not None:
            start = _start_of(arrival.astimezone(zone), kind)
            periods.append(start)
            arrival = arrivals.filter(arrived_at__gte=_next_start(start, kind)).first()
        return periods


def search_requests(queryset: QuerySet, term: str) -> QuerySet:
    """An exact request id, or the start of a model name (any case).

    The admin's own `=id` / `^model` search would run LIKE over every row.
    Here the prefix is matched against the few distinct model names (read from
    the model index), so the rows are found by equality, in index order.
    """
    term = term.strip()
    if not term:
        return queryset
    names = queryset.model.objects.order_by("model").values_list("model", flat=True).distinct()
    by_model = Q(model__in=[name for name in names if name.lower().startswith(term.lower())])
    ticket_id = whole_number(term)
    return queryset.filter(by_model if ticket_id is None else Q(pk=ticket_id) | by_model)


class CappedCountPaginator(Paginator):
    """Counts matching rows only up to `cap`, so a page never costs a COUNT over the whole table.

    Past the cap the page links stop; narrow the list with the filters, the
    date drill-down or a search instead.
    """

    cap = 10_000

    @cached_property
    def _bounded_count(self) -> int:
        return self.object_list[: self.cap + 1].count()

    @property
    def count(self) -> int:
        return min(self._bounded_count, self.cap)

    @property
    def is_capped(self) -> bool:
        return self._bounded_count > self.cap
