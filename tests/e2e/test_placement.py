"""Memory placement end to end: two 24 GiB GPUs described in `hardware:`, models of 20 GiB each, fake model servers
that record the CUDA_VISIBLE_DEVICES they were started with. Memory alone decides what runs together (no groups):
two run at once, each on its own GPU; a third stops the one cheapest to lose, never a pinned one; and a request
whose only room is a pinned model's is refused at its maximum wait, naming the pin; leases; distributed mode."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def config(events, pinned: tuple[str, ...] = (), slow: str = "") -> str:
    """Models a, b and c of 20 GiB; `slow` takes a second more to load (a wrapper script sleeps first)."""
    def cmd(name: str) -> str:
        return f"sh -c 'sleep 1; exec {fake_cmd(name, events)}'" if name == slow else fake_cmd(name, events)
    models = "".join(f"""
          {name}:
            cmd: {cmd(name)}
            memory: 20GiB
            pinned: {str(name in pinned).lower()}""" for name in ("a", "b", "c"))
    return f"""
        healthCheckTimeout: 20
        hardware:
          gpus:
            - {{id: 0, memory: 24GiB}}
            - {{id: 1, memory: 24GiB}}
        models:{models}
    """


def ask(served, model: str, **headers) -> httpx.Response:
    return httpx.post(served.base + "/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def loaded(served) -> set[str]:
    """The models ready to serve (one still starting is not yet loaded)."""
    return {m["model"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"] if m["state"] == "ready"}


def devices(events) -> dict[str, list[str | None]]:
    """Each model's CUDA_VISIBLE_DEVICES, request by request, from the fake servers' start events."""
    seen: dict[str, list[str | None]] = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "start":
            seen.setdefault(event["model"], []).append(event.get("cuda_visible_devices"))
    return seen


def test_two_models_run_at_once_on_their_own_gpus_and_a_third_stops_the_one_cheaper_to_load_again(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slow="a")) as served:
        assert ask(served, "a").status_code == 200
        assert ask(served, "b").status_code == 200
        assert loaded(served) == {"a", "b"}  # no groups: llama-swap would have run one at a time
        assert devices(events) == {"a": ["0"], "b": ["1"]}
        shown = httpx.get(served.base + "/api/placement", timeout=10).json()
        assert shown["placed_by_memory"] and len(shown["boxes"]) == 1
        gpus = shown["boxes"][0]["gpus"]
        assert [(g["id"], g["memory_mib"], g["declared_mib"], g["models"]) for g in gpus] == [
            ("0", 24_576, 20_480, ["a"]), ("1", 24_576, 20_480, ["b"])]
        placed = shown["boxes"][0]["models"]
        assert placed["a"]["load_s"] > placed["b"]["load_s"] and placed["a"]["eviction_cost"] > placed["b"]["eviction_cost"]
        asked = httpx.get(served.base + "/api/placement/can-load/c", timeout=10).json()
        assert asked == {"model": "c", "fits_now": False, "loaded": False, "would_evict": ["b"], "blocked_by": [],
                         "gpus": ["1"], "placed_by_memory": True, "never_fits": None}
        asked = httpx.get(served.base + "/api/placement/can-load/a", timeout=10).json()
        assert (asked["loaded"], asked["fits_now"], asked["gpus"], asked["would_evict"]) == (True, True, ["0"], [])
        assert loaded(served) == {"a", "b"}  # asking changed nothing
        assert httpx.get(served.base + "/api/placement/can-load/nope", timeout=10).status_code == 404
        assert ask(served, "c").status_code == 200  # a takes over a second to load, b a fraction: b goes
        assert loaded(served) == {"a", "c"}
        assert devices(events)["c"] == ["1"]  # on the GPU b left
        metrics = httpx.get(served.base + "/metrics", timeout=10).text
        for line in ('llamaswap_gpu_memory_capacity_bytes{gpu="1"} 2.5769803776e+10',
                     'llamaswap_gpu_memory_declared_bytes{gpu="1"} 2.147483648e+10',
                     'llamaswap_evictions_total{reason="memory"} 1.0', 'llamaswap_evictions_total{reason="swap"} 0.0'):
            assert line in metrics, [m for m in metrics.splitlines() if m.startswith(line.split("{")[0])]


def test_a_pinned_model_is_never_the_one_stopped_and_a_request_only_it_could_make_room_for_waits(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, pinned=("a", "b"))) as served:
        assert ask(served, "a").status_code == 200
        assert ask(served, "b").status_code == 200
        refused = ask(served, "c", **{"X-LlamaSwap-Max-Wait": "1"})
        assert refused.status_code == 503, refused.text
        message = refused.json()["error"]["message"]
        assert re.search(r"model c has room only if [ab] \(pinned\) is stopped", message), message
        assert loaded(served) == {"a", "b"}
        assert "c" not in devices(events)
        asked = httpx.get(served.base + "/api/placement/can-load/c", timeout=10).json()
        assert (asked["fits_now"], asked["would_evict"], len(asked["blocked_by"])) == (False, [], 1), asked


def test_without_hardware_nothing_is_placed_and_can_load_says_so(tmp_path):
    events = tmp_path / "events.jsonl"
    text = f"""
        models:
          a:
            cmd: {fake_cmd("a", events)}
    """
    with Served(tmp_path, text) as served:
        assert httpx.get(served.base + "/api/placement", timeout=10).json() == {"placed_by_memory": False, "boxes": []}
        asked = httpx.get(served.base + "/api/placement/can-load/a", timeout=10).json()
        assert asked == {"model": "a", "fits_now": None, "would_evict": [], "blocked_by": [], "placed_by_memory": False}


def test_a_lease_loads_its_model_keeps_it_through_a_restart_and_its_revocation_frees_it(tmp_path):
    """a takes over a second to load, so it is the costlier to stop; leased, b is kept instead, across a
    restart of the service (the lease is a row), until the lease is revoked."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slow="a")) as served:
        made = httpx.post(served.base + "/api/leases", json={"model": "b", "seconds": 600}, timeout=10)
        assert made.status_code == 201, made.text
        lease = made.json()
        assert lease["model"] == "b" and lease["state"] == "loading" and set(lease) == {"id", "model", "expires_at", "state"}
        wait_until(lambda: loaded(served) == {"b"}, 20, 0.1, "the leased model loaded by the lease")
        wait_until(lambda: httpx.get(served.base + "/api/leases", timeout=10).json() == {
            "leases": [lease | {"state": "loaded"}]}, 5, 0.05, "the lease to say its model is loaded")
        for bad in ({"model": "b"}, {"model": "b", "seconds": 0}, {"model": "b", "seconds": 10**9}, [], {"model": 3}):
            assert httpx.post(served.base + "/api/leases", json=bad, timeout=10).status_code == 400, bad
        assert httpx.post(served.base + "/api/leases", json={"model": "nope", "seconds": 5}, timeout=10).status_code == 404
    with Served(tmp_path, config(events, slow="a")) as served:  # the same data dir: the lease's row is still there
        wait_until(lambda: loaded(served) == {"b"}, 20, 0.1, "the leased model loaded again after the restart")
        assert ask(served, "a").status_code == 200
        assert ask(served, "c").status_code == 200  # b is cheaper to stop, but leased: a goes
        assert loaded(served) == {"b", "c"}
        assert httpx.get(served.base + "/api/placement", timeout=10).json()["boxes"][0]["models"]["b"]["protected"] == \
            f"lease #{lease['id']}"
        revoked = httpx.delete(served.base + f"/api/leases/{lease['id']}", timeout=10)
        assert revoked.status_code == 200 and revoked.json()["revoked"], revoked.text
        assert httpx.delete(served.base + f"/api/leases/{lease['id']}", timeout=10).status_code == 404
        wait_until(lambda: httpx.get(served.base + "/api/placement", timeout=10).json()["boxes"][0]["models"]["b"][
            "protected"] is None, 5, 0.1, "the revocation to reach the scheduler")
        assert httpx.get(served.base + "/api/leases", timeout=10).json() == {"leases": []}


def test_without_hardware_a_lease_is_refused_saying_why(tmp_path):
    text = f"""
        models:
          a:
            cmd: {fake_cmd("a", tmp_path / "events.jsonl")}
    """
    with Served(tmp_path, text) as served:
        refused = httpx.post(served.base + "/api/leases", json={"model": "a", "seconds": 60}, timeout=10)
        assert refused.status_code == 400 and "hardware:" in refused.json()["error"]["message"]


def test_in_distributed_mode_the_worker_places_and_a_front_end_shows_and_leases(tmp_path, distributed):
    """The worker runs the placing scheduler; a front end's /api/placement and can-load ask it, and a lease made
    through the front end (a row) reaches it."""
    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = config(events)
    with Worker(tmp_path / "worker", text, env):
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            assert ask(front, "a").status_code == 200
            assert ask(front, "b").status_code == 200
            assert devices(events) == {"a": ["0"], "b": ["1"]}
            shown = httpx.get(front.base + "/api/placement", timeout=10).json()
            assert [g["models"] for g in shown["boxes"][0]["gpus"]] == [["a"], ["b"]]
            lease = httpx.post(front.base + "/api/leases", json={"model": "b", "seconds": 60}, timeout=10).json()
            wait_until(lambda: httpx.get(front.base + "/api/placement/can-load/c", timeout=10).json()["would_evict"]
                       == ["a"], 5, 0.1, "the lease to reach the worker")
            assert ask(front, "c").status_code == 200
            assert devices(events)["c"] == ["0"]  # a's GPU: b is leased
            assert httpx.delete(front.base + f"/api/leases/{lease['id']}", timeout=10).status_code == 200
