"""llama-swap's remaining routes through `llamaswap serve`: versionless /v/ aliases, the query-model GET
routes, stable-diffusion and audio.cpp routes, /comfyui/, CORS, / and /wol-health."""

from __future__ import annotations

import httpx
import pytest

from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-routes-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    events = tmp / "events.jsonl"
    text = f"""
        apiKeys: ["{KEY}"]
        models:
          m:
            cmd: {fake_cmd("m", events, "--tps", "0")}
            aliases: [m-alias]
          comfyui_auto:
            cmd: {fake_cmd("comfy", events, "--tps", "0")}
    """
    with Served(tmp, text) as s:
        s.events = events
        yield s


def state(served, model: str) -> str:
    running = httpx.get(served.base + "/running", headers=AUTH).json()["running"]
    return next((m["state"] for m in running if m["model"] == model), "stopped")


@pytest.mark.parametrize("path, upstream", [
    ("/v/chat/completions", "/chat/completions"),
    ("/v/completions", "/completions"),
    ("/v/embeddings", "/embeddings"),
    ("/v/rerank", "/rerank"),
    ("/v/messages", "/messages"),
    ("/v/responses", "/responses"),
    ("/v1/audio/voices", "/v1/audio/voices"),
    ("/sdapi/v1/txt2img", "/sdapi/v1/txt2img"),
    ("/sdapi/v1/img2img", "/sdapi/v1/img2img"),
    ("/audioapi/v1/tasks/run", "/v1/tasks/run"),
])
def test_post_routes_reach_the_model_with_their_upstream_path(served, path, upstream):
    r = httpx.post(served.base + path + "?trace=1", json={"model": "m-alias", "input": "x"}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    echo = r.json()
    assert (echo["path"], echo["method"], echo["served_by"]) == (upstream + "?trace=1", "POST", "m")


def test_a_versionless_multipart_route_drops_the_v(served):
    r = httpx.post(served.base + "/v/audio/transcriptions", data={"model": "m"}, files={"file": ("a.wav", b"RIFF")},
                   headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    assert [e["path"] for e in read_events(served.events) if e["event"] == "start"][-1] == "/audio/transcriptions"


@pytest.mark.parametrize("path", ["/props", "/v1/audio/voices", "/sdapi/v1/loras", "/v/audio/voices"])
def test_get_routes_take_the_model_from_the_query(served, path):
    r = httpx.get(served.base + path, params={"model": "m-alias"}, headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    echo = r.json()
    forwarded = path.replace("/v/", "/", 1) if path.startswith("/v/") else path
    assert (echo["path"], echo["method"], echo["served_by"]) == (f"{forwarded}?model=m-alias", "GET", "m")


def test_a_get_route_without_a_model_is_400_and_post_only_routes_refuse_get(served):
    r = httpx.get(served.base + "/props", headers=AUTH)
    assert r.status_code == 400 and "?model=" in r.json()["error"]["message"]
    r = httpx.post(served.base + "/props", json={"model": "m"}, headers=AUTH)
    assert (r.status_code, r.headers["allow"]) == (405, "GET")
    r = httpx.get(served.base + "/sdapi/v1/txt2img", params={"model": "m"}, headers=AUTH)
    assert (r.status_code, r.headers["allow"]) == (405, "POST")
    r = httpx.get(served.base + "/props", params={"model": "m"})
    assert r.status_code == 401


def test_comfyui_starts_only_at_its_root_and_drops_its_prefix(served):
    assert httpx.post(served.base + "/api/models/unload/comfyui_auto", headers=AUTH, timeout=30).status_code == 200
    wait_until(lambda: state(served, "comfyui_auto") == "stopped", 30, what="comfyui_auto to stop")
    r = httpx.get(served.base + "/comfyui/queue", headers=AUTH)
    assert r.status_code == 409 and "only /comfyui/ starts it" in r.json()["error"]["message"]
    assert state(served, "comfyui_auto") == "stopped"

    r = httpx.get(served.base + "/comfyui/", headers=AUTH, timeout=30)
    assert (r.status_code, r.json()["path"], r.json()["served_by"]) == (200, "/", "comfy")
    r = httpx.post(served.base + "/comfyui/api/prompt?x=1", json={"prompt": {}}, headers=AUTH)
    assert (r.status_code, r.json()["path"], r.json()["method"]) == (200, "/api/prompt?x=1", "POST")


def test_a_bare_comfyui_redirects_to_its_root(served):
    r = httpx.get(served.base + "/comfyui?a=b", headers=AUTH)
    assert (r.status_code, r.headers["location"]) == (301, "/comfyui/?a=b")
    r = httpx.post(served.base + "/comfyui", headers=AUTH)
    assert (r.status_code, r.headers["location"]) == (308, "/comfyui/")


def test_comfyui_without_its_model_is_a_clear_404(tmp_path):
    with Served(tmp_path, f"models:\n  m:\n    cmd: {fake_cmd('m')}\n") as other:
        r = httpx.get(other.base + "/comfyui/")
    assert r.status_code == 404
    assert "comfyui_auto" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/upstream/m/anything", "/props", "/admin/"])
def test_an_options_preflight_is_answered_everywhere_without_a_key(served, path):
    starts = len(read_events(served.events))
    r = httpx.options(served.base + path, headers={
        "Origin": "http://chat.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Content-Type, X-Bad Header, x-api-key, bad\"name",
    })
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-allow-methods"] == "GET, POST, PUT, PATCH, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "Content-Type, x-api-key"
    assert len(read_events(served.events)) == starts  # never reaches a model


def test_a_preflight_without_requested_headers_gets_the_default_list(served):
    r = httpx.options(served.base + "/v1/chat/completions")
    assert r.status_code == 204
    assert r.headers["access-control-allow-headers"] == "Content-Type, Authorization, Accept, X-Requested-With"


def test_the_model_list_echoes_the_origin(served):
    r = httpx.get(served.base + "/v1/models", headers={**AUTH, "Origin": "http://chat.example:3000"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://chat.example:3000"
    assert "access-control-allow-origin" not in httpx.get(served.base + "/v1/models", headers=AUTH).headers


@pytest.mark.parametrize("accept", ["text/html,application/xhtml+xml", "*/*"])
def test_the_root_leads_to_the_admin(served, accept):
    r = httpx.get(served.base + "/", headers={"Accept": accept})
    assert (r.status_code, r.headers["location"]) == (302, "/admin/")


def test_wol_health_answers_without_a_key(served):
    r = httpx.get(served.base + "/wol-health")
    assert (r.status_code, r.text) == (200, "OK")
