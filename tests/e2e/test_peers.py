"""`peers:` through a real `llamaswap serve`: requests relayed to other servers, never queued, recorded.

The peers are the shipped fake model server, run directly as processes; each records the headers it
received, so the tests see what a peer was sent.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_distributed import distributed  # noqa: F401 (a fixture: the worker's database and Redis)
from tests.served import REPO, Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-caller-0123"
PEER_KEY = "sk-peer-box"
# Written into the `dead` peer's and the local model's proxy URLs: never shown anywhere.
USERINFO_SECRET = "hunter2-userinfo"
CALLER = {"Authorization": f"Bearer {KEY}", "Cookie": "session=caller"}


class Peer:
    """A fake model server standing in for another llama-swap."""

    def __init__(self, tmp, name: str) -> None:
        self.port = model_ports(1)
        self.events = tmp / f"{name}-events.jsonl"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fakemodel", "--port", str(self.port), "--model", name, "--tps", "0",
             "--events", str(self.events)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"

        def healthy():
            try:
                return httpx.get(self.url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 15, 0.05, f"peer {name} to answer /health")

    def starts(self) -> list[dict]:
        return [e for e in read_events(self.events) if e["event"] == "start"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peers")
    box, other = Peer(tmp, "box"), Peer(tmp, "other")
    dead_port = model_ports(1)  # nothing listens there
    local_events = tmp / "local-events.jsonl"
    text = f"""
        apiKeys: ["{KEY}"]
        captureBuffer: 1
        models:
          local:
            cmd: {fake_cmd("local", local_events, "--tps", "20")}
            proxy: http://bob:{USERINFO_SECRET}@127.0.0.1:${{PORT}}
        routing:
          scheduler:
            use: serial
        peers:
          box:
            proxy: {box.url}/
            apiKey: {PEER_KEY}
            models: [m1, shared, local]
            filters: {{stripParams: temperature}}
          other:
            proxy: {other.url}
            models: [shared]
          dead:
            proxy: http://bob:{USERINFO_SECRET}@127.0.0.1:{dead_port}
            models: [gone]
          loop:
            proxy: SELF_URL
            apiKey: {KEY}
            models: [local]
          slow:
            proxy: {box.url}
            models: [s1]
            timeouts: {{responseHeader: 1}}
    """
    served = Served(tmp, text)  # `loop` is this llamaswap itself, as another llamaswap would be a peer
    served.config_path.write_text(served.config_path.read_text().replace("SELF_URL", served.base))
    try:
        with served:
            served.local_events = local_events
            yield served, box, other
    finally:
        box.stop()
        other.stop()


def chat(served, model: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "fake": {"tokens": 3}, **extra}
    return httpx.post(served.base + "/v1/chat/completions", json=body, headers=CALLER, timeout=30)


def activity(served, request_id: str) -> dict:
    def found():
        data = httpx.get(served.base + "/api/activity", params={"limit": 200}, headers=CALLER, timeout=10).json()["data"]
        row = next((row for row in data if str(row["id"]) == request_id), None)
        return row if row and row["state"] not in ("queued", "dispatched") else None

    return wait_until(found, 10, 0.05, f"request {request_id} to end in /api/activity")


def test_qualified_name_reaches_the_peer_with_its_key_and_not_the_callers(setup):
    served, box, _ = setup
    r = chat(served, "box/m1", temperature=0.3)
    assert r.status_code == 200, r.text
    sent = box.starts()[-1]
    assert sent["model"] == "m1"  # the peer's own name for it
    assert sent["headers"]["authorization"] == f"Bearer {PEER_KEY}"
    assert sent["headers"]["x-api-key"] == PEER_KEY
    assert "cookie" not in sent["headers"]
    assert KEY not in json.dumps(sent["headers"])

    row = activity(served, r.headers["x-llamaswap-request-id"])
    assert (row["model"], row["peer"], row["state"], row["status_code"]) == ("box/m1", "box", "completed", 200)
    capture = httpx.get(served.base + f"/api/captures/{row['id']}", headers=CALLER, timeout=10).json()
    assert capture["req_headers"]["authorization"] == "[REDACTED]"
    assert json.loads(base64.b64decode(capture["req_body"]))["model"] == "m1"  # as sent to the peer, filtered
    assert "temperature" not in json.loads(base64.b64decode(capture["req_body"]))
    assert row["requested_model"] == "box/m1"
    assert row["output_tokens"] == 3
    assert r.headers["x-llamaswap-queue-wait-ms"] == "0"


def requests_total(served, model: str) -> float:
    text = httpx.get(served.base + "/metrics", headers=CALLER, timeout=10).text
    return sum(
        sample.value for family in text_string_to_metric_families(text) for sample in family.samples
        if sample.name == "llamaswap_requests_total" and sample.labels.get("model") == model
    )


def test_peer_requests_are_counted_in_the_metrics(setup):
    served, _, _ = setup
    before = requests_total(served, "other/shared")
    assert chat(served, "other/shared").status_code == 200
    wait_until(lambda: requests_total(served, "other/shared") == before + 1, 10, 0.05, "the request to be counted")


def test_a_get_route_names_the_model_as_the_peer_does(setup):
    served, box, _ = setup
    r = httpx.get(served.base + "/props", params={"model": "box/m1", "x": "a b"}, headers=CALLER, timeout=10)
    assert r.status_code == 200
    assert box.starts()[-1]["path"] == "/props?model=m1&x=a+b"
    assert activity(served, r.headers["x-llamaswap-request-id"])["method"] == "GET"


def test_a_bare_name_one_peer_lists_reaches_it(setup):
    served, box, other = setup
    before = len(other.starts())
    r = chat(served, "m1")
    assert r.status_code == 200
    assert box.starts()[-1]["model"] == "m1"
    assert len(other.starts()) == before


def test_a_bare_name_two_peers_list_is_404_naming_both(setup):
    served, _, _ = setup
    r = chat(served, "shared")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "box/shared" in message and "other/shared" in message
    r = chat(served, "other/shared")
    assert r.status_code == 200


def test_a_local_id_wins_over_a_peers_bare_name(setup):
    served, box, _ = setup
    before = len(box.starts())
    r = chat(served, "local")
    assert r.status_code == 200
    assert len(box.starts()) == before
    assert any(e["event"] == "start" for e in read_events(served.local_events))
    assert chat(served, "box/local").status_code == 200  # the qualified name still reaches the peer
    assert box.starts()[-1]["model"] == "local"


def test_streams_stream_through(setup):
    served, box, _ = setup
    body = {"model": "box/m1", "messages": [], "stream": True, "fake": {"tokens": 4}}
    with httpx.stream("POST", served.base + "/v1/chat/completions", json=body, headers=CALLER, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-accel-buffering"] == "no"
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
    row = activity(served, r.headers["x-llamaswap-request-id"])
    assert row["stream"] is True and row["peer"] == "box" and row["output_tokens"] == 4


def test_a_peer_that_is_a_llamaswap_answers_with_one_request_id_ours(setup):
    served, _, _ = setup
    r = chat(served, "loop/local")
    assert r.status_code == 200
    (request_id,) = r.headers.get_list("x-llamaswap-request-id")
    assert activity(served, request_id)["peer"] == "loop"


def test_an_unreachable_peer_is_502_with_a_hint(setup):
    served, _, _ = setup
    r = chat(served, "dead/gone")
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert "peer 'dead'" in message and "/v1/chat/completions" in message and "peers.dead.proxy" in message
    row = activity(served, r.headers["x-llamaswap-request-id"])
    assert (row["peer"], row["state"], row["status_code"]) == ("dead", "failed", 502)


def test_userinfo_in_a_proxy_url_is_never_shown(setup):
    served, _, _ = setup
    r = chat(served, "dead/gone")
    assert r.status_code == 502
    request_id = r.headers["x-llamaswap-request-id"]
    assert f"http://***@127.0.0.1:" in r.json()["error"]["message"]
    row = activity(served, request_id)
    assert "***@127.0.0.1" in row["error"] and "***@127.0.0.1" in row["explanation"]
    llama_swap_rows = httpx.get(served.base + "/api/metrics/activity", headers=CALLER, timeout=10).json()["data"]
    assert any(str(entry["id"]) == request_id for entry in llama_swap_rows)
    assert chat(served, "local").status_code == 200  # a model whose proxy URL has userinfo is served
    running = httpx.get(served.base + "/running", headers=CALLER, timeout=10).json()["running"]
    assert next(item["proxy"] for item in running if item["model"] == "local").startswith("http://***@127.0.0.1:")
    shown = [r.text, json.dumps(row), json.dumps(llama_swap_rows), json.dumps(running), served.log()]
    assert not [text for text in shown if USERINFO_SECRET in text or "bob:" in text]


def test_no_header_a_capture_redacts_reaches_a_peer(setup):
    served, _, other = setup
    secrets = {"x-api-key": KEY, "api-key": "azure-caller-key", "cookie": "session=caller",
               "proxy-authorization": "Basic Ym9iOnNlY3JldA==", "set-cookie": "id=caller",
               "x-goog-api-key": "google-caller-key", "ocp-apim-subscription-key": "apim-caller-key",
               "x-auth-token": "openstack-caller-token"}
    body = {"model": "other/shared", "messages": [], "fake": {"tokens": 1}}
    r = httpx.post(served.base + "/v1/chat/completions", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {KEY}", **secrets, "X-Custom": "kept"})
    assert r.status_code == 200, r.text
    sent = other.starts()[-1]["headers"]
    assert sent["x-custom"] == "kept"
    assert not {"authorization", *secrets} & set(sent), sent
    capture = httpx.get(served.base + f"/api/captures/{r.headers['x-llamaswap-request-id']}", headers=CALLER,
                        timeout=10).json()
    redacted = {name for name, value in capture["req_headers"].items() if value == "[REDACTED]"}
    assert redacted == {"authorization", *secrets}  # exactly what the peer was not sent


def test_a_peer_slower_than_its_response_header_timeout_is_504(setup):
    served, _, _ = setup
    began = time.monotonic()
    r = chat(served, "slow/s1", fake={"delay": 5, "tokens": 1})
    assert r.status_code == 504 and time.monotonic() - began < 4
    message = r.json()["error"]["message"]
    assert "peer 'slow'" in message and "peers.slow.timeouts" in message


def test_a_peers_own_error_answer_is_passed_on(setup):
    served, _, _ = setup
    r = chat(served, "box/m1", fake={"status": 503})
    assert r.status_code == 503
    assert "fake error 503" in r.text
    row = activity(served, r.headers["x-llamaswap-request-id"])
    assert (row["state"], row["status_code"]) == ("failed", 503)


def test_the_caller_still_needs_a_key(setup):
    served, box, _ = setup
    before = len(box.starts())
    r = httpx.post(served.base + "/v1/chat/completions", json={"model": "box/m1", "messages": []}, timeout=10)
    assert r.status_code == 401
    assert len(box.starts()) == before


def test_peer_models_are_listed(setup):
    served, _, _ = setup
    data = httpx.get(served.base + "/v1/models", headers=CALLER, timeout=10).json()["data"]
    peers = {entry["id"]: entry for entry in data if entry["meta"]["llamaswap"]["type"] == "peer"}
    assert set(peers) == {"box/m1", "box/shared", "box/local", "other/shared", "dead/gone", "slow/s1", "loop/local"}
    assert peers["box/m1"]["name"] == "box: m1" and peers["box/m1"]["meta"]["llamaswap"]["peerID"] == "box"
    assert "local" in {entry["id"] for entry in data if entry["meta"]["llamaswap"]["type"] == "model"}


def test_peer_models_are_in_the_model_status_events(setup):
    served, _, _ = setup
    with httpx.stream("GET", served.base + "/api/events", headers=CALLER, timeout=10) as r:
        for line in r.iter_lines():
            envelope = json.loads(line[len("data: "):]) if line.startswith("data: ") else {}
            if envelope.get("type") == "modelStatus":
                models = {m["id"]: m for m in json.loads(envelope["data"])}
                break
    assert models["box/m1"]["peerID"] == "box" and models["local"]["peerID"] == ""


def test_a_peer_request_does_not_wait_behind_a_busy_local_model(setup):
    served, _, _ = setup
    results: dict[str, httpx.Response] = {}

    def local(name: str) -> None:
        results[name] = chat(served, "local", fake={"tokens": 60})  # 3 s at 20 tokens/s

    def local_starts() -> int:
        return len([e for e in read_events(served.local_events) if e["event"] == "start"])

    def waiting_for_local() -> bool:
        data = httpx.get(served.base + "/api/queue", headers=CALLER, timeout=10).json()["data"]
        return any(entry["state"] == "waiting" and entry["model"] == "local" for entry in data)

    started = local_starts()
    first = threading.Thread(target=local, args=("first",))
    first.start()
    wait_until(lambda: local_starts() > started, 15, what="the long local request to start")
    second = threading.Thread(target=local, args=("second",))
    second.start()
    wait_until(waiting_for_local, 10, 0.05, "the second local request to wait behind the first")
    began = time.monotonic()
    r = chat(served, "box/m1")
    took = time.monotonic() - began
    assert r.status_code == 200
    assert took < 1.5, f"the peer request took {took:.1f}s: it waited for the local model"
    assert first.is_alive() and second.is_alive()
    first.join(30)
    second.join(30)
    assert results["first"].status_code == results["second"].status_code == 200


def test_distributed_front_end_records_peer_requests_through_the_worker(tmp_path, distributed):  # noqa: F811
    env, psycopg = distributed
    peer = Peer(tmp_path, "box")
    try:
        text = f"""
            startPort: {model_ports(1)}
            models:
              local: {{cmd: "{fake_cmd('local')}"}}
            peers:
              box: {{proxy: "{peer.url}", apiKey: {PEER_KEY}, models: [m1]}}
        """
        with Worker(tmp_path / "worker", text, env):
            (tmp_path / "fe").mkdir()
            with Served(tmp_path / "fe", text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / "fe" / "data")}) as front:
                r = httpx.post(front.base + "/v1/chat/completions", timeout=30,
                               json={"model": "box/m1", "messages": [], "fake": {"tokens": 2}})
                assert r.status_code == 200, r.text
                assert peer.starts()[-1]["headers"]["x-api-key"] == PEER_KEY
                request_id = int(r.headers["x-llamaswap-request-id"])

                def row():
                    with psycopg.connect(env["DATABASE_URL"]) as connection:
                        found = connection.execute(
                            "SELECT model, peer, state, status_code, output_tokens FROM scheduling_queuedrequest "
                            "WHERE id = %s", [request_id]).fetchone()
                    return found if found and found[2] == "completed" else None

                assert wait_until(row, 10, 0.05, "the worker to write the peer request's row") == (
                    "box/m1", "box", "completed", 200, 2)
                assert requests_total(front, "box/m1") == 1  # the front end that served it counts it
    finally:
        peer.stop()


def test_a_reload_moves_a_peer(tmp_path):
    first, second = Peer(tmp_path, "first"), Peer(tmp_path, "second")
    local = f"""
        models:
          local: {{cmd: "{fake_cmd('local')}", proxy: "http://127.0.0.1:${{PORT}}"}}
    """.rstrip(" ")

    def peers(url: str, models: str) -> str:
        return f"        peers:\n          box: {{proxy: \"{url}\", apiKey: k-{models}, models: [{models}]}}\n"

    try:
        with Served(tmp_path, local + peers(first.url, "m1"), extra_args=("--watch-config",)) as served:
            def post(model: str) -> httpx.Response:
                return httpx.post(served.base + "/v1/chat/completions", timeout=30,
                                  json={"model": model, "messages": [], "fake": {"tokens": 1}})

            assert post("box/m1").status_code == 200 and len(first.starts()) == 1
            start_port = served.config_path.read_text().split("\n", 1)[0]
            served.config_path.write_text(start_port + "\n" + textwrap.dedent(local + peers(second.url, "m2")))

            wait_until(lambda: post("box/m2").status_code == 200, 15, 0.2, "the reloaded peer to serve box/m2")
            assert second.starts()[-1]["headers"]["x-api-key"] == "k-m2"
            assert post("box/m1").status_code == 404
            listed = {m["id"] for m in httpx.get(served.base + "/v1/models", timeout=10).json()["data"]}
            assert "box/m2" in listed and "box/m1" not in listed
            assert len(first.starts()) == 1
    finally:
        first.stop()
        second.stop()


def test_a_peer_sees_the_priority_applied_here_not_the_callers_ask(setup):
    from tests.e2e.test_api_keys import new_key

    served, box, _ = setup
    capped = new_key(served, "capped-for-peers", "--max-priority", "-50")
    body = {"model": "box/m1", "messages": [], "fake": {"tokens": 1}}

    def sent(headers: dict[str, str]) -> dict[str, str]:
        r = httpx.post(served.base + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        return box.starts()[-1]["headers"]

    assert sent({"Authorization": f"Bearer {capped}", "X-LlamaSwap-Priority": "interactive"})[
        "x-llamaswap-priority"] == "-50"  # a peer trusting its own key would have run it at 100
    assert sent({**CALLER, "X-LlamaSwap-Priority": "batch"})["x-llamaswap-priority"] == "-100"
    assert "x-llamaswap-priority" not in sent(CALLER)  # none asked, none given: the peer's own default


def test_a_keys_quota_counts_its_peer_requests(setup):
    from tests.e2e.test_api_keys import new_key

    served, _, _ = setup
    limited = new_key(served, "one-peer-request-a-minute", "--rpm", "1")
    body = {"model": "box/m1", "messages": [], "fake": {"tokens": 1}}
    answers = [httpx.post(served.base + "/v1/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {limited}"}) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429], answers[-1].text
    assert "'one-peer-request-a-minute' is over its limit of 1 request per minute (rpm)" in answers[1].json()["error"]["message"]
