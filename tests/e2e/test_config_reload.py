"""Config reload, as llama-swap users know it: `--watch-config` and SIGHUP."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading

import httpx
import pytest

from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def models_yaml(events, models: dict[str, str]) -> str:
    lines = ["models:"]
    for name, extra in models.items():
        lines += [f"  {name}:", f"    cmd: {fake_cmd(name, events, *extra.split())}", "    proxy: http://127.0.0.1:${PORT}"]
    return "\n".join(lines) + "\nrouting:\n  scheduler:\n    use: serial\n"


def chat(served, model, **fake):
    return httpx.post(served.base + "/v1/chat/completions",
                      json={"model": model, "messages": [], "fake": fake}, timeout=60)


def rewrite(served, text: str) -> None:
    """Replace the models, keeping the free start port the harness chose."""
    start_port = served.config_path.read_text().split("\n", 1)[0]
    served.config_path.write_text(start_port + "\n" + text)


@pytest.fixture
def served(tmp_path):
    events = tmp_path / "events.jsonl"
    s = Served(tmp_path, models_yaml(events, {"keep": "--tps 0", "gone": "--tps 0"}), extra_args=("--watch-config",))
    s.events = events
    with s:
        yield s


def test_an_invalid_config_is_refused_and_the_old_one_keeps_serving(served):
    served.config_path.write_text("models:\n  keep:\n    ttl: soon\n")
    wait_until(lambda: "config reload rejected" in served.log(), timeout=15, what="the reload to be refused")
    assert "models.keep" in served.log()
    assert chat(served, "gone").status_code == 200
    served.check_settled("keep")


def test_a_valid_config_applies_without_dropping_queued_requests(served, rows):
    results: dict[str, int] = {}

    def post(key, model):
        def run():
            results[key] = chat(served, model).status_code
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    holder = {"model": "keep", "stream": True, "messages": [], "fake": {"tokens": 1_000_000, "tps": 10}}
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=holder, timeout=60) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: a dropped iterator's finaliser would close the stream
        assert next(lines).startswith("data:")  # the stream holds the GPU until it is closed
        keep, gone = post("queued-keep", "keep"), post("queued-gone", "gone")
        wait_until(lambda: len(rows(served.data_dir, "state='queued'")) == 2, what="two queued requests")
        rewrite(served, models_yaml(served.events, {"keep": "--tps 0", "fresh": "--tps 0"}))
        wait_until(lambda: "config reloaded" in served.log(), timeout=15, what="the reload")
        # The reload met both requests still waiting: the one for the removed model is refused,
        # the other keeps its place until the GPU frees.
        gone.join(30)
        assert results == {"queued-gone": 404}
        waiting = wait_until(lambda: (r := rows(served.data_dir, "state='queued'")) and len(r) == 1 and r,
                             what="the removed model's request to leave the queue")
        assert waiting[0]["requested_model"] == "keep" and "queued-keep" not in results
    keep.join(30)
    assert results == {"queued-gone": 404, "queued-keep": 200}
    assert [m["id"] for m in httpx.get(served.base + "/v1/models").json()["data"]] == ["fresh", "keep"]
    settled = served.check_settled("fresh")
    assert sorted((r["requested_model"], r["state"]) for r in settled) == [
        ("fresh", "completed"), ("gone", "rejected"), ("keep", "cancelled"), ("keep", "completed")]


def test_a_model_added_before_a_running_one_leaves_its_port_and_its_process_alone(served):
    """${PORT} numbers go out in model-ID order; a reload keeps each model's own, so adding `aaa` (first in that
    order) restarts nothing that runs."""
    def pid_of(response):
        assert response.status_code == 200, response.text
        return response.json()["id"].split("-")[1]  # the fake model's cmpl-<pid>-<time>

    before = pid_of(chat(served, "keep"))
    rewrite(served, models_yaml(served.events, {"aaa": "--tps 0", "keep": "--tps 0", "gone": "--tps 0"}))
    wait_until(lambda: "config reloaded" in served.log(), timeout=15, what="the reload")
    assert "added aaa, removed none, restarting none" in served.log()
    assert pid_of(chat(served, "keep")) == before
    assert chat(served, "aaa").status_code == 200  # the new model's number is one no other model holds
    served.check_settled("aaa")


def test_sighup_reloads_and_restarts_a_model_whose_command_changed(tmp_path):
    with Served(tmp_path, models_yaml(None, {"keep": "--tps 0"})) as served:
        assert chat(served, "keep").json()["usage"]["completion_tokens"] != 3
        text = served.config_path.read_text()
        served.config_path.write_text(text.replace("--tps 0", "--tps 0 --tokens 3"))
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "restarting keep" in served.log(), timeout=10, what="the SIGHUP reload")
        assert chat(served, "keep").json()["usage"]["completion_tokens"] == 3
        served.check_settled("keep")


def test_a_slots_override_for_a_model_the_reload_removed_is_ignored_with_a_warning(served):
    # As the admin stores it: by model ID, every model not listed has 1 slot.
    con = sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=5)
    with con:
        con.execute(
            "INSERT OR REPLACE INTO scheduling_schedulersettings (id, aging_divisor, swap_affinity_bonus, slots) "
            "VALUES (1, NULL, NULL, ?)", (json.dumps({"keep": 3, "gone": 2}),),
        )
    con.close()
    rewrite(served, models_yaml(served.events, {"keep": "--tps 0"}))
    wait_until(lambda: "config reloaded" in served.log(), timeout=15, what="the reload")
    assert "ignoring the admin's slots override gone: 2: not a configured model" in served.log()
    metrics = httpx.get(served.base + "/metrics").text
    assert [line for line in metrics.splitlines() if line.startswith("llamaswap_model_slots{")] == [
        'llamaswap_model_slots{model="keep"} 3.0'
    ]


def test_a_reload_adding_hardware_to_a_fifo_config_is_refused_saying_so(tmp_path):
    events = tmp_path / "events.jsonl"
    fifo = models_yaml(events, {"keep": "--tps 0"}).replace("routing:\n  scheduler:\n    use: serial\n", "")
    with Served(tmp_path, fifo, extra_args=("--watch-config",)) as s:
        rewrite(s, "hardware: {gpus: [{id: 0, memory: 24GiB}]}\n"
                + fifo.replace("    proxy:", "    memory: 8GiB\n    proxy:"))
        wait_until(lambda: "config reload rejected" in s.log(), timeout=15, what="the reload to be refused")
        assert ("routing.scheduler.use changed from fifo to serial (a top-level hardware: section was added, which "
                "places by memory with the serial scheduler), which needs a restart") in s.log()
        assert chat(s, "keep").status_code == 200
