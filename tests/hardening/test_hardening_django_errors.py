"""Django's own error paths answer in the same OpenAI JSON shape as the proxied routes."""

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/v1/models", "/admin/login/", "/no-such-route"])
def test_a_host_not_allowed_gets_a_json_400_naming_the_variable(client, path):
    r = client.get(path, HTTP_HOST="evil.example")
    assert r.status_code == 400
    assert r["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "host_not_allowed"
    message = r.json()["error"]["message"]
    assert "evil.example" in message and "LLAMASWAP_ALLOWED_HOSTS" in message


def test_health_answers_any_host(client):
    r = client.get("/health", HTTP_HOST="evil.example")
    assert r.status_code == 200 and r.content == b"OK"


@pytest.mark.parametrize("path", ["/metrics", "/api/activity"])
def test_wrong_methods_on_api_routes_get_a_json_405(client, monkeypatch, path):
    # No service here: one without API keys is all the key check (before the method check) reads.
    monkeypatch.setattr("proxy.api.views.get_service", lambda: SimpleNamespace(config=SimpleNamespace(api_keys=())))
    r = client.post(path)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in r["allow"]
