"""`llamaswap serve` as an operator runs it: start-up failures exit non-zero with one clear line, and the
config's `logLevel` decides which lines the log shows, at start and after a reload."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.served import REPO, Served, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

# What every llamaswap log line starts with: date, time, level, logger.
LOG_LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) llamaswap\.[\w.]+: "


def config(log_level: str) -> str:
    return f"""
        logLevel: {log_level}
        models:
          m:
            cmd: {fake_cmd("m", None, "--tps", "0", "--tokens", "2")}
            proxy: http://127.0.0.1:${{PORT}}
    """


def serve_and_exit(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`llamaswap serve` expected to give up at start."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(textwrap.dedent(config("info")))
    env = {**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "serve", "--config", str(config_path), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def chat(served: Served, **fake) -> httpx.Response:
    return httpx.post(served.base + "/v1/chat/completions", timeout=60,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "fake": fake})


def log_lines(served: Served, pattern: str) -> list[re.Match]:
    found = (re.match(LOG_LINE + pattern, line) for line in served.log().splitlines())
    return [match for match in found if match]


def test_a_port_in_use_makes_serve_exit_non_zero_saying_why(tmp_path):
    port = model_ports(1)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = serve_and_exit(tmp_path, "--listen", f"127.0.0.1:{port}")
    assert result.returncode != 0, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"CommandError: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(choose another with --listen HOST:PORT)"
    )


@pytest.mark.parametrize("listen", ["127.0.0.1:70000", "127.0.0.1:-1", "127.0.0.1:0", "127.0.0.1:http"])
def test_an_invalid_port_makes_serve_exit_non_zero_saying_why(tmp_path, listen):
    result = serve_and_exit(tmp_path, "--listen", listen)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"CommandError: --listen '{listen}': the port must be a number from 1 to 65535"
    )


def test_a_client_timeout_of_zero_is_refused(tmp_path):
    result = serve_and_exit(tmp_path, "--client-timeout", "0")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "CommandError: --client-timeout 0: it must be above 0 seconds"


def test_log_level_debug_shows_info_lines_with_time_and_level(tmp_path):
    with Served(tmp_path, config("debug")) as served:
        assert chat(served).status_code == 200
        ready = wait_until(lambda: log_lines(served, r"model 'm' ready"), what="the 'ready' line")
        assert ready[0]["level"] == "INFO"


def test_log_level_warn_hides_info_lines_until_a_reload_sets_info(tmp_path):
    with Served(tmp_path, config("warn")) as served:
        assert chat(served).status_code == 200
        assert chat(served, crash_after=1).status_code == 502
        exited = wait_until(lambda: log_lines(served, r"model 'm' exited unexpectedly"), what="the crash warning")
        assert exited[0]["level"] == "WARNING"
        assert not log_lines(served, r"model 'm' ready"), served.log()

        served.config_path.write_text(served.config_path.read_text().replace("logLevel: warn", "logLevel: info"))
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: log_lines(served, r"config reloaded"), what="the reload, logged at INFO")
        assert chat(served).status_code == 200  # the crashed model starts again
        ready = wait_until(lambda: log_lines(served, r"model 'm' ready"), what="the 'ready' line")
        assert ready[0]["level"] == "INFO"
