"""`/metrics` by API key: requests, tokens and queue wait under a bounded `key` label."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY

from scheduling import metrics
from scheduling.core import Band
from scheduling.events import Finished, Unserved


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_keys_requests_tokens_and_queue_wait_are_counted_under_its_name():
    before = (value("llamaswap_key_requests_total", key="chat-app", status="200"),
              value("llamaswap_key_requests_total", key="chat-app", status="429"),
              value("llamaswap_key_tokens_total", key="chat-app", direction="output"),
              value("llamaswap_key_queue_wait_seconds_count", key="chat-app"),
              value("llamaswap_key_queue_wait_seconds_bucket", key="chat-app", le="5.0"))
    metrics.record_event(Finished(model="alpha", route="chat", band=Band.NORMAL, state="completed", status=200,
                                  seconds=1.0, ttfb_s=0.1, usage={"input_tokens": 5, "output_tokens": 40},
                                  key="chat-app", queue_wait_s=3.0))
    metrics.record_event(Unserved("alpha", "chat", 429, key="chat-app"))
    after = (value("llamaswap_key_requests_total", key="chat-app", status="200"),
             value("llamaswap_key_requests_total", key="chat-app", status="429"),
             value("llamaswap_key_tokens_total", key="chat-app", direction="output"),
             value("llamaswap_key_queue_wait_seconds_count", key="chat-app"),
             value("llamaswap_key_queue_wait_seconds_bucket", key="chat-app", le="5.0"))
    assert [a - b for a, b in zip(after, before)] == [1, 1, 40, 1, 1]


def test_a_request_relayed_to_a_peer_has_no_queue_wait():
    before = value("llamaswap_key_queue_wait_seconds_count", key="peer-user")
    metrics.record_event(Finished(model="p/m", route="chat", band=Band.NORMAL, state="completed", status=200,
                                  seconds=1.0, ttfb_s=None, key="peer-user"))
    assert value("llamaswap_key_queue_wait_seconds_count", key="peer-user") == before
    assert value("llamaswap_key_requests_total", key="peer-user", status="200") >= 1


def test_no_row_key_is_config_or_none_and_names_past_the_limit_are_other():
    labels = metrics.KeyLabels(limit=2)
    assert labels.of("") == "none"
    labels.config_keys = True
    assert labels.of("") == "config"
    assert [labels.of(name) for name in ("a", "b", "c", "a", "b")] == ["a", "b", "other", "a", "b"]


def test_the_front_end_learns_whether_the_config_has_keys_on_each_export():
    config = SimpleNamespace(api_keys=("sk-1",), models={}, peers={})
    try:
        metrics.export_front_end(config)
        assert metrics.KEY_LABELS.of("") == "config"
        metrics.export_front_end(SimpleNamespace(api_keys=(), models={}, peers={}))
        assert metrics.KEY_LABELS.of("") == "none"
    finally:
        metrics.KEY_LABELS.config_keys = False


def test_a_keys_refusals_at_the_door_are_counted_under_its_name_and_status():
    before = value("llamaswap_key_refusals_total", key="door-refused", status="429")
    metrics.key_refused("door-refused", 429)
    metrics.key_refused("door-refused", 429)
    assert value("llamaswap_key_refusals_total", key="door-refused", status="429") == before + 2
