"""/metrics: scrape-time queue gauges, event counters, the API-key rule, and the Grafana dashboard's queries."""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import parse_config
from proxy.serving.inbound import route_label
from scheduling.door import frontdoor
from scheduling import metrics
from scheduling.core import Band, Decision, SchedulerSnapshot, ScoreTerms, SerialSettings
from scheduling.events import Dispatched, Finished, ModelLoaded, Unserved

REPO = Path(__file__).resolve().parent.parent
BANDS = ("interactive", "normal", "batch")


class FakeRuntime:
    """Holds a published snapshot the way SchedulerRuntime does; the live oldest wait keeps growing after it."""

    def __init__(
        self,
        depth: dict[Band, int],
        oldest_now: dict[Band, float],
        running: dict[str, tuple[int, ...]] | None = None,
        slots: dict[str, int] | None = None,
    ):
        snapshot = SchedulerSnapshot(
            depth_by_band={band: depth.get(band, 0) for band in Band},
            oldest_wait_by_band={band: 0.0 for band in Band},
            running_tickets=(1,),
            loaded=("alpha",),
            starting=(),
            waiting=sum(depth.values()),
            settings=SerialSettings(),
            running=running or {},
            slots=slots or {},
        )
        self.snapshot = (100.0, snapshot)
        self._oldest_now = oldest_now

    def oldest_wait_by_band(self) -> dict[Band, float]:
        return {band: self._oldest_now.get(band, 0.0) for band in Band}

    @property
    def scheduler(self):
        return self  # placement(): no hardware described

    def placement(self) -> None:
        return None

    @property
    def operators(self):
        return self  # from_thread()

    def from_thread(self, fn, *args):
        return fn(*args)


class FakeFleet:
    def __init__(self, states: dict[str, str]):
        self.states = states

    def state(self, model: str) -> str:
        return self.states[model]


def series_names(text: str) -> set[str]:
    """The sample names a scrape declares, including those of families that have no samples yet."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in suffixes.get(family.type, ("",))
    }


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, keyed by (sample name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(name: str, **labels: str) -> float:
    """A sample of the process registry (0 when the series does not exist yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def decision(band: Band, *, aging: bool = False, affinity: bool = False, wait: float = 1.0) -> Decision:
    priority = {Band.INTERACTIVE: 100, Band.NORMAL: 0, Band.BATCH: -100}[band]
    return Decision(
        ticket_id=7, model="alpha", scheduler="serial", priority=priority, band=band, score=float(priority),
        terms=ScoreTerms(priority, 0, 0.0), queue_wait_s=wait, runner_up_id=None, runner_up_score=None,
        changed_by_aging=aging, changed_by_affinity=affinity, needs_swap=False, fifo_priority=None,
    )


def config(text: str):
    return parse_config(textwrap.dedent(text), "config.yaml")


KEYED = """
    apiKeys: [s3cret]
    metricsRequireApiKey: true
    models:
      alpha:
        cmd: llama-server --port ${PORT}
"""


@pytest.fixture
def exported(monkeypatch):
    """Lets a test point /metrics at fakes; the process's export is put back afterwards."""
    export = metrics.EXPORT
    monkeypatch.setattr(export.scheduler, "runtime", export.scheduler.runtime)
    monkeypatch.setattr(export.model_states, "fleet", export.model_states.fleet)
    monkeypatch.setattr(export.model_states, "models", export.model_states.models)
    monkeypatch.setattr(export.model_slots, "runtime", export.model_slots.runtime)
    monkeypatch.setattr(export.model_slots, "models", export.model_slots.models)
    return export


def scrape(client, **headers) -> str:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return response.content.decode()


# -- scrape-time gauges ------------------------------------------------------------------------


def test_queue_gauges_report_every_band_from_the_snapshot_and_the_live_oldest_wait():
    runtime = FakeRuntime({Band.INTERACTIVE: 2, Band.BATCH: 1}, {Band.INTERACTIVE: 3.5, Band.BATCH: 42.0})
    registry = CollectorRegistry()
    registry.register(metrics.SchedulerCollector(runtime))
    got = samples(generate_latest(registry).decode())
    depth = {band: got[("llamaswap_scheduler_queue_depth", frozenset({("band", band)}))] for band in BANDS}
    oldest = {band: got[("llamaswap_scheduler_queue_oldest_wait_seconds", frozenset({("band", band)}))] for band in BANDS}
    assert depth == {"interactive": 2, "normal": 0, "batch": 1}
    assert oldest == {"interactive": 3.5, "normal": 0.0, "batch": 42.0}


def test_queue_gauges_show_all_bands_at_zero_before_a_runtime_exists():
    registry = CollectorRegistry()
    registry.register(metrics.SchedulerCollector())
    got = samples(generate_latest(registry).decode())
    for name in ("llamaswap_scheduler_queue_depth", "llamaswap_scheduler_queue_oldest_wait_seconds"):
        assert {band: got[(name, frozenset({("band", band)}))] for band in BANDS} == dict.fromkeys(BANDS, 0)


def test_queue_gauges_follow_each_newly_published_snapshot():
    collector = metrics.SchedulerCollector(FakeRuntime({Band.NORMAL: 3}, {Band.NORMAL: 1.0}))
    registry = CollectorRegistry()
    registry.register(collector)
    assert registry.get_sample_value("llamaswap_scheduler_queue_depth", {"band": "normal"}) == 3
    collector.runtime.snapshot = FakeRuntime({}, {}).snapshot
    assert registry.get_sample_value("llamaswap_scheduler_queue_depth", {"band": "normal"}) == 0


def test_model_state_is_one_on_the_current_state_and_zero_on_the_others():
    registry = CollectorRegistry()
    registry.register(metrics.ModelStateCollector(FakeFleet({"alpha": "ready", "beta": "stopping"}), ["alpha", "beta"]))
    got = samples(generate_latest(registry).decode())
    states = {
        (dict(labels)["model"], dict(labels)["state"]): v
        for (name, labels), v in got.items()
        if name == "llamaswap_model_state"
    }
    assert {key for key, v in states.items() if v == 1} == {("alpha", "ready"), ("beta", "stopping")}
    assert len(states) == 8  # every model has all four states, so a dashboard never loses a series


# -- counters and histograms from runtime events -----------------------------------------------


def test_model_slots_report_busy_and_configured_slots_of_every_model_from_the_snapshot():
    runtime = FakeRuntime({}, {}, running={"chat": (4, 9), "embed": (5,)}, slots={"chat": 2, "embed": 1, "idle": 3})
    collector = metrics.ModelSlotsCollector(runtime, ["chat", "embed", "idle"])
    registry = CollectorRegistry()
    registry.register(collector)
    in_use = {m: registry.get_sample_value("llamaswap_model_slots_in_use", {"model": m}) for m in ("chat", "embed", "idle")}
    slots = {m: registry.get_sample_value("llamaswap_model_slots", {"model": m}) for m in ("chat", "embed", "idle")}
    assert in_use == {"chat": 2, "embed": 1, "idle": 0}
    assert slots == {"chat": 2, "embed": 1, "idle": 3}
    collector.runtime = FakeRuntime({}, {}, running={}, slots={"chat": 2})
    assert registry.get_sample_value("llamaswap_model_slots_in_use", {"model": "chat"}) == 0


def test_model_slots_have_no_configured_value_under_fifo_and_nothing_before_a_runtime_exists():
    registry = CollectorRegistry()
    collector = metrics.ModelSlotsCollector(None, ["chat"])
    registry.register(collector)
    assert registry.get_sample_value("llamaswap_model_slots_in_use", {"model": "chat"}) is None
    collector.runtime = FakeRuntime({}, {}, running={"chat": (1, 2, 3)})
    assert registry.get_sample_value("llamaswap_model_slots_in_use", {"model": "chat"}) == 3
    assert registry.get_sample_value("llamaswap_model_slots", {"model": "chat"}) is None


def test_dispatch_counts_the_band_its_queue_wait_and_each_term_that_changed_the_pick():
    before = {
        "dispatched": value("llamaswap_scheduler_dispatched_total", band="batch"),
        "aging": value("llamaswap_scheduler_reorders_total", band="batch", term="aging"),
        "affinity": value("llamaswap_scheduler_reorders_total", band="batch", term="swap_affinity"),
        "waits": value("llamaswap_scheduler_queue_wait_seconds_count", band="batch"),
        "under_5s": value("llamaswap_scheduler_queue_wait_seconds_bucket", band="batch", le="5.0"),
    }
    metrics.record_event(Dispatched(decision(Band.BATCH, aging=True, affinity=True, wait=4.0)))
    metrics.record_event(Dispatched(decision(Band.BATCH, aging=True, wait=20.0)))
    metrics.record_event(Dispatched(decision(Band.BATCH, wait=0.01)))
    assert value("llamaswap_scheduler_dispatched_total", band="batch") - before["dispatched"] == 3
    assert value("llamaswap_scheduler_reorders_total", band="batch", term="aging") - before["aging"] == 2
    assert value("llamaswap_scheduler_reorders_total", band="batch", term="swap_affinity") - before["affinity"] == 1
    assert value("llamaswap_scheduler_queue_wait_seconds_count", band="batch") - before["waits"] == 3
    assert value("llamaswap_scheduler_queue_wait_seconds_bucket", band="batch", le="5.0") - before["under_5s"] == 2


def test_finished_request_counts_route_status_durations_and_tokens():
    labels = {"model": "gamma", "route": "/v1/chat/completions", "status": "200"}
    before = value("llamaswap_requests_total", **labels)
    tokens_in = value("llamaswap_tokens_total", model="gamma", direction="input")
    tokens_out = value("llamaswap_tokens_total", model="gamma", direction="output")
    metrics.record_event(Finished(
        model="gamma", route="/v1/chat/completions", band=Band.NORMAL, state="completed",
        status=200, seconds=2.0, ttfb_s=0.3, usage={"input_tokens": 12, "output_tokens": 40},
    ))
    assert value("llamaswap_requests_total", **labels) - before == 1
    assert value("llamaswap_tokens_total", model="gamma", direction="input") - tokens_in == 12
    assert value("llamaswap_tokens_total", model="gamma", direction="output") - tokens_out == 40
    assert value("llamaswap_request_duration_seconds_bucket", model="gamma", le="2.5") >= 1
    assert value("llamaswap_request_first_byte_seconds_bucket", model="gamma", le="0.5") >= 1


def test_a_client_that_left_counts_as_499_and_sent_no_first_byte():
    labels = {"model": "delta", "route": "/upstream", "status": "499"}
    before = value("llamaswap_requests_total", **labels)
    first_bytes = value("llamaswap_request_first_byte_seconds_count", model="delta")
    metrics.record_event(Finished(
        model="delta", route="/upstream", band=Band.NORMAL, state="cancelled", status=None, seconds=0.5, ttfb_s=None,
    ))
    assert value("llamaswap_requests_total", **labels) - before == 1
    assert value("llamaswap_request_first_byte_seconds_count", model="delta") == first_bytes


def test_rejected_and_cancelled_requests_are_counted_by_route_and_status():
    rejected = {"model": "alpha", "route": "/v1/chat/completions", "status": "429"}
    cancelled = {"model": "alpha", "route": "/v1/embeddings", "status": "499"}
    by_operator = {"model": "alpha", "route": "/v1/embeddings", "status": "503"}
    series = (rejected, cancelled, by_operator)
    before = [value("llamaswap_requests_total", **labels) for labels in series]
    metrics.record_event(Unserved("alpha", "/v1/chat/completions", 429))
    metrics.record_event(Unserved("alpha", "/v1/embeddings", 499, cancelled=True))
    metrics.record_event(Unserved("alpha", "/v1/embeddings", 503, cancelled=True))
    after = [value("llamaswap_requests_total", **labels) for labels in series]
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1]


def test_a_model_swap_counts_a_load_and_its_duration():
    loads = value("llamaswap_model_loads_total", model="epsilon")
    total = value("llamaswap_model_load_seconds_sum", model="epsilon")
    metrics.record_event(ModelLoaded("epsilon", 7.5))
    assert value("llamaswap_model_loads_total", model="epsilon") - loads == 1
    assert value("llamaswap_model_load_seconds_sum", model="epsilon") - total == pytest.approx(7.5)


def test_a_malformed_event_is_logged_and_never_raised_into_the_scheduler(caplog):
    with caplog.at_level(logging.ERROR, logger="llamaswap.metrics"):
        metrics.record_event(Dispatched(None))
    assert "could not record the Dispatched scheduler event" in caplog.text


def test_route_labels_stay_within_the_fixed_route_list():
    assert route_label("/v1/embeddings") == "/v1/embeddings"
    assert route_label("/upstream/org/model-7b/v1/chat/completions") == "/upstream"
    assert route_label("(preload)") == "other"
    assert route_label("/v1/chat/completions/../../etc") == "other"


# -- the /metrics view ---------------------------------------------------------------------------


def test_metrics_page_parses_and_has_scheduler_series_for_every_band_plus_django_metrics(client):
    got = samples(scrape(client))
    for band in BANDS:
        assert ("llamaswap_scheduler_queue_depth", frozenset({("band", band)})) in got
        assert ("llamaswap_scheduler_dispatched_total", frozenset({("band", band)})) in got
        for term in ("aging", "swap_affinity"):
            assert ("llamaswap_scheduler_reorders_total", frozenset({("band", band), ("term", term)})) in got
    assert any(name.startswith("django_http_") for name, _ in got)


def test_exporting_a_service_shows_its_runtime_fleet_and_zeroed_per_model_series(client, exported):
    served = config("""
        models:
          zeta:
            cmd: llama-server --port ${PORT}
    """)
    runtime = FakeRuntime({Band.INTERACTIVE: 1}, {Band.INTERACTIVE: 2.0})
    metrics.export_service(runtime, FakeFleet({"zeta": "starting"}), served)
    got = samples(scrape(client))
    assert got[("llamaswap_scheduler_queue_depth", frozenset({("band", "interactive")}))] == 1
    assert got[("llamaswap_model_state", frozenset({("model", "zeta"), ("state", "starting")}))] == 1
    assert got[("llamaswap_model_loads_total", frozenset({("model", "zeta")}))] == 0
    assert got[("llamaswap_model_slots_in_use", frozenset({("model", "zeta")}))] == 0
    for direction in ("input", "output"):
        assert got[("llamaswap_tokens_total", frozenset({("model", "zeta"), ("direction", direction)}))] == 0


def serving(monkeypatch, served_config, *, runs_scheduler: bool = True) -> None:
    """As if this process served `served_config` (None: as if it served nothing); a front end of
    distributed mode when not `runs_scheduler`, exporting only the front end's series."""
    door = None if served_config is None else SimpleNamespace(config=served_config)
    monkeypatch.setattr(frontdoor, "_installed", door)
    monkeypatch.setattr(metrics.EXPORT, "only", None if runs_scheduler else metrics.FRONT_END)


def test_metrics_require_an_api_key_when_configured(client, monkeypatch):
    serving(monkeypatch, config(KEYED))
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert "metricsRequireApiKey" in refused.json()["error"]["message"]
    assert refused["WWW-Authenticate"].startswith("Basic")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    basic = base64.b64encode(b"user:s3cret").decode()
    accepted = ({"HTTP_AUTHORIZATION": "Bearer s3cret"}, {"HTTP_X_API_KEY": "s3cret"}, {"HTTP_AUTHORIZATION": f"Basic {basic}"})
    for headers in accepted:
        assert "llamaswap_scheduler_queue_depth" in scrape(client, **headers)


def test_metrics_stay_open_when_keys_are_set_but_the_flag_is_off(client, monkeypatch):
    serving(monkeypatch, config(KEYED.replace("metricsRequireApiKey: true", "metricsRequireApiKey: false")))
    assert "llamaswap_scheduler_queue_depth" in scrape(client)


def test_the_key_rule_applies_before_the_service_is_built(client, monkeypatch, settings, tmp_path):
    serving(monkeypatch, None)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(KEYED))
    settings.LLAMASWAP_CONFIG = str(path)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_X_API_KEY="s3cret").status_code == 200


def test_metrics_output_passes_promtool(client, exported):
    served = config("""
        models:
          alpha:
            cmd: llama-server --port ${PORT}
    """)
    runtime = FakeRuntime({Band.BATCH: 2}, {Band.BATCH: 9.0}, running={"alpha": (3,)}, slots={"alpha": 2})
    metrics.export_service(runtime, FakeFleet({"alpha": "ready"}), served)
    metrics.record_event(Dispatched(decision(Band.NORMAL, affinity=True)))
    metrics.record_event(ModelLoaded("alpha", 3.0))
    metrics.record_event(Finished(
        model="alpha", route="/v1/completions", band=Band.NORMAL, state="completed",
        status=200, seconds=1.0, ttfb_s=0.1, usage={"input_tokens": 3, "output_tokens": 5},
    ))
    text = scrape(client)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package 'prometheus'); .ci/run installs it")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# -- distributed mode: each series exported once ----------------------------------------------------

SCHEDULER_NAMES = {
    "llamaswap_scheduler_queue_depth", "llamaswap_scheduler_queue_oldest_wait_seconds",
    "llamaswap_scheduler_dispatched_total", "llamaswap_scheduler_reorders_total",
    "llamaswap_scheduler_queue_wait_seconds_count", "llamaswap_model_state", "llamaswap_model_slots_in_use",
    "llamaswap_model_slots", "llamaswap_model_loads_total", "llamaswap_model_load_seconds_count",
    "llamaswap_evictions_total",
}
REQUEST_NAMES = {
    "llamaswap_requests_total", "llamaswap_request_duration_seconds_count",
    "llamaswap_request_first_byte_seconds_count", "llamaswap_tokens_total",
}


def llamaswap_names(registry) -> set[str]:
    return {name for name in series_names(generate_latest(registry).decode()) if name.startswith("llamaswap_")}


def test_front_ends_export_the_request_series_and_the_worker_the_schedulers_each_once():
    front_end, worker = llamaswap_names(metrics.FRONT_END), llamaswap_names(metrics.WORKER)
    assert REQUEST_NAMES <= front_end and not front_end & SCHEDULER_NAMES
    assert SCHEDULER_NAMES <= worker and not worker & REQUEST_NAMES
    assert front_end | worker == llamaswap_names(REGISTRY), "every series has an exporter"
    assert not front_end & worker, "summed over every target, no series counts twice"


def test_a_front_ends_metrics_page_has_its_requests_and_no_queue(client, monkeypatch):
    served = config("""
        models:
          eta:
            cmd: llama-server --port ${PORT}
    """)
    serving(monkeypatch, served, runs_scheduler=False)
    metrics.export_front_end(served)
    got = samples(scrape(client))
    assert got[("llamaswap_tokens_total", frozenset({("model", "eta"), ("direction", "output")}))] == 0
    assert not {name for name, _ in got} & SCHEDULER_NAMES
    assert any(name.startswith("django_http_") for name, _ in got)


def test_a_peers_models_have_their_request_series_from_the_start(client, monkeypatch):
    served = config("""
        models:
          eta:
            cmd: llama-server --port ${PORT}
        peers:
          box: {proxy: "http://127.0.0.1:1", models: [m1]}
    """)
    serving(monkeypatch, served, runs_scheduler=False)
    metrics.export_front_end(served)
    got = samples(scrape(client))
    assert got[("llamaswap_tokens_total", frozenset({("model", "box/m1"), ("direction", "output")}))] == 0


# -- the Grafana dashboard -----------------------------------------------------------------------


def test_dashboard_queries_only_metrics_that_metrics_exports(client):
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exported_names = series_names(scrape(client))
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\bllamaswap_[a-z_]+", target["expr"])
    }
    assert queried, "the dashboard has no llamaswap queries"
    assert queried - exported_names == set()
    required = {
        "llamaswap_scheduler_queue_depth", "llamaswap_scheduler_queue_oldest_wait_seconds",
        "llamaswap_scheduler_dispatched_total", "llamaswap_scheduler_reorders_total",
        "llamaswap_model_loads_total", "llamaswap_scheduler_queue_wait_seconds_bucket",
        "llamaswap_requests_total", "llamaswap_tokens_total",
    }
    assert required <= queried
