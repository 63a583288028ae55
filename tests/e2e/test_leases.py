"""Model leases end to end (two 24 GiB GPUs, models a, b and c of 20 GiB, a the costlier to load again): a lease
protects its model from the moment it is answered, in one process and through a distributed front end; a leased
model lost is loaded again (a kill -9, a failing start retried with growing waits), an operator's unload wins and
ends the lease; each lease says what it is doing (`state`), and one that can never fit is refused."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.e2e.test_placement import ask, config, loaded
from tests.served import Served, Worker, wait_until

pytestmark = pytest.mark.e2e


def lease(served, model: str, seconds: float = 600) -> httpx.Response:
    return httpx.post(served.base + "/api/leases", json={"model": model, "seconds": seconds}, timeout=10)


def shown(served) -> dict[str, dict]:
    """The leases in force by model."""
    return {entry["model"]: entry for entry in httpx.get(served.base + "/api/leases", timeout=10).json()["leases"]}


def ready(served) -> set[str]:
    return {m["model"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]
            if m["state"] == "ready"}


def model_pid(served, model: str) -> int:
    """The pid of `model`'s fake server, found by the port /running says it listens on."""
    proxy = next(m["proxy"] for m in httpx.get(served.base + "/running", timeout=10).json()["running"]
                 if m["model"] == model)
    port = proxy.rstrip("/").rsplit(":", 1)[1].encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fakemodel" in args and port in args:
            return int(cmdline.parent.name)
    raise AssertionError(f"no fake model server listens on port {port.decode()}")


def test_a_new_lease_protects_its_model_before_it_is_answered(tmp_path):
    """b is cheaper to load again than a, so a request for c would stop b: right after the 201, it stops a."""
    with Served(tmp_path, config(tmp_path / "events.jsonl", slow="a")) as served:
        lease_b_then_ask_for_c(served)


def lease_b_then_ask_for_c(served) -> dict:
    """With a and b loaded, lease b and at once ask for c: c must stop a. Returns the lease."""
    assert ask(served, "a").status_code == 200
    assert ask(served, "b").status_code == 200
    made = lease(served, "b")
    assert made.status_code == 201 and made.json()["state"] == "loaded", made.text
    assert ask(served, "c").status_code == 200
    assert loaded(served) == {"b", "c"}
    return made.json()


def test_through_a_distributed_front_end_a_new_lease_protects_its_model_before_it_is_answered(tmp_path, distributed):
    env, _ = distributed
    text = config(tmp_path / "events.jsonl", slow="a")
    with Worker(tmp_path / "worker", text, env):
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            made = lease_b_then_ask_for_c(front)
            revoked = httpx.delete(front.base + f"/api/leases/{made['id']}", timeout=10).json()
            assert revoked["takes_effect_within_s"] == 0


def test_a_leased_model_killed_is_loaded_again(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        assert lease(served, "b").status_code == 201
        wait_until(lambda: shown(served)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded")
        os.kill(model_pid(served, "b"), signal.SIGKILL)
        wait_until(lambda: "b" not in ready(served), 10, 0.05, "the killed model seen gone")
        wait_until(lambda: shown(served)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded again")
        assert ask(served, "b").status_code == 200
        assert "lease #" in served.log() and "keeps model b loaded" in served.log()


def test_an_operator_unload_of_a_leased_model_wins_and_ends_the_lease(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        made = lease(served, "b").json()
        wait_until(lambda: shown(served)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded")
        unloaded = httpx.post(served.base + "/api/models/unload/b", timeout=30)
        assert unloaded.status_code == 200, unloaded.text
        assert shown(served) == {}
        time.sleep(2.5)  # longer than two reads of the leases: a lease still in force would load b again
        assert loaded(served) == set()
        assert f"lease #{made['id']} on model b revoked: an operator unloaded the model" in served.log()
        assert "stopping model b: an operator unloaded it" in served.log()


def test_a_leased_model_whose_start_fails_is_tried_again_with_growing_waits(tmp_path):
    starts = tmp_path / "starts"
    text = f"""
        healthCheckTimeout: 20
        hardware:
          gpus:
            - {{id: 0, memory: 24GiB}}
        models:
          b:
            cmd: sh -c 'echo ${{PORT}} >> {starts}; exit 3'
            memory: 20GiB
    """
    with Served(tmp_path, text) as served:
        made = lease(served, "b")
        assert made.status_code == 201, made.text
        wait_until(lambda: "last_error" in shown(served)["b"], 20, 0.1, "the failed start shown")
        entry = shown(served)["b"]
        assert entry["state"] == "waiting" and "b" in entry["last_error"] and entry["retry_in_s"] <= 1, entry
        first = time.monotonic()
        wait_until(lambda: starts.exists() and len(starts.read_text().split()) >= 3, 20, 0.1, "three tries")
        # waits of 1 s then 2 s: never a tight loop
        assert time.monotonic() - first >= 2.5
        assert len(starts.read_text().split()) <= 4


def test_each_lease_shows_its_state_and_one_only_pins_would_make_room_for_is_refused(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl", pinned=("a",))) as served:
        assert ask(served, "a").status_code == 200
        made = lease(served, "b").json()
        wait_until(lambda: shown(served)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded")
        waiting = lease(served, "c")  # room only where a (pinned) or b (leased) is: waits for b's lease
        assert waiting.status_code == 201 and waiting.json()["state"] == "waiting", waiting.text
        assert waiting.json()["blocked_by"] == [f"b (lease #{made['id']})"], waiting.json()
        assert shown(served)["c"]["state"] == "waiting"
        assert httpx.delete(served.base + f"/api/leases/{made['id']}", timeout=10).status_code == 200
        wait_until(lambda: shown(served)["c"]["state"] == "loaded", 20, 0.1, "c loaded once b's lease ended")
        assert loaded(served) == {"a", "c"}
    (tmp_path / "pins").mkdir()
    with Served(tmp_path / "pins", config(tmp_path / "events.jsonl", pinned=("a", "b"))) as served:
        assert ask(served, "a").status_code == 200
        assert ask(served, "b").status_code == 200
        refused = lease(served, "c")
        assert refused.status_code == 409, refused.text
        message = refused.json()["error"]["message"]
        assert "room only if" in message and "(pinned)" in message, message
        assert shown(served) == {}


def test_a_bad_lease_is_refused_naming_the_field(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        for body, named in [
            ({"seconds": 60}, "model is missing"),
            ({"model": 3, "seconds": 60}, "model is not a string"),
            ({"model": "b"}, "seconds is missing"),
            ({"model": "b", "seconds": "60"}, "seconds is not a number"),
            ({"model": "b", "seconds": 0}, "seconds is 0, out of range: 1 to 2592000"),
            ([], "the body is not a JSON object"),
        ]:
            refused = httpx.post(served.base + "/api/leases", json=body, timeout=10)
            assert refused.status_code == 400 and refused.json()["error"]["message"].startswith(named), refused.text


def test_loads_made_for_a_lease_or_a_preload_are_not_counted_as_requests(tmp_path):
    text = config(tmp_path / "events.jsonl") + """
        hooks:
          on_startup:
            preload: [a]
    """
    with Served(tmp_path, text) as served:
        assert lease(served, "b").status_code == 201
        wait_until(lambda: ready(served) == {"a", "b"}, 20, 0.1, "the preload and the leased model loaded")
        assert ask(served, "b").status_code == 200
        wait_until(lambda: len(served.rows()) == 3 and all(r["finished_at"] for r in served.rows()), 10, 0.1,
                   "the loads' rows and the request's ended")
        counted = [line for line in httpx.get(served.base + "/metrics", timeout=10).text.splitlines()
                   if line.startswith("llamaswap_requests_total{")]
        assert len(counted) == 1 and 'model="b"' in counted[0] and counted[0].endswith(" 1.0"), counted
        assert len(httpx.get(served.base + "/api/activity", timeout=10).json()["data"]) == 1
        assert httpx.get(served.base + "/api/metrics/activity", timeout=10).json()["total"] == 1


def test_a_lease_whose_model_a_reload_removed_says_so(tmp_path):
    text = config(tmp_path / "events.jsonl")
    with Served(tmp_path, text) as served:
        made = lease(served, "b").json()
        wait_until(lambda: shown(served)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded")
        start_port = served.config_path.read_text().split("\n", 1)[0]
        without_b = re.sub(r"\n *b:\n(?: {12}.*\n)+", "\n", text)
        assert "b:" not in without_b and "c:" in without_b
        served.config_path.write_text(start_port + "\n" + textwrap.dedent(without_b))
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: shown(served)["b"]["state"] == "model_removed", 20, 0.1, "the lease shown model_removed")
        assert shown(served)["b"]["id"] == made["id"]
        wait_until(lambda: "b" not in loaded(served), 20, 0.1, "the removed model stopped")


def test_leased_models_that_do_not_all_fit_are_loaded_oldest_lease_first_also_after_a_restart(tmp_path):
    """Three leases of 20 GiB models on two 24 GiB GPUs: the two leased first are loaded and the third waits; after a
    kill -9 and a restart the same two are loaded again, not the first two by name (a, b)."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        for model in ("c", "b"):
            assert lease(served, model).status_code == 201
            wait_until(lambda: model in loaded(served), 20, 0.1, f"{model}, leased, loaded")
        assert lease(served, "a").status_code == 201
        wait_until(lambda: shown(served)["a"]["state"] == "waiting", 10, 0.1, "the third lease waiting for room")
        served.kill()  # kill -9: its models are left running, for the next start to find and stop
    with Served(tmp_path, config(events)) as served:
        wait_until(lambda: loaded(served) == {"b", "c"} and shown(served)["a"]["state"] == "waiting", 30, 0.1,
                   "the two models leased first loaded again, the third waiting")


def test_a_lease_made_through_a_front_end_is_kept_by_the_standby_that_takes_over_from_a_killed_worker(
        tmp_path, distributed):
    """A lease is a row, not the active worker's memory: once that worker is killed -9, the standby that takes over
    loads the leased model again by itself, a front end lists the lease `loaded`, and requests for a and c that need
    its memory stop a instead (a takes over a second to load, so b is the cheaper to lose: without its lease, b would
    go)."""
    from tests.served import model_ports

    env, _ = distributed
    events = tmp_path / "events.jsonl"
    text = f"startPort: {model_ports(8)}\n" + textwrap.dedent(config(events, slow="a"))
    standby_env = {**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "standby-data")}  # as on another machine

    def ready_here() -> set[str] | None:
        """The models ready to serve, as the front end hears from the worker serving (None: none answered)."""
        answer = httpx.get(front.base + "/running", timeout=10)
        return {m["model"] for m in answer.json()["running"] if m["state"] == "ready"} if answer.is_success else None

    def placed() -> dict:
        return httpx.get(front.base + "/api/placement", timeout=10).json()["boxes"][0]

    with Worker(tmp_path / "active", text, env) as active, \
            Worker(tmp_path / "standby", text, standby_env, ready="llamaswap worker standing by") as standby:
        (tmp_path / "fe").mkdir()
        with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
            made = lease(front, "b")
            assert made.status_code == 201, made.text
            wait_until(lambda: shown(front)["b"]["state"] == "loaded", 20, 0.1, "the leased model loaded")
            assert f"lease #{made.json()['id']} keeps model b loaded" in active.log()
            before = model_pid(front, "b")

            os.kill(active.proc.pid, signal.SIGKILL)
            wait_until(lambda: "llamaswap worker serving" in standby.log(), 60, 0.05, "the standby to take over")
            # Only /running is asked until b is back: a GET /api/leases would have the standby read the rows at
            # once, and this is to show that it reads them by itself.
            wait_until(lambda: ready_here() == {"b"}, 30, 0.1, "the standby to load the leased model again")
            again = model_pid(front, "b")
            assert again != before, "b is the standby's own process, not the killed worker's"
            assert f"lease #{made.json()['id']} keeps model b loaded" in standby.log()
            assert [(entry["id"], entry["model"], entry["state"])
                    for entry in httpx.get(front.base + "/api/leases", timeout=10).json()["leases"]] == [
                (made.json()["id"], "b", "loaded")]

            # Right after the takeover: the standby still gathers what front ends submit again, and a request
            # queued then counts as demand as any other does.
            assert ask(front, "a").status_code == 200
            assert loaded(front) == {"a", "b"}
            models = placed()["models"]
            assert models["a"]["eviction_cost"] > models["b"]["eviction_cost"], models  # unleased, b would go
            assert models["b"]["protected"] == f"lease #{made.json()['id']}", models
            gpu_of_a = next(g["id"] for g in placed()["gpus"] if g["models"] == ["a"])

            assert ask(front, "c").status_code == 200  # no room for c: a is stopped, not the leased b
            assert loaded(front) == {"b", "c"}
            assert model_pid(front, "b") == again, "b was never stopped, not even to be loaded again"
            assert {g["id"]: g["models"] for g in placed()["gpus"]}[gpu_of_a] == ["c"]
            assert ask(front, "b").status_code == 200 and model_pid(front, "b") == again
            assert shown(front)["b"]["state"] == "loaded"
