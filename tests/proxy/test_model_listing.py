"""The capability fields of /v1/models (and of the dashboard's modelStatus), in llama-swap's shapes."""

from __future__ import annotations

import pytest

from proxy.config import parse_config
from proxy.config.capabilities import ModelCapabilities
from proxy.api.events_stream import model_status
from proxy.api.model_listing import capability_fields


@pytest.mark.parametrize("caps, flags", [
    (ModelCapabilities(("audio",), ("text",)), {"audio_transcriptions": True}),
    (ModelCapabilities(("text",), ("audio",)), {"audio_speech": True}),
    (ModelCapabilities(("text", "image"), ("image",)), {"vision": True, "image_generation": True, "image_to_image": True}),
    (ModelCapabilities(reranker=True), {"reranker": True}),
    (ModelCapabilities(("text",), ("text",)), None),  # nothing to flag: no capabilities map at all
])
def test_modalities_turn_into_llama_swap_capability_flags(caps, flags):
    assert capability_fields(caps).get("capabilities") == flags


def test_only_what_is_declared_is_rendered():
    assert capability_fields(ModelCapabilities()) == {}
    assert capability_fields(ModelCapabilities(inputs=("text",))) == {"architecture": {"input_modalities": ["text"]}}
    assert capability_fields(ModelCapabilities(context=4096)) == {"context_length": 4096}


def test_the_dashboard_model_status_carries_the_same_flags():
    config = parse_config("""
models:
  a: {cmd: run, proxy: "http://h:1", capabilities: {in: [image], out: [text], tools: true}}
  b: {cmd: run, proxy: "http://h:2"}
""")
    status = {entry["id"]: entry for entry in model_status(config, {})}
    assert status["a"]["capabilities"] == {"vision": True, "function_calling": True}
    assert "capabilities" not in status["b"]
