"""ModelProcess against real model server processes, plus the per-model output log they write to.

The model command is `python -m proxy.fakemodel`; the config passes the repo root on PYTHONPATH so
the child can import it whatever the working directory. The process table is read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from proxy.logring import LogRing
from proxy.processes import ModelProcess, ModelStartError, kill_process_group, process_group_alive
from tests.served import model_ports

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 15.0


@dataclass(frozen=True)
class ModelConfigDouble:
    id: str
    cmd: tuple[str, ...]
    proxy: str
    cmd_stop: tuple[str, ...] = ()
    check_endpoint: str | None = "/health"
    env: tuple[tuple[str, str], ...] = (("PYTHONPATH", str(REPO_ROOT)),)
    unload_timeout: float = 5.0


def fakemodel_config(*args: str, **overrides: Any) -> ModelConfigDouble:
    port = model_ports(1)
    cmd = (sys.executable, "-m", "proxy.fakemodel", "--port", str(port), "--model", "m", *args)
    return ModelConfigDouble(id="m", cmd=cmd, proxy=f"http://127.0.0.1:{port}", **overrides)


def group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of a process group, from the process table."""
    table = subprocess.run(["ps", "-e", "-o", "pgid=,stat=,pid=,args="], capture_output=True, text=True).stdout
    return [
        line
        for line in table.splitlines()
        if line.split()[0] == str(pgid) and not line.split()[1].startswith("Z")
    ]


async def wait_until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)
    return result


@dataclass
class Harness:
    """Builds ModelProcess objects and stops whatever they left running when the test ends."""

    made: list[ModelProcess] = field(default_factory=list)
    exits: list[tuple[ModelProcess, int | None]] = field(default_factory=list)
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    def process(self, config: ModelConfigDouble, health_check_timeout: float = DEADLINE_S) -> ModelProcess:
        def on_exit(process: ModelProcess, returncode: int | None) -> None:
            self.exits.append((process, returncode))
            self.exited.set()

        model = ModelProcess(config, health_check_timeout=health_check_timeout, log=LogRing(), on_exit=on_exit)
        self.made.append(model)
        return model


@pytest.fixture
async def harness():
    harness = Harness()
    yield harness
    for model in harness.made:
        await model.stop(timeout=0)


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, timeout=DEADLINE_S)


async def test_start_makes_the_model_ready_and_stop_leaves_no_process(harness):
    config = fakemodel_config()
    model = harness.process(config)
    await model.start()

    assert model.state == "ready"
    assert model.pid == model.pgid and model.started_at is not None
    async with http_client() as client:
        assert (await client.get(config.proxy + "/health")).status_code == 200
    assert "fakemodel m listening on" in model.log.text()
    pgid = model.pgid

    await model.stop()
    assert (model.state, model.pid, model.pgid) == ("stopped", None, None)
    assert group_members(pgid) == []
    assert harness.exits == [], "a stop we asked for is not a crash"


async def test_concurrent_starts_share_one_process(harness):
    model = harness.process(fakemodel_config("--load-delay", "0.3"))
    await asyncio.gather(model.start(), model.start(), model.start())
    assert model.log.text().count("listening on") == 1
    await model.start()
    assert model.log.text().count("listening on") == 1


async def test_ready_only_after_the_load_delay(harness):
    config = fakemodel_config("--load-delay", "1.5")
    model = harness.process(config)
    starting = asyncio.create_task(model.start())
    async with http_client() as client:

        async def health_status() -> int | None:
            try:
                return (await client.get(config.proxy + "/health")).status_code
            except httpx.TransportError:
                return None

        while (status := await health_status()) is None:
            await asyncio.sleep(0.02)
        assert status == 503
        assert model.state == "starting"
        await starting
        assert model.state == "ready"
        assert await health_status() == 200


async def test_exit_at_start_names_the_status_and_shows_the_last_log_lines(harness):
    model = harness.process(fakemodel_config("--exit-at-start", "7"))
    with pytest.raises(ModelStartError) as raised:
        await model.start()
    error = raised.value
    assert error.model == "m"
    assert error.reason == "exited with status 7 before becoming healthy"
    assert "exiting at start with status 7" in error.log_tail
    assert str(error).startswith("model 'm' could not start: exited with status 7")
    assert "last log lines:\n" in str(error) and error.log_tail in str(error)
    assert model.state == "stopped" and model.pid is None


async def test_hang_at_start_times_out_and_kills_the_group(harness):
    model = harness.process(fakemodel_config("--hang-at-start"), health_check_timeout=1)
    starting = asyncio.create_task(model.start())
    pgid = await wait_until(lambda: model.pgid, "the process was spawned")
    with pytest.raises(ModelStartError) as raised:
        await starting
    assert raised.value.reason == "health check timed out after 1s"
    assert model.state == "stopped"
    assert group_members(pgid) == []


async def test_missing_command_is_reported_clearly(harness):
    config = ModelConfigDouble(id="ghost", cmd=("/nonexistent/llama-server", "--port", "1"), proxy="http://127.0.0.1:1")
    model = harness.process(config)
    with pytest.raises(ModelStartError) as raised:
        await model.start()
    assert raised.value.reason == "command not found: /nonexistent/llama-server"
    assert "model 'ghost' could not start: command not found" in str(raised.value)
    assert model.state == "stopped"


async def test_crash_after_ready_calls_on_exit_and_marks_stopped(harness):
    config = fakemodel_config("--crash-after-tokens", "1", "--tps", "0")
    model = harness.process(config)
    await model.start()
    async with http_client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(config.proxy + "/v1/chat/completions", json={"messages": []})
    await asyncio.wait_for(harness.exited.wait(), DEADLINE_S)
    assert harness.exits == [(model, 3)]
    assert model.state == "stopped" and model.pid is None


async def test_sigterm_ignored_means_sigkill_after_unload_timeout_for_the_whole_group(harness):
    port = model_ports(1)
    # sh ignores SIGTERM (inherited by its background `sleep`), then becomes the model server itself.
    script = 'trap "" TERM; sleep 300 & exec "$0" -m proxy.fakemodel --port "$1" --ignore-sigterm'
    config = ModelConfigDouble(
        id="stubborn",
        cmd=("sh", "-c", script, sys.executable, str(port)),
        proxy=f"http://127.0.0.1:{port}",
        unload_timeout=1.0,
    )
    model = harness.process(config)
    await model.start()
    pgid = model.pgid
    assert len(group_members(pgid)) == 2

    began = time.monotonic()
    await model.stop()
    assert time.monotonic() - began >= config.unload_timeout
    assert "ignoring SIGTERM" in model.log.text()
    assert model.state == "stopped"
    assert group_members(pgid) == []


async def test_cmd_stop_runs_with_the_pid_filled_in(harness, tmp_path):
    marker = tmp_path / "stop-command-ran"
    stop_script = (
        "import os, signal, sys; pid = sys.argv[1].removeprefix('--pid=');"
        "open(sys.argv[2], 'w').write(sys.argv[1]); os.kill(int(pid), signal.SIGTERM)"
    )
    config = fakemodel_config(cmd_stop=(sys.executable, "-c", stop_script, "--pid=${PID}", str(marker)))
    model = harness.process(config)
    await model.start()
    pid = model.pid

    await model.stop()
    assert marker.read_text() == f"--pid={pid}"
    assert model.state == "stopped"
    assert group_members(pid) == []


async def test_stop_during_start_aborts_the_start(harness):
    model = harness.process(fakemodel_config("--load-delay", "30"))
    starting = asyncio.create_task(model.start())
    pgid = await wait_until(lambda: model.pgid, "the process was spawned")

    await model.stop()
    with pytest.raises(ModelStartError) as raised:
        await starting
    assert raised.value.reason == "aborted"
    assert model.state == "stopped"
    assert group_members(pgid) == []


async def test_stop_right_after_start_was_requested_still_aborts_it(harness):
    model = harness.process(fakemodel_config())
    starting = asyncio.create_task(model.start())
    await asyncio.sleep(0)  # start() has queued its attempt, which has not run yet
    assert model.state == "starting"

    await model.stop()
    with pytest.raises(ModelStartError) as raised:
        await starting
    assert raised.value.reason == "aborted"
    assert model.state == "stopped"


async def test_start_after_stop_runs_a_new_process(harness):
    model = harness.process(fakemodel_config())
    await model.start()
    first_pid = model.pid
    await model.stop()
    await model.start()
    assert model.state == "ready" and model.pid != first_pid


async def test_environment_reaches_the_child(harness):
    config = fakemodel_config(check_endpoint=None)
    config = ModelConfigDouble(**{**config.__dict__, "env": config.env + (("LLAMASWAP_TEST_MARKER", "gpu-0"),)})
    model = harness.process(config)
    await model.start()
    environ = Path(f"/proc/{model.pid}/environ").read_bytes().split(b"\0")
    assert b"LLAMASWAP_TEST_MARKER=gpu-0" in environ
    assert f"PATH={os.environ['PATH']}".encode() in environ, "the inherited environment is kept"


# -- crash recovery helpers ---------------------------------------------------------------------


def test_kill_process_group_checks_the_command_line_before_killing():
    leader = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert process_group_alive(leader.pid)
        assert kill_process_group(leader.pid, expect_cmdline=["sleep", "301"]) is False
        assert process_group_alive(leader.pid)

        assert kill_process_group(leader.pid, expect_cmdline=["sleep", "300"]) is True
        assert not process_group_alive(leader.pid)
        assert leader.wait(timeout=DEADLINE_S) == -signal.SIGTERM
        assert kill_process_group(leader.pid) is False
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


# -- the per-model output log -------------------------------------------------------------------


def test_log_ring_keeps_only_the_most_recent_text():
    ring = LogRing(max_chars=50)
    for number in range(100):
        ring.append(f"line {number}\n")
    assert len(ring.text()) == 50
    assert ring.text().endswith("line 99\n")
    assert ring.tail(2) == ["line 98", "line 99"]


def test_log_ring_decodes_utf8_split_across_appends():
    ring = LogRing()
    encoded = "chargé ✓\n".encode()
    ring.append(encoded[:6])
    ring.append(encoded[6:])
    assert ring.text() == "chargé ✓\n"


async def test_log_ring_subscribers_receive_new_text_only():
    ring = LogRing()
    ring.append("before\n")
    queue = ring.subscribe()
    ring.append("after\n")
    assert await asyncio.wait_for(queue.get(), DEADLINE_S) == "after\n"
    ring.unsubscribe(queue)
    ring.append("unheard\n")
    assert queue.empty()


async def test_log_ring_slow_subscriber_loses_oldest_text_instead_of_blocking():
    ring = LogRing(backlog=3)
    queue = ring.subscribe()
    for number in range(10):
        ring.append(f"{number}\n")
    assert [queue.get_nowait() for _ in range(queue.qsize())] == ["7\n", "8\n", "9\n"]


async def test_log_ring_accepts_text_from_other_threads():
    ring = LogRing()
    queue = ring.subscribe()
    writer = threading.Thread(target=ring.append, args=("from a thread\n",))
    writer.start()
    writer.join()
    assert await asyncio.wait_for(queue.get(), DEADLINE_S) == "from a thread\n"
