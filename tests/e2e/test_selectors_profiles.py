"""llama-swap's `selectors` (virtual model IDs: pin, warm, spillover) and `profiles` (pins switched on
through /api/profiles/active), through a real `llamaswap serve` with fake models."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.e2e.held import HeldStream
from tests.e2e.test_api_events import EventReader
from tests.e2e.test_distributed import distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          alpha:
            cmd: {fake_cmd("alpha", events)}
          beta:
            cmd: {fake_cmd("beta", events)}
            aliases: [b]
          left:
            cmd: {fake_cmd("left", events)}
          right:
            cmd: {fake_cmd("right", events)}
        groups:
          side-by-side:
            swap: false
            members: [left, right]
        selectors:
          pinned:
            strategy: pin
            targets: [b, alpha]
          warmest:
            strategy: warm
            targets: [alpha, beta]
            name: Warmest
            description: whichever is loaded
            metadata: {{purpose: chat}}
          spread:
            strategy: spillover
            targets: [left, right]
            settings:
              spillover: 1
          quiet:
            strategy: pin
            targets: [alpha]
            unlisted: true
        profiles:
          coding:
            description: Coding models
            pins:
              code: b
              fast: warmest
              alpha: beta
              gone: ~
    """


def chat(served, model: str, **fake) -> httpx.Response:
    return httpx.post(served.base + "/v1/chat/completions",
                      json={"model": model, "messages": [], "fake": {"tokens": 2, **fake}}, timeout=30)


def row_of(served, response: httpx.Response) -> dict:
    """The request's entry in /api/activity, found by the id its answer carried."""
    ticket_id = int(response.headers["X-LlamaSwap-Request-Id"])
    rows = httpx.get(served.base + "/api/activity", params={"limit": 200}, timeout=10).json()["data"]
    return next(row for row in rows if row["id"] == ticket_id)


def running(served) -> set[str]:
    return {m["model"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]}


def test_pin_and_warm_selectors_pick_their_target_and_the_row_names_the_selector(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        pinned = chat(served, "pinned")
        assert pinned.status_code == 200, pinned.text
        assert pinned.json()["model"] == "beta"  # the first target, an alias of beta
        row = row_of(served, pinned)
        assert (row["model"], row["requested_model"], row["selector"]) == ("beta", "pinned", "pinned")

        # beta is loaded: warm answers from it rather than starting its first target, alpha.
        warm = chat(served, "warmest")
        assert warm.status_code == 200 and warm.json()["model"] == "beta"
        assert running(served) == {"beta"} and "model 'alpha' starting" not in served.log()
        assert row_of(served, warm)["selector"] == "warmest"

        # Nothing loaded: warm cold-starts its first target.
        assert httpx.post(served.base + "/api/models/unload", timeout=30).status_code == 200
        wait_until(lambda: not running(served), what="every model to stop")
        cold = chat(served, "warmest")
        assert cold.status_code == 200 and cold.json()["model"] == "alpha"
        assert running(served) == {"alpha"}

        # A plain request has no selector in its row.
        assert row_of(served, chat(served, "alpha"))["selector"] == ""


def test_spillover_sends_concurrent_requests_to_the_next_target_once_the_first_is_full(tmp_path, rows):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        first = HeldStream(served, "spread", tokens=100_000, tps=20, request_id="first")
        second = HeldStream(served, "spread", tokens=100_000, tps=20, request_id="second")
        try:
            assert first.chunks()[0]["model"] == "left"
            assert second.chunks()[0]["model"] == "right"  # left holds one request: spillover 1 is reached
            assert running(served) == {"left", "right"}
        finally:
            first.close()
            second.close()
        picked = wait_until(lambda: len(found := rows(served.data_dir, "selector = 'spread'")) == 2 and found,
                            what="both spillover rows")
        assert sorted(row["model"] for row in picked) == ["left", "right"]
        # Both finished, so the first target takes the next request again.
        wait_until(lambda: all(row["state"] != "dispatched" for row in rows(served.data_dir, "selector = 'spread'")),
                   what="both spillover requests to finish")
        assert chat(served, "spread").json()["model"] in ("left", "right")


def test_profile_pins_apply_while_active_and_are_listed(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        api = served.base + "/api/profiles"
        listed = httpx.get(api, timeout=10).json()
        assert listed == {"active": None, "profiles": [{
            "name": "coding", "description": "Coding models",
            "pins": {"code": "b", "fast": "warmest", "alpha": "beta", "gone": ""},
        }]}
        models = {m["id"]: m for m in httpx.get(served.base + "/v1/models", timeout=10).json()["data"]}
        assert models["warmest"]["meta"]["llamaswap"] == {"type": "selector", "targets": ["alpha", "beta"],
                                                           "purpose": "chat"}
        assert models["warmest"]["name"] == "Warmest"
        assert {"pinned", "spread"} <= set(models) and "quiet" not in models  # unlisted
        assert "code" not in models
        assert chat(served, "code").status_code == 404  # no profile is active: "code" is no model

        events = EventReader(served)
        try:
            _, first = events.wait_for(lambda e: e["type"] == "profileChanged", what="the first profileChanged")
            assert first["data"] == {"activeProfileName": ""}
            assert httpx.put(api + "/active", json={"name": "coding"}, timeout=10).json() == {"active": "coding"}
            events.wait_for(lambda e: e["type"] == "profileChanged" and e["data"]["activeProfileName"] == "coding",
                            what="profileChanged to coding")
        finally:
            events.close()
        assert httpx.get(api, timeout=10).json()["active"] == "coding"
        code = chat(served, "code")
        assert code.status_code == 200 and code.json()["model"] == "beta"
        assert chat(served, "alpha").json()["model"] == "beta"  # a pin goes before the model ID itself
        fast = chat(served, "fast")  # a pin to a selector: warm picks the loaded beta
        assert fast.json()["model"] == "beta" and row_of(served, fast)["selector"] == "warmest"
        gone = chat(served, "gone")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        assert "profile 'coding'" in gone.json()["error"]["message"]
        # Pins apply on /upstream too (selectors do not).
        upstream = httpx.get(served.base + "/upstream/code/v1/models", timeout=30)
        assert upstream.status_code == 200 and upstream.json()["data"][0]["id"] == "beta"
        assert httpx.get(served.base + "/upstream/gone/v1/models", timeout=30).status_code == 404
        assert httpx.get(served.base + "/upstream/warmest/v1/models", timeout=30).status_code == 404
        models = {m["id"]: m for m in httpx.get(served.base + "/v1/models", timeout=10).json()["data"]}
        assert models["code"]["meta"]["llamaswap"]["type"] == "profile"
        assert models["fast"]["meta"]["llamaswap"]["type"] == "profile"
        assert "gone" not in models
        assert models["alpha"]["meta"]["llamaswap"]["type"] == "model"  # the model's own entry stays

        refused = httpx.put(api + "/active", json={"name": "nope"}, timeout=10)
        assert refused.status_code == 404 and "coding" in refused.json()["error"]["message"]
        assert httpx.put(api + "/active", content=b"coding", timeout=10).status_code == 400
        deep = httpx.put(api + "/active", content=b'{"name":' + b"[" * 100_000 + b"]" * 100_000 + b"}", timeout=10)
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_request"
        large = httpx.put(api + "/active", content=b'{"name": "' + b"x" * 3_000_000 + b'"}', timeout=10)
        assert large.status_code == 413 and large.json()["error"]["code"] == "request_too_large"
        assert httpx.put(api + "/active", json={"name": 3}, timeout=10).status_code == 400
        assert httpx.get(api + "/active", timeout=10).status_code == 405
        assert httpx.get(api, timeout=10).json()["active"] == "coding"

        assert httpx.put(api + "/active", json={"name": None}, timeout=10).json() == {"active": None}
        assert chat(served, "alpha").json()["model"] == "alpha"
        assert chat(served, "gone").json()["error"]["message"].startswith("model 'gone' is not configured")

        # A config reload switches profiles off, as in llama-swap.
        httpx.put(api + "/active", json={"name": "coding"}, timeout=10)
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: httpx.get(api, timeout=10).json()["active"] is None, what="the reload to clear the profile")
        assert chat(served, "code").status_code == 404


def test_the_active_profile_survives_no_restart(tmp_path):
    """At start no profile is active, whatever was active when the service stopped."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        httpx.put(served.base + "/api/profiles/active", json={"name": "coding"}, timeout=10)
        assert chat(served, "code").status_code == 200
    with Served(tmp_path, config(events)) as served:
        assert httpx.get(served.base + "/api/profiles", timeout=10).json()["active"] is None
        assert chat(served, "code").status_code == 404


def test_hooks_on_startup_profile_is_active_at_start_and_after_a_reload(tmp_path):
    """`hooks.on_startup.profile` replaces "none" as what a start and a reload switch to."""
    events = tmp_path / "events.jsonl"
    with_hook = config(events) + """
        hooks:
          on_startup:
            profile: coding
    """
    with Served(tmp_path, with_hook) as served:
        api = served.base + "/api/profiles"
        assert httpx.get(api, timeout=10).json()["active"] == "coding"
        assert chat(served, "code").json()["model"] == "beta"
        assert httpx.put(api + "/active", json={"name": None}, timeout=10).json() == {"active": None}
        assert chat(served, "code").status_code == 404
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: httpx.get(api, timeout=10).json()["active"] == "coding",
                   what="the reload to switch to the startup profile")
        assert chat(served, "code").json()["model"] == "beta"


def test_with_a_profile_state_file_a_restart_keeps_the_profile_last_selected(tmp_path):
    """llama-swap's `profileStateFile` remembers the selection across restarts; llamaswap's database does."""
    events = tmp_path / "events.jsonl"
    remembering = config(events) + f"""
        profileStateFile: {tmp_path / "profile-state.json"}
    """
    with Served(tmp_path, remembering) as served:
        assert httpx.get(served.base + "/api/profiles", timeout=10).json()["active"] is None
        httpx.put(served.base + "/api/profiles/active", json={"name": "coding"}, timeout=10)
    with Served(tmp_path, remembering) as served:
        assert httpx.get(served.base + "/api/profiles", timeout=10).json()["active"] == "coding"
        assert chat(served, "code").json()["model"] == "beta"
        httpx.put(served.base + "/api/profiles/active", json={"name": None}, timeout=10)
    with Served(tmp_path, remembering + """
        hooks:
          on_startup:
            profile: coding
    """) as served:  # "none" was selected last: remembered over the startup hook
        assert httpx.get(served.base + "/api/profiles", timeout=10).json()["active"] is None


def test_distributed_front_ends_share_the_active_profile_and_see_the_workers_models(tmp_path, distributed):
    """One front end switches the profile on; the other applies it too. Warm reads the worker's process
    states from a front end, and the worker's row records the selector."""
    env, psycopg = distributed
    text = f"""
        startPort: {model_ports(2)}
        models:
          chat: {{cmd: "{fake_cmd('chat')}"}}
          coder: {{cmd: "{fake_cmd('coder')}"}}
        selectors:
          warmest: {{strategy: warm, targets: [coder, chat]}}
        profiles:
          coding: {{pins: {{code: warmest}}}}
    """
    with two_front_ends(tmp_path, text, env) as (first, second):
        assert chat(first, "chat").json()["model"] == "chat"
        wait_until(lambda: running(second) == {"chat"}, what="the other front end to hear from the worker")
        assert httpx.put(first.base + "/api/profiles/active", json={"name": "coding"}, timeout=10).status_code == 200
        answer = wait_until(lambda: (r := chat(second, "code")).status_code == 200 and r, timeout=10,
                            what="the other front end to apply the profile")
        assert answer.json()["model"] == "chat"  # warm: chat is loaded, coder is not
        ticket_id = int(answer.headers["X-LlamaSwap-Request-Id"])
        with psycopg.connect(env["DATABASE_URL"]) as connection:
            selector = connection.execute(
                "SELECT selector FROM scheduling_queuedrequest WHERE id = %s", (ticket_id,)).fetchone()
        assert selector == ("warmest",)
        assert httpx.get(second.base + "/api/profiles", timeout=10).json()["active"] == "coding"
