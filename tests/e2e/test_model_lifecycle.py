"""Model processes as users meet them: failures with clear errors, crashes, TTL, restarts after a kill."""

from __future__ import annotations

import json
import signal
import sys
import threading

import httpx
import openai
import pytest

from proxy.model_processes.process_groups import process_group_alive
from tests.served import Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e


def config(tmp, models: dict[str, str], *, health_timeout=20, extra=""):
    lines = [f"healthCheckTimeout: {health_timeout}", "models:"]
    for name, cmd in models.items():
        lines += [f"  {name}:", f"    cmd: {cmd}", "    proxy: http://127.0.0.1:${PORT}"]
    lines += ["routing:", "  scheduler:", "    use: serial", extra]
    return "\n".join(lines) + "\n"


def chat(served, model, **fake):
    return httpx.post(served.base + "/v1/chat/completions",
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "fake": fake}, timeout=60)


def chat_until_killed(served, model, **fake):
    """A client whose connection the test is about to cut by killing the service."""
    try:
        chat(served, model, **fake)
    except httpx.HTTPError:
        pass


def test_model_that_exits_at_start_gets_a_503_naming_model_cause_and_log(tmp_path):
    text = config(tmp_path, {"broken": fake_cmd("broken", None, "--exit-at-start", "3"), "ok": fake_cmd("ok")})
    with Served(tmp_path, text) as served:
        r = chat(served, "broken")
        assert r.status_code == 503
        message = r.json()["error"]["message"]
        assert "broken" in message and "status 3" in message
        assert r.json()["error"]["code"] == "model_start_failed"
        served.check_settled("ok")  # the service keeps serving


def test_model_that_never_becomes_healthy_times_out_with_503(tmp_path):
    text = config(tmp_path, {"stuck": fake_cmd("stuck", None, "--hang-at-start"), "ok": fake_cmd("ok")},
                  health_timeout=1)
    with Served(tmp_path, text) as served:
        r = chat(served, "stuck")
        assert r.status_code == 503
        assert "timed out" in r.json()["error"]["message"] and "stuck" in r.json()["error"]["message"]
        assert httpx.get(served.base + "/running").json() == {"running": []}
        served.check_settled("ok")


def gated_start(spawns, gate, *args: str) -> str:
    """A `cmd:` that notes each spawn in `spawns`, then waits for the file `gate` before the fake
    model starts: the test decides when the start ends. A JSON string is a YAML scalar."""
    model = " ".join([sys.executable, "-m", "fakemodel", "--port", "${PORT}", *args])
    return json.dumps(f"sh -c 'echo spawn >> {spawns}; until [ -e {gate} ]; do sleep 0.02; done; exec {model}'")


def test_requests_queued_behind_a_failing_start_for_the_same_model_fail_with_the_same_cause(tmp_path, rows):
    spawns, gate = tmp_path / "spawns", tmp_path / "gate"
    text = config(tmp_path, {"slowfail": gated_start(spawns, gate, "--exit-at-start", "3"), "ok": fake_cmd("ok")})
    with Served(tmp_path, text) as served:
        results = []
        threads = [threading.Thread(target=lambda: results.append(chat(served, "slowfail"))) for _ in range(3)]
        for t in threads:
            t.start()
        # All three wait while the one start is under way; then it fails.
        wait_until(lambda: len(rows(served.data_dir, "state='queued'")) == 3 and spawns.exists(),
                   what="three requests queued behind one start")
        gate.touch()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [503, 503, 503]
        assert len({r.json()["error"]["message"].split(";")[0] for r in results}) == 1
        assert spawns.read_text().splitlines() == ["spawn"], "the failed start was tried again"
        served.check_settled("ok")


def test_crash_mid_stream_ends_the_stream_with_an_error_and_the_next_request_restarts_the_model(tmp_path):
    events = tmp_path / "events.jsonl"
    text = config(tmp_path, {"crashy": fake_cmd("crashy", events, "--tps", "100")})
    with Served(tmp_path, text) as served:
        c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError) as err:
            for _ in c.chat.completions.create(model="crashy", messages=[], stream=True,
                                               extra_body={"fake": {"crash_after": 3, "tokens": 50}}):
                pass
        assert "crashy" in str(err.value)
        r = chat(served, "crashy", crash_after=2, tokens=50)
        assert r.status_code == 502 and "crashy" in r.json()["error"]["message"]
        assert chat(served, "crashy").status_code == 200
        assert len([e for e in read_events(events) if e["event"] == "start"]) == 3
        served.check_settled("crashy")


def test_ttl_unloads_an_idle_model(tmp_path):
    text = f"""
        healthCheckTimeout: 20
        models:
          brief:
            cmd: {fake_cmd("brief")}
            proxy: http://127.0.0.1:${{PORT}}
            ttl: 1
    """
    with Served(tmp_path, text) as served:
        assert chat(served, "brief").status_code == 200
        assert [m["model"] for m in httpx.get(served.base + "/running").json()["running"]] == ["brief"]
        wait_until(lambda: httpx.get(served.base + "/running").json() == {"running": []}, timeout=10,
                   what="the TTL to unload the model")


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the group, read from the process table."""
    return process_group_alive(pgid)


def test_restart_after_sigkill_interrupts_unfinished_rows_and_stops_orphaned_models(tmp_path, rows):
    events = tmp_path / "events.jsonl"
    text = config(tmp_path, {"m": fake_cmd("m", events)})
    served = Served(tmp_path, text).start()
    try:
        threading.Thread(target=chat_until_killed, args=(served, "m"), kwargs={"delay": 30}, daemon=True).start()
        wait_until(lambda: read_events(events), what="the long request to reach the model")
        threading.Thread(target=chat_until_killed, args=(served, "m"), daemon=True).start()
        wait_until(lambda: rows(served.data_dir, "state='queued'"), what="a queued row")
        wait_until(lambda: rows(served.data_dir, "state='dispatched'"), what="a dispatched row")
        pgid = httpx.get(served.base + "/running").json()["running"] and _model_pgid(served)
        served.kill()
        assert _group_alive(pgid), "the model should have outlived the SIGKILLed service"
        served.start()
        assert not _group_alive(pgid)
        states = {r["state"] for r in rows(served.data_dir)}
        assert states == {"interrupted"}
        assert all("killed or crashed" in r["error"] for r in rows(served.data_dir))
        served.check_settled("m")
    finally:
        served.stop()


def _model_pgid(served) -> int:
    import sqlite3

    con = sqlite3.connect(served.data_dir / "llamaswap.sqlite3")
    try:
        return wait_until(lambda: con.execute("SELECT pgid FROM scheduling_modelprocessrecord").fetchone(),
                          what="the model's process record")[0]
    finally:
        con.close()


def test_sigterm_stops_models_and_exits_zero(tmp_path):
    text = config(tmp_path, {"m": fake_cmd("m")})
    served = Served(tmp_path, text).start()
    assert chat(served, "m").status_code == 200
    pgid = _model_pgid(served)
    assert served.stop(signal.SIGTERM) == 0
    assert not _group_alive(pgid)


def test_upstream_that_hangs_past_its_response_timeout_gets_504_and_frees_the_gpu(tmp_path):
    text = f"""
        models:
          slow:
            cmd: {fake_cmd("slow")}
            proxy: http://127.0.0.1:${{PORT}}
            timeouts: {{responseHeader: 1}}
    """
    with Served(tmp_path, text) as served:
        r = chat(served, "slow", delay=30)
        assert r.status_code == 504
        assert "slow" in r.json()["error"]["message"] and r.json()["error"]["code"] == "upstream_timeout"
        served.check_settled("slow")


def test_preload_starts_models_through_the_scheduler_at_start_up(tmp_path, rows):
    text = f"""
        hooks:
          on_startup:
            preload: [warm]
        models:
          warm:
            cmd: {fake_cmd("warm")}
            proxy: http://127.0.0.1:${{PORT}}
          cold:
            cmd: {fake_cmd("cold")}
            proxy: http://127.0.0.1:${{PORT}}
            aliases: [c]
    """
    with Served(tmp_path, text) as served:
        def settled():
            running = httpx.get(served.base + "/running").json()["running"]
            return running if running and all(m["state"] != "starting" for m in running) else None

        running = wait_until(settled, what="the preload to finish starting")
        assert [(m["model"], m["state"]) for m in running] == [("warm", "ready")]
        preload = wait_until(lambda: rows(served.data_dir, "state='completed'"), what="the preload's row")
        assert [(r["model"], r["path"], r["needed_swap"]) for r in preload] == [("warm", "(preload)", 1)]
