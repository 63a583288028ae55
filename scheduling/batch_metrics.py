"""Batch progress for /metrics: batches by status and the lines of unfinished batches by state, read from the
rows at scrape time (with `llamaswap_batch_lines_ended_total`, counted by each process's runner: see
`scheduling.metrics`).

The gauges are the database's figures, the same from every process that runs batches (each front end in
distributed mode): take their `max`, not their sum, across scrape targets."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from django.db import DatabaseError
from django.db.models import Count
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduling.metrics import BATCH_LINES_ENDED
from scheduling.models import Batch, BatchRequest
from scheduling.operating.batch_progress import LINE_STATES
from scheduling.rows.batch_status import ACTIVE, ENDED

log = logging.getLogger("llamaswap.metrics")

class BatchCollector(Collector):
    """The batch gauges, once this process runs batches (`export`)."""

    def __init__(self) -> None:
        self.enabled = False

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        if not self.enabled:
            return
        batches, lines = self._families()
        try:
            by_status = dict(Batch.objects.values_list("status").annotate(n=Count("id")).order_by())
            by_state = dict(BatchRequest.objects.filter(batch__status__in=ACTIVE).values_list("state")
                            .annotate(n=Count("id")).order_by())
        except DatabaseError as exc:  # a scrape during a database outage answers without them
            log.warning("batch metrics left out: the database did not answer: %s", exc)
            return
        for status in (*ACTIVE, *ENDED):
            batches.add_metric([status], by_status.get(status, 0))
        for state in LINE_STATES:
            lines.add_metric([state], by_state.get(state, 0))
        yield batches
        yield lines

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("llamaswap_batches", "Batches of the Batch API, by status.", labels=["status"]),
            GaugeMetricFamily("llamaswap_batch_lines", "Lines of the unfinished batches, by state.", labels=["state"]),
        )


COLLECTOR = BatchCollector()
REGISTRY.register(COLLECTOR)


def export() -> None:
    """This process runs batches: its /metrics reports them, the counter's series from 0."""
    COLLECTOR.enabled = True
    for outcome in ("succeeded", "failed"):
        BATCH_LINES_ENDED.labels(outcome)
