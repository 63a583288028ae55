"""The HTTP surface around the scheduler: API keys, /upstream, filters, limits, logs."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.served import Served, fake_cmd, read_events

pytestmark = pytest.mark.e2e

KEY = "sk-test-0123"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surface")
    events = tmp / "events.jsonl"
    text = f"""
        apiKeys: ["{KEY}"]
        maxRequestBodyBytes: 2048
        models:
          org/model-a:
            cmd: {fake_cmd("model-a", events, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
            aliases: [a]
            useModelName: upstream-name
            filters:
              stripParams: "temperature, top_p"
              setParams: {{seed: 42}}
          hidden:
            cmd: {fake_cmd("hidden", events, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
            unlisted: true
        routing:
          scheduler:
            use: serial
    """
    with Served(tmp, text) as s:
        s.events = events
        yield s


def auth(kind: str) -> dict[str, str]:
    if kind == "bearer":
        return {"Authorization": f"Bearer {KEY}"}
    if kind == "x-api-key":
        return {"x-api-key": KEY}
    return {"Authorization": "Basic " + base64.b64encode(f"anyone:{KEY}".encode()).decode()}


@pytest.mark.parametrize("kind", ["bearer", "x-api-key", "basic"])
def test_each_accepted_key_form_works_and_is_never_forwarded(served, kind):
    r = httpx.post(served.base + "/v1/chat/completions", json={"model": "a", "messages": []}, headers=auth(kind))
    assert r.status_code == 200
    last = [e for e in read_events(served.events) if e["event"] == "start"][-1]
    assert "authorization" not in last["headers"] and "x-api-key" not in last["headers"]


@pytest.mark.parametrize("path,method", [
    ("/v1/chat/completions", "POST"), ("/v1/models", "GET"), ("/running", "GET"), ("/logs", "GET"),
    ("/upstream/a/health", "GET"), ("/api/models/unload", "POST"),
])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": KEY + "x"}])
def test_missing_or_wrong_key_is_401_on_every_protected_route(served, path, method, headers):
    r = httpx.request(method, served.base + path, headers=headers, json={"model": "a"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"].startswith("Basic")


def test_health_needs_no_key(served):
    assert httpx.get(served.base + "/health").status_code == 200


def test_use_model_name_and_filters_rewrite_the_forwarded_body(served):
    body = {"model": "a", "messages": [], "temperature": 0.3, "top_p": 0.9, "seed": 1}
    r = httpx.post(served.base + "/v1/chat/completions", json=body, headers=auth("bearer"))
    assert r.status_code == 200
    last = [e for e in read_events(served.events) if e["event"] == "start"][-1]
    assert last["model"] == "upstream-name"
    assert int(last["headers"]["content-length"]) == len(b'{"model": "upstream-name", "messages": [], "seed": 42}')


def test_unlisted_models_are_hidden_but_routable(served):
    ids = [m["id"] for m in httpx.get(served.base + "/v1/models", headers=auth("bearer")).json()["data"]]
    assert ids == ["org/model-a"]
    r = httpx.post(served.base + "/v1/chat/completions", json={"model": "hidden", "messages": []}, headers=auth("bearer"))
    assert r.status_code == 200


def test_upstream_route_reaches_the_model_with_slashes_in_its_id(served):
    r = httpx.get(served.base + "/upstream/org/model-a/health", headers=auth("bearer"))
    assert r.status_code == 200
    r = httpx.post(served.base + "/upstream/a/custom/path?x=1", json={"k": 1}, headers=auth("bearer"))
    assert r.status_code == 200 and r.json()["path"].startswith("/custom/path")
    r = httpx.get(served.base + "/upstream/a", headers=auth("bearer"))
    assert r.status_code == 308 and r.headers["location"] == "/upstream/a/"
    r = httpx.get(served.base + "/upstream/nope/x", headers=auth("bearer"))
    assert r.status_code == 404


def test_upstream_route_takes_the_model_name_percent_encoded(served):
    for sent in ("org%2Fmodel-a", "org%2fmodel%2Da", "org/model%2Da"):
        r = httpx.post(served.base + f"/upstream/{sent}/custom/a%20b?x=1", json={"k": 1}, headers=auth("bearer"))
        assert r.status_code == 200, (sent, r.text)
        assert r.json()["path"].startswith("/custom/a%20b"), r.json()  # what follows the name goes as sent


def test_body_over_the_limit_is_413(served):
    r = httpx.post(served.base + "/v1/chat/completions", headers=auth("bearer"),
                   json={"model": "a", "messages": [{"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and "maxRequestBodyBytes" in r.json()["error"]["message"]


def test_wrong_method_and_unknown_route(served):
    r = httpx.get(served.base + "/v1/chat/completions", headers=auth("bearer"))
    assert r.status_code == 405
    r = httpx.post(served.base + "/v1/nothing-here", headers=auth("bearer"), json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"


def test_non_json_content_type_is_refused_clearly(served):
    r = httpx.post(served.base + "/v1/chat/completions", headers={**auth("bearer"), "content-type": "text/plain"},
                   content=b"model=a")
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_logs_show_model_output(served):
    httpx.post(served.base + "/v1/chat/completions", json={"model": "a", "messages": []}, headers=auth("bearer"))
    text = httpx.get(served.base + "/logs", headers=auth("bearer")).text
    assert "org/model-a" in text and "listening" in text
