"""What a hostile model server or peer answers, and what a caller sends a peer, through a real `llamaswap serve`.

Answers nested too deeply to parse are passed on and recorded with their status (and no token counts);
a peer's stream outliving a shutdown's drain ends as a local one does; headers and queries reach the
peer as sent.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from tests.e2e.conftest import db_rows
from tests.e2e.hostile_upstream import NESTED
from tests.e2e.test_peers import Peer
from tests.served import REPO, Served, TERMINAL_STATES, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

HOSTILE_CMD = f"{sys.executable} -m tests.e2e.hostile_upstream --port ${{PORT}}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    port = model_ports(1)
    peer = subprocess.Popen([sys.executable, "-m", "tests.e2e.hostile_upstream", "--port", str(port)], cwd=REPO)
    text = f"""
        models:
          local:
            cmd: {HOSTILE_CMD}
            proxy: http://127.0.0.1:${{PORT}}
          streamer:
            cmd: {fake_cmd("streamer", None, "--tps", "0")}
            proxy: http://127.0.0.1:${{PORT}}
        peers:
          hostile: {{proxy: "http://127.0.0.1:{port}", models: [h]}}
          loop: {{proxy: SELF_URL, models: [streamer]}}
    """
    served = Served(tmp, text)  # `loop` is this llamaswap itself, as another llamaswap would be a peer
    served.config_path.write_text(served.config_path.read_text().replace("SELF_URL", served.base))
    try:
        with served:
            yield served
    finally:
        peer.terminate()
        peer.wait(10)


def row(served, response: httpx.Response) -> dict:
    request_id = int(response.headers["x-llamaswap-request-id"])

    def ended():
        rows = db_rows(served.data_dir, "id = ?", (request_id,))
        return rows[0] if rows and rows[0]["state"] in TERMINAL_STATES else None

    return wait_until(ended, 10, 0.05, f"request {request_id}'s row to end")


@pytest.mark.parametrize("model", ["hostile/h", "local"])
@pytest.mark.parametrize(("mode", "status"), [("json", 200), ("error", 500), ("sse", 200)])
def test_an_answer_nested_too_deeply_to_parse_is_passed_on_and_recorded_with_its_status(served, model, mode, status):
    body = {"model": model, "messages": [], "stream": mode == "sse", "hostile": mode}
    r = httpx.post(served.base + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status
    assert NESTED in r.content
    recorded = row(served, r)
    assert (recorded["state"], recorded["status_code"]) == ("completed" if status == 200 else "failed", status)
    assert recorded["input_tokens"] is None and recorded["output_tokens"] is None
    assert "RecursionError" not in served.log()


@pytest.mark.parametrize("model", ["hostile/h", "local"])
def test_an_answer_cut_short_of_its_content_length_closes_the_connection(served, model):
    """The client learns at once that the body is not whole, rather than waiting for bytes that never come."""
    body = {"model": model, "messages": [], "hostile": "short"}
    with httpx.Client(timeout=httpx.Timeout(30, read=20)) as client:
        with client.stream("POST", served.base + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete|without sending complete"):
                r.read()
    if model == "local":
        recorded = row(served, r)
        assert (recorded["state"], recorded["status_code"]) == ("failed", 502)


@pytest.mark.parametrize("model", ["hostile/h", "local"])
def test_a_chunked_answer_that_also_names_a_content_length_is_passed_on_whole_without_it(served, model):
    """Transfer-Encoding overrides Content-Length: passing on the length would cut the body short for the client,
    and what it did not read would be taken for the next answer on its connection."""
    body = {"model": model, "messages": [], "hostile": "both"}
    with httpx.Client(timeout=30) as client:
        r = client.post(served.base + "/v1/chat/completions", json=body)
        assert r.status_code == 200
        assert r.content == b"hello world"
        assert "content-length" not in r.headers
        assert client.get(served.base + "/health").text == "OK"  # the same connection, in step


def test_a_malformed_max_wait_is_refused_for_a_peer_as_for_a_local_model(served):
    def chat(max_wait: str) -> httpx.Response:
        return httpx.post(served.base + "/v1/chat/completions", json={"model": "hostile/h", "messages": []},
                          headers={"X-LlamaSwap-Max-Wait": max_wait}, timeout=60)

    refused = chat("garbage")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_max_wait"
    assert chat("30").status_code == 200  # valid, and moot: a peer's request never waits in this queue


def test_a_stream_through_a_peer_that_is_a_llamaswap_says_x_accel_buffering_once(served):
    body = {"model": "loop/streamer", "messages": [], "stream": True, "fake": {"tokens": 2}}
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        r.read()
    assert r.headers.get_list("x-accel-buffering") == ["no"]


def test_a_peer_gets_the_query_bytes_as_sent_with_only_the_model_renamed(served):
    r = httpx.get(served.base + "/props?model=hostile/h&x=%00%ff&y=a+b%2B", timeout=30)
    assert r.status_code == 200
    assert r.json()["path"] == "/props?model=h&x=%00%ff&y=a+b%2B"


def test_sigterm_ends_a_peer_stream_longer_than_the_drain_with_a_shutting_down_event(tmp_path):
    peer = Peer(tmp_path, "pm")
    served = Served(tmp_path, f"""
        models:
          local: {{cmd: "{fake_cmd('local')}"}}
        peers:
          pa: {{proxy: "{peer.url}", models: [pm]}}
    """, extra_args=("--drain-seconds", "1")).start()
    body = {"model": "pa/pm", "messages": [], "stream": True, "fake": {"tokens": 10_000, "tps": 20}}
    try:
        with httpx.stream("POST", served.base + "/v1/chat/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            exit_status = served.stop(signal.SIGTERM, timeout=10)
            payloads = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    finally:
        served.kill()
        peer.stop()

    assert exit_status == 0
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == "shutting_down", error
    [recorded] = db_rows(served.data_dir)
    assert (recorded["peer"], recorded["state"], recorded["status_code"], recorded["error"]) == (
        "pa", "cancelled", 503, error["message"])
