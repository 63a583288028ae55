"""A config with a secret in the wrong shape is refused naming the key path, never the value: by
`serve --check`, by `serve` at start, and in the log of a rejected reload."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.served import REPO, Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e

SECRET = "sk-never-shown-52e1"
GOOD_MODEL = "models:\n  m: {{cmd: \"{cmd}\", proxy: 'http://127.0.0.1:${{PORT}}'}}\n"
# Three ways to get a key wrong, each with the key in it: a string for apiKeys, a list for a peer's
# apiKey, and a peer URL with userinfo and a query.
BAD = (
    f"apiKeys: {SECRET}\n"
    f"peers:\n  box: {{proxy: 'http://bob:{SECRET}@127.0.0.1:9/?a=1', models: [a], apiKey: [{SECRET}]}}\n"
)
PROBLEMS = ("apiKeys: expected a list, got a string", "peers.box.apiKey: expected text, got a list",
            "peers.box.proxy: \"http://***@127.0.0.1:9/?…\" has a query")


def serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "serve", "--config", str(tmp_path / "config.yaml"), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "LLAMASWAP_DATA_DIR": str(tmp_path / "data")},
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("args", [("--check",), ("--listen", "127.0.0.1:0")])
def test_check_and_start_name_the_keys_not_their_values(tmp_path, args):
    (tmp_path / "config.yaml").write_text(BAD + GOOD_MODEL.format(cmd=fake_cmd("m")))
    done = serve(tmp_path, *args)
    shown = done.stdout + done.stderr
    assert done.returncode != 0
    assert all(problem in shown for problem in PROBLEMS), shown
    assert SECRET not in shown


def test_a_rejected_reload_logs_the_keys_not_their_values(tmp_path):
    good = GOOD_MODEL.format(cmd=fake_cmd("m"))
    with Served(tmp_path, good, extra_args=("--watch-config",)) as served:
        start_port = served.config_path.read_text().split("\n", 1)[0]
        served.config_path.write_text(f"{start_port}\n{BAD}{good}")
        wait_until(lambda: "config reload rejected" in served.log(), 15, what="the reload to be refused")
        log = served.log()
        assert all(problem in log for problem in PROBLEMS), log
        assert SECRET not in log


def test_a_models_command_line_key_is_never_shown(tmp_path):
    """llama-server's own `--api-key` on a model's `cmd:` stays out of `/running`, the summary and the log."""
    cmd = f"sh -c 'exec {fake_cmd('m')}' --api-key {SECRET}"  # sh takes the two trailing words as $0 and $1
    with Served(tmp_path, GOOD_MODEL.format(cmd=cmd.replace('"', '\\"'))) as served:
        answer = httpx.post(served.base + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=60)
        assert answer.status_code == 200
        running = httpx.get(served.base + "/running", timeout=10).json()["running"]
        assert running and "--api-key ***" in running[0]["cmd"] and SECRET not in str(running)
        log = served.log()
    assert "--api-key ***" in log and SECRET not in log


def test_a_model_server_that_prints_its_command_line_shows_no_key(tmp_path):
    """An argument error echoes the arguments (argparse does): the key is masked in the answer and /logs."""
    cmd = f"sh -c 'echo error: unrecognized arguments: $*; exit 2' --port ${{PORT}} --api-key={SECRET}"
    with Served(tmp_path, GOOD_MODEL.format(cmd=cmd)) as served:
        answer = httpx.post(served.base + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=60)
        assert answer.status_code == 503 and "unrecognized arguments" in answer.text, answer.text
        assert "--api-key=***" in answer.text and SECRET not in answer.text
        logs = httpx.get(served.base + "/logs", timeout=10).text
        assert "unrecognized arguments" in logs and SECRET not in logs
        assert SECRET not in served.log()
