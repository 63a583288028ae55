"""Through a real `llamaswap serve`: includeAliasesInList and capabilities in /v1/models,
filters.setParamsByID, upstream.ignorePaths, timeouts.idleConn, logToStdout and logTimeFormat."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.conftest import db_rows
from tests.e2e.held import sighup_reload
from tests.served import REPO, Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


def test_models_list_aliases_and_capabilities_and_set_params_by_id_follows_the_requested_name(tmp_path):
    config = f"""\
includeAliasesInList: true
models:
  m:
    cmd: {fake_cmd("m")}
    aliases: [chat]
    metadata: {{family: fake, context_length: 1}}
    capabilities: {{in: [text, image], out: [text], tools: true, context: 8192}}
    filters:
      setParams: {{temperature: 0.5}}
      setParamsByID:
        "${{MODEL_ID}}": {{reasoning_effort: medium}}
        "${{MODEL_ID}}:high": {{reasoning_effort: high, temperature: 0.9}}
  plain:
    cmd: {fake_cmd("plain")}
"""
    with Served(tmp_path, config) as served:
        listed = {entry["id"]: entry for entry in httpx.get(served.base + "/v1/models").json()["data"]}
        assert list(listed) == ["chat", "m", "m:high", "plain"]
        m = listed["m"]
        assert m["architecture"] == {"input_modalities": ["text", "image"], "output_modalities": ["text"],
                                     "modality": "text+image->text"}
        assert m["capabilities"] == {"vision": True, "function_calling": True}
        assert m["supported_parameters"] == ["tools", "tool_choice"]
        assert m["context_length"] == 8192 and m["meta"]["n_ctx"] == 8192
        # the rendered context wins over the metadata key of the same name
        assert m["meta"]["llamaswap"] == {"type": "model", "aliases": ["chat", "m:high"], "family": "fake"}
        for alias in ("chat", "m:high"):
            copy = listed[alias]
            assert copy["meta"]["llamaswap"] == {"type": "alias", "modelID": "m", "family": "fake"}
            assert {k: v for k, v in copy.items() if k not in ("id", "meta")} == \
                   {k: v for k, v in m.items() if k not in ("id", "meta")}
        assert "architecture" not in listed["plain"] and "meta" in listed["plain"]

        def forwarded(name: str) -> dict:
            answer = httpx.post(served.base + "/v1/rerank", json={"model": name, "query": "q"}, timeout=60)
            assert answer.status_code == 200, answer.text
            return answer.json()["body"]

        assert forwarded("m:high") == {"model": "m:high", "query": "q", "temperature": 0.9, "reasoning_effort": "high"}
        assert forwarded("m") == {"model": "m", "query": "q", "temperature": 0.5, "reasoning_effort": "medium"}
        assert forwarded("chat") == {"model": "chat", "query": "q", "temperature": 0.5}


def test_an_ignored_path_never_loads_the_model_and_reaches_it_once_ready(tmp_path):
    config = f"""\
models:
  m:
    cmd: {fake_cmd("m")}
"""
    with Served(tmp_path, config) as served:
        refused = httpx.get(served.base + "/upstream/m/app.js", timeout=30)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "model_not_loaded"
        assert "upstream.ignorePaths" in refused.json()["error"]["message"]
        assert httpx.get(served.base + "/running").json()["running"] == []

        assert httpx.post(served.base + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=60).status_code == 200
        rows_before = len(db_rows(served.data_dir))
        asset = httpx.get(served.base + "/upstream/m/static/app.js?v=1", timeout=30)
        assert asset.status_code == 200 and asset.json()["path"] == "/static/app.js?v=1"
        assert "x-llamaswap-request-id" not in asset.headers  # not scheduled: no row
        other = httpx.get(served.base + "/upstream/m/props", timeout=30)  # not ignored: scheduled as before
        assert other.status_code == 200 and "x-llamaswap-request-id" in other.headers
        wait_until(lambda: len(db_rows(served.data_dir)) == rows_before + 1, 10, what="the /props row")


SOCKET_SERVER = """\
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps each connection open until the client closes it

    def do_GET(self):
        if self.path != "/health":
            with open(sys.argv[2], "a") as seen:
                seen.write(f"{self.client_address[1]}\\n")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_idle_conn_drops_a_pooled_connection_after_its_idle_time(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SOCKET_SERVER)
    config = f"""\
models:
  brief:
    cmd: {sys.executable} {script} ${{PORT}} {tmp_path / "brief.ports"}
    timeouts: {{idleConn: 1}}
  lasting:
    cmd: {sys.executable} {script} ${{PORT}} {tmp_path / "lasting.ports"}
    timeouts: {{idleConn: 60}}
"""
    with Served(tmp_path, config) as served:
        for model in ("brief", "lasting"):
            for _ in range(2):
                assert httpx.get(f"{served.base}/upstream/{model}/x", timeout=60).text == "ok"
                time.sleep(2.5)  # idle for longer than 1 s, well under 60 s
        brief = (tmp_path / "brief.ports").read_text().split()
        lasting = (tmp_path / "lasting.ports").read_text().split()
        assert len(brief) == 2 and brief[0] != brief[1]  # a new connection after 1 s idle
        assert len(lasting) == 2 and lasting[0] == lasting[1]  # the pooled one was reused


TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d) INFO llamaswap\.\S+: model 'm' ready", re.M)


class SplitServed(Served):
    """`llamaswap serve` with its stdout and stderr kept apart."""

    def start(self, timeout: float = 30.0) -> SplitServed:
        self._log = open(self.log_path, "ab")
        self.stdout_path = self.tmp / "stdout.log"
        self._stdout = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "serve", "--config", str(self.config_path),
             "--listen", f"127.0.0.1:{self.port}"],
            cwd=REPO, env=self.env, stdout=self._stdout, stderr=self._log,
        )
        wait_until(lambda: _answers(self), timeout, 0.05, "llamaswap to answer /health")
        return self

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stop(self, *args, **kwargs) -> int:
        try:
            return super().stop(*args, **kwargs)
        finally:
            self._stdout.close()


def _answers(served: Served) -> bool:
    if served.proc.poll() is not None:
        raise AssertionError(f"llamaswap exited with {served.proc.returncode}:\n{served.log()}")
    try:
        return httpx.get(served.base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def load_m(served: Served) -> None:
    answer = httpx.post(served.base + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=60)
    assert answer.status_code == 200


def test_log_to_stdout_and_log_time_format(tmp_path):
    (tmp_path / "both").mkdir()
    (tmp_path / "absent").mkdir()
    keys = "logToStdout: both\nlogTimeFormat: rfc3339\n"
    with SplitServed(tmp_path / "both", keys + f"models:\n  m:\n    cmd: {fake_cmd('m')}\n") as served:
        load_m(served)
        wait_until(lambda: TIMESTAMPED.search(served.stdout()), 10, what="llamaswap's own line on stdout")
        wait_until(lambda: "fakemodel m listening on" in served.stdout(), 10, what="the model's output on stdout")
        assert "llamaswap.proxy" not in served.log() and "model 'm' ready" not in served.log()

        # A reload without the keys puts llamaswap's lines back on stderr, without a restart.
        sighup_reload(served, f"models:\n  m:\n    cmd: {fake_cmd('m')}\n")
        assert httpx.post(served.base + "/api/models/unload/m", timeout=60).text == "OK"
        wait_until(lambda: "model 'm' stopped" in served.log(), 10, what="the stop logged on stderr")
        assert "model 'm' stopped" not in served.stdout()

    # Without the keys: llamaswap's lines stay on stderr with their usual time, the model's output is not copied.
    with SplitServed(tmp_path / "absent", f"models:\n  m:\n    cmd: {fake_cmd('m')}\n") as served:
        load_m(served)
        wait_until(lambda: "model 'm' ready" in served.log(), 10, what="llamaswap's line on stderr")
        assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO llamaswap\.\S+: model 'm' ready", served.log(), re.M)
        assert "model 'm' ready" not in served.stdout() and "fakemodel m listening" not in served.stdout()
