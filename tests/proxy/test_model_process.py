"""ModelProcess against real model server processes, plus the per-model output log they write to.

The model command is `python -m fakemodel`; the config passes the repo root on PYTHONPATH so
the child can import it whatever the working directory. The process table is read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from proxy.model_processes.logring import LogRing
from proxy.model_processes import proctable
from proxy.model_processes.child_environment import PROCESS_MARKER_VARIABLE
from proxy.model_processes.process import (
    STOPPED_WHILE_STARTING,
    ModelProcess,
    ModelStartError,
    SpawnedProcess,
)
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
    cmd = (sys.executable, "-m", "fakemodel", "--port", str(port), "--model", "m", *args)
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
    # What the model reported through on_spawn / on_gone, with its state at that moment.
    spawned: list[tuple[SpawnedProcess, str]] = field(default_factory=list)
    gone: list[SpawnedProcess] = field(default_factory=list)

    def process(self, config: ModelConfigDouble, health_check_timeout: float = DEADLINE_S) -> ModelProcess:
        def on_exit(process: ModelProcess, returncode: int | None) -> None:
            self.exits.append((process, returncode))
            self.exited.set()

        model = ModelProcess(
            config, health_check_timeout=health_check_timeout, log=LogRing(), on_exit=on_exit,
            on_spawn=lambda spawned: self.spawned.append((spawned, model.state)), on_gone=self.gone.append,
        )
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
    # The text is the cause and the output; whoever reports it adds the model's name, once.
    assert str(error) == f"exited with status 7 before becoming healthy; last log lines:\n{error.log_tail}"
    assert model.state == "stopped" and model.pid is None


async def test_a_failed_start_shows_only_its_own_output(harness):
    port = model_ports(1)
    config = ModelConfigDouble(id="flaky", cmd=("sh", "-c", "echo attempt by pid $$; exit 3"),
                               proxy=f"http://127.0.0.1:{port}")
    model = harness.process(config)
    failures = []
    for _ in range(2):
        with pytest.raises(ModelStartError) as raised:
            await model.start()
        failures.append(raised.value)
    pids = [spawned.pid for spawned, _ in harness.spawned]
    assert [failure.log_tail for failure in failures] == [f"attempt by pid {pid}" for pid in pids]
    assert model.log.text().count("attempt by pid") == 2, "the model's log keeps every attempt"


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
    assert str(raised.value) == "command not found: /nonexistent/llama-server", "nothing ran, so no output to speak of"
    assert model.state == "stopped"
    assert harness.spawned == [] and harness.gone == []


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
    script = 'trap "" TERM; sleep 300 & exec "$0" -m fakemodel --port "$1" --ignore-sigterm'
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
    assert raised.value.reason == STOPPED_WHILE_STARTING
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
    assert raised.value.reason == STOPPED_WHILE_STARTING
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
    [path] = [entry.decode().removeprefix("PATH=") for entry in environ if entry.startswith(b"PATH=")]
    assert path.startswith(os.environ["PATH"]), "the inherited environment is kept, PATH first"
    assert os.path.dirname(sys.executable) in path.split(":"), "the llamaswap console script can be found"


# -- what identifies a process group after a crash ------------------------------------------------


async def test_the_process_group_is_reported_when_spawned_before_it_is_healthy_and_gone_after_the_stop(harness):
    model = harness.process(fakemodel_config("--load-delay", "30"))
    starting = asyncio.create_task(model.start())
    [(spawned, state)] = await wait_until(lambda: harness.spawned, "the process group was reported")
    assert state == "starting"
    assert spawned.model == "m" and spawned.pid == model.pgid
    assert spawned.start_ticks == proctable.start_ticks(spawned.pid) is not None
    assert proctable.has_environment_entry(spawned.pid, f"{PROCESS_MARKER_VARIABLE}={spawned.marker}")
    assert harness.gone == []

    await model.stop()
    with pytest.raises(ModelStartError):
        await starting
    assert harness.gone == [spawned]


async def test_every_start_gets_its_own_marker_and_a_failed_one_is_reported_gone(harness):
    model = harness.process(fakemodel_config("--exit-at-start", "3"))
    for _ in range(2):
        with pytest.raises(ModelStartError):
            await model.start()
    spawned = [spawned for spawned, _ in harness.spawned]
    assert harness.gone == spawned
    assert len({s.marker for s in spawned}) == 2


# -- whose server answers on the model's port -----------------------------------------------------


async def test_a_port_held_by_another_process_fails_the_start_without_running_the_model(harness):
    config = fakemodel_config()
    port = int(config.proxy.rsplit(":", 1)[1])
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", port))
        foreign.listen()
        model = harness.process(config)
        with pytest.raises(ModelStartError) as raised:
            await model.start()
    assert raised.value.reason == f"port {port} (from its proxy {config.proxy}) is in use by another process"
    assert raised.value.log_tail is None and harness.spawned == []
    assert model.state == "stopped"
    await model.start()  # once the port is free again, the model starts
    assert model.state == "ready"


async def test_a_health_check_answered_by_another_process_while_the_model_fails_is_not_ready(harness, tmp_path):
    """Another server takes the port between the check and the model's own bind: the model exits,
    and the other server's 200 must not make it ready."""
    port = model_ports(1)
    foreign_log, foreign_pid = tmp_path / "foreign.log", tmp_path / "foreign.pid"
    script = tmp_path / "loses_its_port.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        with open({str(foreign_log)!r}, "w") as log:
            foreign = subprocess.Popen([sys.executable, "-m", "fakemodel", "--port", "{port}"],
                                       start_new_session=True, stdout=log, stderr=log)
        open({str(foreign_pid)!r}, "w").write(str(foreign.pid))
        while "GET /health" not in open({str(foreign_log)!r}).read():  # the service asked, and got 200
            time.sleep(0.005)
        sys.exit(1)  # as a server does when its port is taken
    """))
    config = ModelConfigDouble(id="m", cmd=(sys.executable, str(script)), proxy=f"http://127.0.0.1:{port}")
    model = harness.process(config)
    try:
        with pytest.raises(ModelStartError) as raised:
            await model.start()
    finally:
        os.kill(int(foreign_pid.read_text()), signal.SIGKILL)
    assert raised.value.reason == (
        "exited with status 1 before becoming healthy, while another process answered its health check"
    )
    assert model.state == "stopped"


async def test_a_model_served_from_outside_its_group_becomes_ready_once_it_stays_up(harness, tmp_path):
    """Like a container whose port is forwarded by another process: the answer is not provably the
    model's own, so it counts once the model's process has stayed up after it."""
    port = model_ports(1)
    server_pid = tmp_path / "server.pid"
    script = tmp_path / "forwarded.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys
        server = subprocess.Popen([sys.executable, "-m", "fakemodel", "--port", "{port}"],
                                  start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(server_pid)!r}, "w").write(str(server.pid))
        server.wait()
    """))
    config = ModelConfigDouble(id="m", cmd=(sys.executable, str(script)), proxy=f"http://127.0.0.1:{port}")
    model = harness.process(config)
    try:
        await model.start()
        assert model.state == "ready"
        assert proctable.group_listens_on(model.pgid, port) is False
    finally:
        if server_pid.exists():
            os.kill(int(server_pid.read_text()), signal.SIGKILL)


async def test_a_model_on_another_host_without_a_health_check_starts(harness):
    # 192.0.2.0/24 is reserved for documentation: never an address of this machine.
    config = ModelConfigDouble(id="remote", cmd=("sleep", "300"), proxy="http://192.0.2.1:8080", check_endpoint=None)
    model = harness.process(config)
    await model.start()
    assert model.state == "ready"


async def test_a_health_check_that_cannot_run_fails_the_start_with_its_reason(harness):
    config = fakemodel_config(check_endpoint="/health\n")
    model = harness.process(config)
    with pytest.raises(ModelStartError) as raised:
        await model.start()
    assert raised.value.reason.startswith("its health check could not run: Invalid non-printable ASCII character")
    assert model.state == "stopped"


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


def test_log_ring_since_reads_what_came_after_a_cursor_even_once_trimmed_past_it():
    ring = LogRing(max_chars=20)
    ring.append("first\n")
    text, cursor = ring.since(None)
    assert (text, ring.since(cursor)) == ("first\n", ("", cursor))
    ring.append("second\n")
    ring.append("third\n")
    text, latest = ring.since(cursor)
    assert text == "second\nthird\n"
    ring.append("a line longer than the ring keeps\n")
    assert ring.since(latest)[0] == ring.text() == "than the ring keeps\n"
    assert ring.since(LogRing().since(None)[1])[0] == ring.text()  # another ring's cursor: a restarted worker


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
