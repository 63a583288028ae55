"""Where the added model routes go upstream, which methods they take, their metrics labels, and the
CORS preflight's echo of requested headers."""

import pytest

from proxy.http.cors import DEFAULT_ALLOWED_HEADERS, allowed_headers
from proxy.serving.inbound import MODEL_ROUTES, route_label
from proxy.serving.route_paths import route_methods, upstream_path


@pytest.mark.parametrize("path, upstream", [
    ("/v/chat/completions", "/chat/completions"),
    ("/v/audio/transcriptions", "/audio/transcriptions"),
    ("/audioapi/v1/tasks/run", "/v1/tasks/run"),
    ("/v1/chat/completions", "/v1/chat/completions"),
    ("/sdapi/v1/txt2img", "/sdapi/v1/txt2img"),
])
def test_upstream_paths(path, upstream):
    assert upstream_path(path) == upstream


@pytest.mark.parametrize("path, methods", [
    ("/props", ("GET",)), ("/sdapi/v1/loras", ("GET",)), ("/v1/audio/voices", ("GET", "POST")),
    ("/v/audio/voices", ("GET", "POST")), ("/v1/chat/completions", ("POST",)), ("/sdapi/v1/img2img", ("POST",)),
])
def test_route_methods(path, methods):
    assert route_methods(path) == methods


def test_every_v1_model_route_has_a_versionless_alias():
    for route in MODEL_ROUTES:
        if route.startswith("/v1/"):
            assert "/v/" + route[len("/v1/"):] in MODEL_ROUTES


@pytest.mark.parametrize("path, label", [
    ("/v/chat/completions", "/v/chat/completions"),
    ("/audioapi/v1/tasks/run", "/audioapi/v1/tasks/run"),
    ("/comfyui/api/queue/12345", "/comfyui"),
    ("/v/anything/else", "other"),
    ("/comfyuix", "other"),
])
def test_new_routes_keep_metrics_labels_bounded(path, label):
    assert route_label(path) == label


def test_requested_headers_are_echoed_only_when_well_formed():
    assert allowed_headers("Content-Type, X-Bad Header , x-api-key,  ,a\"b") == b"Content-Type, x-api-key"
    assert allowed_headers("") == DEFAULT_ALLOWED_HEADERS
    assert allowed_headers("bad header") == DEFAULT_ALLOWED_HEADERS
