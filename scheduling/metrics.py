"""Prometheus metrics for /metrics: the scheduler queue, requests, model loads and tokens.

Queue gauges are computed at scrape time from the snapshot the runtime publishes
after every change, so no error path can leave a stale `set()` behind. /metrics is a
sync Django view running on a worker thread, so the collectors here only read
immutable snapshots and plain attributes; they never touch the event loop.
Counters and histograms are fed by the runtime's observer (`record_event`) on the
event-loop thread; prometheus_client makes those updates thread-safe.

Labels stay bounded: band, a fixed route list, configured model IDs, status codes, and API keys: a key
row's name (the operator's table), "config" (a config file apiKey) or "none" (an open server), at most
MAX_KEY_LABELS names per process, the rest as "other".

In distributed mode each series has one exporter, so summing it over every scrape target counts
each thing once: the worker exports the scheduler's series (queue, dispatches, models, slots) on
its own port, and each front end exports the requests it served (requests, durations, tokens).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduling.core import Band, ModelState, SchedulerSnapshot
from scheduling.events import Dispatched, Evicted, Finished, ModelLoaded, RuntimeEvent, Unserved
from scheduling.keys.scope import CONFIG_LABEL, OPEN_LABEL, OVERFLOW_LABEL
from scheduling.tickets import RequestState

log = logging.getLogger("llamaswap.metrics")

MIB = 1024 * 1024
BANDS = tuple(str(band) for band in Band)
REORDER_TERMS = ("aging", "swap_affinity")
MODEL_STATES = tuple(ModelState)
TOKEN_DIRECTIONS = ("input", "output")
# Requests that never reached a model (rejected, or cancelled while queued) carry no path in their event.
UNKNOWN = "unknown"

QUEUE_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
REQUEST_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
FIRST_BYTE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
MODEL_LOAD_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)

DISPATCHED = Counter(
    "llamaswap_scheduler_dispatched_total",
    "Requests dispatched to the GPU, by the band of their priority.",
    ["band"],
)
REORDERS = Counter(
    "llamaswap_scheduler_reorders_total",
    "Dispatches whose pick would have been a different request without this score term.",
    ["band", "term"],
)
QUEUE_WAIT = Histogram(
    "llamaswap_scheduler_queue_wait_seconds",
    "Time dispatched requests spent queued, from arrival to dispatch.",
    ["band"],
    buckets=QUEUE_WAIT_BUCKETS,
)
REQUESTS = Counter(
    "llamaswap_requests_total",
    "Model requests that reached the scheduler, by how they ended "
    "(status 499: the client left; route 'unknown': rejected or cancelled before dispatch).",
    ["model", "route", "status"],
)
REQUEST_DURATION = Histogram(
    "llamaswap_request_duration_seconds",
    "Time a dispatched request held the GPU, from dispatch to the end of its response.",
    ["model"],
    buckets=REQUEST_DURATION_BUCKETS,
)
FIRST_BYTE = Histogram(
    "llamaswap_request_first_byte_seconds",
    "Time from dispatch to the first response byte from the model server.",
    ["model"],
    buckets=FIRST_BYTE_BUCKETS,
)
MODEL_LOADS = Counter(
    "llamaswap_model_loads_total",
    "Model servers started and healthy (each one is a model swap).",
    ["model"],
)
MODEL_LOAD_SECONDS = Histogram(
    "llamaswap_model_load_seconds",
    "Time to swap a model in: stopping the evicted models, starting it, waiting until healthy.",
    ["model"],
    buckets=MODEL_LOAD_BUCKETS,
)
EVICTIONS = Counter(
    "llamaswap_evictions_total",
    "Models stopped so that another could start: for its memory (placement by hardware:) or by a swap group "
    "or the matrix.",
    ["reason"],
)
TOKENS = Counter(
    "llamaswap_tokens_total",
    "Tokens reported by the model server's usage, by direction (input: prompt, output: generated).",
    ["model", "direction"],
)
BATCH_LINES_ENDED = Counter(
    "llamaswap_batch_lines_ended_total",
    "Batch lines this process's batch runner ended, by outcome (failed: an error answer, or never sent because "
    "the batch was cancelled or expired).",
    ["outcome"],
)
KEY_REQUESTS = Counter(
    "llamaswap_key_requests_total",
    "Model requests that reached the scheduler, by the API key that sent them and how they ended.",
    ["key", "status"],
)
KEY_TOKENS = Counter(
    "llamaswap_key_tokens_total",
    "Tokens reported by the model server's usage, by the API key that sent the request and direction.",
    ["key", "direction"],
)
KEY_QUEUE_WAIT = Histogram(
    "llamaswap_key_queue_wait_seconds",
    "Time dispatched requests spent queued, by the API key that sent them (observed when they end).",
    ["key"],
    buckets=QUEUE_WAIT_BUCKETS,
)
KEY_REFUSALS = Counter(
    "llamaswap_key_refusals_total",
    "Requests of an API key refused before they reached the scheduler (403 outside its models or routes, 429 over "
    "its quota, 400 bad input …), by the key and the status.",
    ["key", "status"],
)
MAX_KEY_LABELS = 1000


class _Children:
    """A labelled metric's children by their label values, looked up once each.

    `metric.labels(...)` checks and converts its values and takes the metric's lock on every call; the
    runtime's observer makes about a dozen such calls a request, with values from small fixed sets (bands,
    configured models, routes, statuses, at most MAX_KEY_LABELS keys), so each child is kept here after
    its first lookup. prometheus_client keeps every child it made anyway, so this holds no more than it does.
    """

    __slots__ = ("metric", "children")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        try:
            return self.children[values]
        except KeyError:
            child = self.children[values] = self.metric.labels(*values)
            return child


_DISPATCHED = _Children(DISPATCHED)
_QUEUE_WAIT = _Children(QUEUE_WAIT)
_REORDERS = _Children(REORDERS)
_REQUESTS = _Children(REQUESTS)
_KEY_REQUESTS = _Children(KEY_REQUESTS)
_REQUEST_DURATION = _Children(REQUEST_DURATION)
_FIRST_BYTE = _Children(FIRST_BYTE)
_KEY_QUEUE_WAIT = _Children(KEY_QUEUE_WAIT)
_TOKENS = _Children(TOKENS)
_KEY_TOKENS = _Children(KEY_TOKENS)


@dataclass
class KeyLabels:
    """The `key` label of a request's key row name: "" is "config" when the config file has apiKeys (then
    every request without a row key showed one), else "none"; past `limit` names, "other"."""

    config_keys: bool = False
    limit: int = MAX_KEY_LABELS
    seen: set[str] = field(default_factory=set)

    def of(self, name: str) -> str:
        if not name:
            return CONFIG_LABEL if self.config_keys else OPEN_LABEL
        if name not in self.seen and len(self.seen) >= self.limit:
            return OVERFLOW_LABEL
        self.seen.add(name)
        return name


KEY_LABELS = KeyLabels()


def _create_band_series() -> None:
    """Every band (and term) exists at 0 from the start, so `rate()` sees the first dispatch."""
    for band in BANDS:
        DISPATCHED.labels(band)
        QUEUE_WAIT.labels(band)
        for term in REORDER_TERMS:
            REORDERS.labels(band, term)


_create_band_series()


class SnapshotSource(Protocol):
    """What the queue collector reads: the runtime's published snapshot."""

    snapshot: tuple[float, SchedulerSnapshot]

    def oldest_wait_by_band(self) -> Mapping[Band, float]: ...


class ModelStates(Protocol):
    """What the model-state collector reads: each model process's current state."""

    def state(self, model: str) -> str: ...


class SchedulerCollector(Collector):
    """Queue depth and oldest wait per band, read from the runtime's latest snapshot at scrape time."""

    def __init__(self, runtime: SnapshotSource | None = None) -> None:
        self.runtime = runtime

    def describe(self) -> Iterable[Metric]:
        return [self._depth_family(), self._oldest_wait_family()]

    def collect(self) -> Iterator[Metric]:
        depth_family, wait_family = self.describe()
        runtime = self.runtime
        if runtime is None:
            depth: Mapping[Band, int] = {}
            oldest: Mapping[Band, float] = {}
        else:
            depth = runtime.snapshot[1].depth_by_band
            oldest = runtime.oldest_wait_by_band()
        for band in Band:
            depth_family.add_metric([str(band)], depth.get(band, 0))
            wait_family.add_metric([str(band)], oldest.get(band, 0.0))
        yield depth_family
        yield wait_family

    @staticmethod
    def _depth_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llamaswap_scheduler_queue_depth", "Requests waiting for the GPU, by band.", labels=["band"]
        )

    @staticmethod
    def _oldest_wait_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llamaswap_scheduler_queue_oldest_wait_seconds",
            "How long the longest-waiting request of each band has waited (0 when none waits).",
            labels=["band"],
        )


class ModelStateCollector(Collector):
    """`llamaswap_model_state`: 1 on each model's current state, 0 on the others, read from the fleet."""

    def __init__(self, fleet: ModelStates | None = None, models: Iterable[str] = ()) -> None:
        self.fleet = fleet
        self.models = tuple(models)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        fleet = self.fleet
        if fleet is not None:
            for model in self.models:
                current = fleet.state(model)
                for state in dict.fromkeys((*MODEL_STATES, current)):
                    family.add_metric([model, state], 1.0 if state == current else 0.0)
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llamaswap_model_state",
            "1 for the state each model's server is in (stopped, starting, ready, stopping), else 0.",
            labels=["model", "state"],
        )


class ModelSlotsCollector(Collector):
    """Per model, the job slots busy now and those configured, from the runtime's latest snapshot.

    In use counts the requests granted to the model (one whose model is still starting
    included); configured slots exist only under the serial scheduler, which has them.
    """

    def __init__(self, runtime: SnapshotSource | None = None, models: Iterable[str] = ()) -> None:
        self.runtime = runtime
        self.models = tuple(models)

    def describe(self) -> Iterable[Metric]:
        return [self._in_use_family(), self._slots_family()]

    def collect(self) -> Iterator[Metric]:
        in_use, configured = self.describe()
        runtime = self.runtime
        if runtime is not None:
            snapshot = runtime.snapshot[1]
            for model in self.models:
                in_use.add_metric([model], len(snapshot.running.get(model, ())))
                if model in snapshot.slots:
                    configured.add_metric([model], snapshot.slots[model])
        yield in_use
        yield configured

    @staticmethod
    def _in_use_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llamaswap_model_slots_in_use", "Requests each model is serving now (its busy job slots).", labels=["model"]
        )

    @staticmethod
    def _slots_family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "llamaswap_model_slots",
            "Job slots configured for each model (routing.scheduler.settings.serial.slots; 1 unless set).",
            labels=["model"],
        )


class PlacementCollector(Collector):
    """Each GPU's memory, what the models on it declared and what they were measured to use (with `hardware:`
    described; measured where nvidia-smi exists), asked of the runtime at scrape time, by GPU id:
    `llamaswap_gpu_memory_capacity_bytes`, `_declared_bytes` and `_measured_bytes`, and each model's
    measured use by GPU, `llamaswap_model_gpu_memory_measured_bytes`. A figure not measured is left out."""

    def __init__(self, runtime=None) -> None:
        self.runtime = runtime

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        capacity, declared, measured, per_model = self._families()
        try:  # on the runtime's loop; a runtime whose loop has ended (a process shutting down) has none to show
            view = None if self.runtime is None else self.runtime.operators.from_thread(self.runtime.scheduler.placement)
        except (RuntimeError, TimeoutError):
            view = None
        for gpu in (view or {}).get("gpus", ()):
            capacity.add_metric([gpu["id"]], gpu["memory_mib"] * MIB)
            declared.add_metric([gpu["id"]], gpu["declared_mib"] * MIB)
            if gpu["measured_mib"] is not None:
                measured.add_metric([gpu["id"]], gpu["measured_mib"] * MIB)
        for model, placed in (view or {}).get("models", {}).items():
            for gpu, mib in (placed["measured_per_gpu_mib"] or {}).items():
                per_model.add_metric([model, gpu], mib * MIB)
        yield capacity
        yield declared
        yield measured
        yield per_model

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("llamaswap_gpu_memory_capacity_bytes", "Each described GPU's memory (hardware:).",
                              labels=["gpu"]),
            GaugeMetricFamily("llamaswap_gpu_memory_declared_bytes",
                              "What the models placed on each GPU declared they need there (memory:).", labels=["gpu"]),
            GaugeMetricFamily("llamaswap_gpu_memory_measured_bytes",
                              "What the models' processes use on each GPU, measured with nvidia-smi.", labels=["gpu"]),
            GaugeMetricFamily("llamaswap_model_gpu_memory_measured_bytes",
                              "What each model's processes use on each GPU, measured with nvidia-smi.",
                              labels=["model", "gpu"]),
        )


@dataclass
class Export:
    """What this process's /metrics reports on: the served runtime and fleet, and `only` these series
    when set (a front end of distributed mode, whose worker exports the scheduler's), else all."""

    scheduler: SchedulerCollector
    model_states: ModelStateCollector
    model_slots: ModelSlotsCollector
    placement: PlacementCollector
    only: CollectorRegistry | None = None


EXPORT = Export(SchedulerCollector(), ModelStateCollector(), ModelSlotsCollector(), PlacementCollector())
REGISTRY.register(EXPORT.scheduler)
REGISTRY.register(EXPORT.model_states)
REGISTRY.register(EXPORT.model_slots)
REGISTRY.register(EXPORT.placement)


def export_service(runtime: SnapshotSource, fleet: ModelStates, config) -> None:
    """Point /metrics at this service, and create every configured model's series at zero.

    Series that exist from the start let `rate()` and `increase()` see the first event.
    """
    EXPORT.only = None
    EXPORT.scheduler.runtime = runtime
    EXPORT.model_states.fleet = fleet
    EXPORT.model_states.models = tuple(config.models)
    EXPORT.model_slots.runtime = runtime
    EXPORT.model_slots.models = tuple(config.models)
    EXPORT.placement.runtime = runtime
    for reason in ("memory", "swap"):
        EVICTIONS.labels(reason)
    for model in config.models:
        MODEL_LOADS.labels(model)
        MODEL_LOAD_SECONDS.labels(model)
    export_front_end(config)


def export_front_end(config) -> None:
    """Create the per-model series of the requests this process serves at zero (see `export_service`),
    a peer's models (`<peer>/<model>`) included."""
    KEY_LABELS.config_keys = bool(config.api_keys)
    peer_models = [peer.qualified(model) for peer in config.peers.values() for model in peer.models]
    for model in [*config.models, *peer_models]:
        REQUEST_DURATION.labels(model)
        FIRST_BYTE.labels(model)
        for direction in TOKEN_DIRECTIONS:
            TOKENS.labels(model, direction)


class _Without:
    """The process's registry less some families: what one side of distributed mode exports."""

    def __init__(self, left_out: Iterable[Any]) -> None:
        self.names = frozenset(family.name for collector in left_out for family in collector.describe())

    def collect(self) -> Iterator[Metric]:
        for family in REGISTRY.collect():
            if family.name not in self.names:
                yield family


def _registry_without(*left_out: Any) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_Without(left_out))
    return registry


# What the scheduler observes, and what the process that served a request observes.
SCHEDULER_SERIES = (
    DISPATCHED, REORDERS, QUEUE_WAIT, MODEL_LOADS, MODEL_LOAD_SECONDS, EVICTIONS, EXPORT.scheduler,
    EXPORT.model_states, EXPORT.model_slots, EXPORT.placement,
)
REQUEST_SERIES = (REQUESTS, REQUEST_DURATION, FIRST_BYTE, TOKENS, BATCH_LINES_ENDED, KEY_REQUESTS, KEY_TOKENS,
                  KEY_QUEUE_WAIT, KEY_REFUSALS)
# A front end's /metrics: no queue or model series, which only the worker knows.
FRONT_END = _registry_without(*SCHEDULER_SERIES)
# A worker's metrics port (proxy.api.worker_metrics): no request series; each front end counts those it served.
WORKER = _registry_without(*REQUEST_SERIES)


def record_event(event: RuntimeEvent) -> None:
    """The runtime's observer: turn one scheduler event into counter and histogram updates.

    It runs inside the scheduler's critical path, so a metrics bug is logged, never raised.
    Queue depth and model state are not counted here: they are read at scrape time.
    """
    try:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(event)
    except Exception:
        log.exception("could not record the %s scheduler event in the metrics", type(event).__name__)


def _dispatched(event: Dispatched) -> None:
    decision = event.decision
    band = str(decision.band)
    _DISPATCHED(band).inc()
    _QUEUE_WAIT(band).observe(decision.queue_wait_s)
    if decision.changed_by_aging:
        _REORDERS(band, "aging").inc()
    if decision.changed_by_affinity:
        _REORDERS(band, "swap_affinity").inc()
    if decision.changed_by_fairness:
        _REORDERS(band, "fair_share").inc()


def _finished(event: Finished) -> None:
    model, key = event.model, KEY_LABELS.of(event.key)
    status = status_label(event.status, event.state)
    _REQUESTS(model, event.route, status).inc()
    _KEY_REQUESTS(key, status).inc()
    _REQUEST_DURATION(model).observe(event.seconds)
    if event.ttfb_s is not None:
        _FIRST_BYTE(model).observe(event.ttfb_s)
    if event.queue_wait_s is not None:
        _KEY_QUEUE_WAIT(key).observe(event.queue_wait_s)
    for direction in TOKEN_DIRECTIONS:
        count = event.usage.get(f"{direction}_tokens")
        if isinstance(count, int) and count > 0:
            _TOKENS(model, direction).inc(count)
            _KEY_TOKENS(key, direction).inc(count)


def _unserved(event: Unserved) -> None:
    """Answered by the scheduler with an error (429, failed start, shutdown) or cancelled while queued."""
    _REQUESTS(event.model or UNKNOWN, event.route, str(event.status)).inc()
    _KEY_REQUESTS(KEY_LABELS.of(event.key), str(event.status)).inc()


def key_refused(key: str, status: int) -> None:
    """A request of the row key `key` refused at the door, before it had a row."""
    KEY_REFUSALS.labels(KEY_LABELS.of(key), str(status)).inc()


def _evicted(event: Evicted) -> None:
    EVICTIONS.labels(event.reason).inc()


def _loaded(event: ModelLoaded) -> None:
    MODEL_LOADS.labels(event.model).inc()
    MODEL_LOAD_SECONDS.labels(event.model).observe(event.seconds)


_HANDLERS: dict[type, Callable[[Any], None]] = {
    Dispatched: _dispatched,
    Finished: _finished,
    Unserved: _unserved,
    ModelLoaded: _loaded,
    Evicted: _evicted,
}


def status_label(status: int | None, state: str) -> str:
    """The HTTP status sent; 499 (client closed the request) when the client left before one was."""
    if status is not None:
        return str(status)
    return "499" if state == RequestState.CANCELLED else state
