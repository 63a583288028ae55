"""SIGKILL of the service leaves model processes running; the restart must stop them, and only them.

Model servers are started the ways users start them — a script with a `#!/usr/bin/env python3`
line, `sh -c 'exec …'`, a shell wrapper that forks the server and waits, the `llamaswap fakemodel`
console script — so the command line the kernel shows is not the configured one. The service is
killed while the model is still loading and while it serves a load of concurrent requests. After
the restart the process table is scanned: nothing of the old process group may survive, the
model's port must be free, and the service must serve. Processes that merely reuse a recorded
process group id must survive.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import yaml

from tests.reliability.support import chat, group_members, model_pgid
from tests.served import REPO, Served, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

VENV_BIN = os.path.dirname(sys.executable)
MARKER_VARIABLE = "LLAMASWAP_PROCESS_MARKER"


def shebang_script(tmp: Path) -> str:
    script = tmp / "model-server"
    script.write_text(
        "#!/usr/bin/env python3\n"
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from fakemodel.server import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    return shlex.quote(str(script))


def model_cmd(kind: str, tmp: Path, server_args: list[str]) -> tuple[str, int]:
    """The `cmd:` of a fake model started as `kind`, and how many processes its group holds."""
    args = ["--port", "${PORT}", "--model", "m", *server_args]
    python = [sys.executable, "-m", "fakemodel"]
    if kind == "shebang script":
        return " ".join([shebang_script(tmp), *args]), 1
    if kind == "sh -c exec":
        return shlex.join(["sh", "-c", 'exec "$@"', "sh", *python, *args]), 1
    if kind == "forking shell wrapper":
        return shlex.join(["sh", "-c", '"$@" & wait', "sh", *python, *args]), 2
    if kind == "console script":
        return shlex.join(["llamaswap", "fakemodel", *args]), 1
    raise ValueError(kind)


KINDS = ["shebang script", "sh -c exec", "forking shell wrapper", "console script"]


def serve(tmp: Path, cmd: str, port: int) -> Served:
    config = yaml.safe_dump({
        "healthCheckTimeout": 120,
        "startPort": port,
        "models": {"m": {"cmd": cmd, "proxy": "http://127.0.0.1:${PORT}"}},
        "routing": {"scheduler": {"use": "serial"}},
    }, sort_keys=False, width=1 << 16)
    # `python3` in the script's `#!` line is the test's interpreter, which can import the fake model.
    return Served(tmp, config, env={"PATH": os.pathsep.join([VENV_BIN, os.environ["PATH"]])})


def chat_until_killed(base: str, **fake) -> None:
    try:
        chat(base, "m", timeout=120, **fake)
    except httpx.HTTPError:
        pass  # the service is about to be killed under this client


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kill_leftovers(pgid: int | None) -> None:
    if pgid is not None and group_members(pgid):
        os.killpg(pgid, signal.SIGKILL)


def while_starting(served: Served, events: Path, processes: int) -> int:
    """SIGKILL the service while its model loads; return the model's process group.

    The model must have printed its "listening" line first: printed into the pipe of a service
    already gone, it would end the fake model (BrokenPipeError), leaving no orphan to stop.
    """
    threading.Thread(target=chat_until_killed, args=(served.base,), daemon=True).start()
    pgid = model_pgid(served.data_dir, "m")
    wait_until(lambda: len(group_members(pgid)) == processes, what=f"{processes} processes in the model's group")
    wait_until(lambda: "fakemodel m listening on" in httpx.get(served.base + "/logs").text,
               what="the model to be up and loading")
    assert httpx.get(served.base + "/running").json()["running"][0]["state"] == "starting"
    return pgid


def under_load(served: Served, events: Path, processes: int) -> int:
    """SIGKILL the service while concurrent requests run and wait; return the model's process group."""
    for number in range(8):
        threading.Thread(target=chat_until_killed, args=(served.base,), kwargs={"id": str(number), "delay": 30},
                         daemon=True).start()
    wait_until(lambda: [e for e in read_events(events) if e["event"] == "start"], what="a request to reach the model")
    pgid = model_pgid(served.data_dir, "m")
    assert len(group_members(pgid)) == processes
    return pgid


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("moment", [while_starting, under_load], ids=["while starting", "under load"])
def test_restart_after_sigkill_stops_the_orphaned_model_group_frees_its_port_and_serves(tmp_path, kind, moment):
    events = tmp_path / "events.jsonl"
    port = model_ports(1)
    load_delay = ["--load-delay", "60"] if moment is while_starting else []
    cmd, processes = model_cmd(kind, tmp_path, [*load_delay, "--events", str(events)])
    served = serve(tmp_path, cmd, port).start()
    pgid = None
    try:
        pgid = moment(served, events, processes)
        served.kill()
        assert len(group_members(pgid)) == processes, "the model should have outlived the SIGKILLed service"

        # The restarted service gets a model that loads at once, so that it can show it serves.
        served.config_path.write_text(served.config_path.read_text().replace(" --load-delay 60", ""))
        served.start()
        assert group_members(pgid) == [], f"processes of the old model group survived the restart: {kind}"
        assert port_is_free(port)
        log = served.log()
        assert f"stopped process group {pgid} of model m, left running by a previous run" in log, log
        served.check_settled("m")
    finally:
        served.stop()
        kill_leftovers(pgid)


# -- recorded groups that are not (or no longer) the model's ----------------------------------------


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[22 - 3])


def orphaned_child(marker: str) -> tuple[int, int]:
    """A process group whose leader exited and whose forked child lives on: (pgid, child pid)."""
    leader = subprocess.Popen(["sh", "-c", "sleep 300 >/dev/null & echo $!"], start_new_session=True,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, MARKER_VARIABLE: marker})
    child = int(leader.stdout.readline())
    leader.stdout.close()
    leader.wait()
    return leader.pid, child


def insert_records(data_dir: Path, records: list[dict]) -> None:
    con = sqlite3.connect(data_dir / "llamaswap.sqlite3", timeout=5)
    try:
        with con:
            for record in records:
                started = record.get("started_at", datetime.now(timezone.utc))
                con.execute(
                    "INSERT INTO scheduling_modelprocessrecord (model, pid, pgid, cmdline, started_at, start_ticks, marker)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (record["model"], record["pgid"], record["pgid"], json.dumps(["model-server"]),
                     started.strftime("%Y-%m-%d %H:%M:%S.%f"), record["start_ticks"], record["marker"]),
                )
    finally:
        con.close()


def test_recovery_stops_only_the_groups_that_still_are_the_recorded_ones(tmp_path):
    served = serve(tmp_path, model_cmd("sh -c exec", tmp_path, [])[0], model_ports(1))
    served.start()
    assert served.stop() == 0  # the data dir now has its tables, and no records of its own

    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reused = subprocess.Popen(["sleep", "300"], start_new_session=True)
    before_boot = subprocess.Popen(["sleep", "300"], start_new_session=True)
    marked_group, marked_child = orphaned_child("a" * 32)
    unmarked_group, unmarked_child = orphaned_child("b" * 32)
    try:
        insert_records(served.data_dir, [
            {"model": "ours", "pgid": ours.pid, "start_ticks": start_ticks(ours.pid), "marker": "0" * 32},
            # The recorded pid now belongs to a process that started at another time.
            {"model": "reused", "pgid": reused.pid, "start_ticks": start_ticks(reused.pid) - 1, "marker": "1" * 32},
            {"model": "before-boot", "pgid": before_boot.pid, "start_ticks": start_ticks(before_boot.pid),
             "marker": "2" * 32, "started_at": datetime(2000, 1, 1, tzinfo=timezone.utc)},
            {"model": "marked", "pgid": marked_group, "start_ticks": 1, "marker": "a" * 32},
            {"model": "unmarked", "pgid": unmarked_group, "start_ticks": 1, "marker": "c" * 32},
        ])
        served.start()
        log = served.log()

        assert ours.wait(timeout=10) == -signal.SIGTERM
        wait_until(lambda: group_members(marked_group) == [], what="the forked child with the marker to be stopped")
        assert f"stopped process group {ours.pid} of model ours" in log
        assert f"stopped process group {marked_group} of model marked" in log
        assert "carry its marker" in log

        assert reused.poll() is None and before_boot.poll() is None
        assert group_members(unmarked_group) == [unmarked_child]
        assert f"not stopping process group {reused.pid} recorded for model reused" in log
        assert f"pid {reused.pid} is now another process" in log
        assert f"not stopping process group {before_boot.pid} recorded for model before-boot" in log
        assert "before the machine last booted" in log
        assert f"not stopping process group {unmarked_group} recorded for model unmarked" in log
        assert "none of the group's processes" in log
        assert all(" WARNING llamaswap.recovery: " in line for line in log.splitlines() if "process group" in line)
    finally:
        served.stop()
        for process in (ours, reused, before_boot):
            process.kill()
            process.wait()
        for pgid in (marked_group, unmarked_group):
            kill_leftovers(pgid)
