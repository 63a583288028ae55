"""llama-swap's captures and activity API through a real `llamaswap serve`: `captureBuffer` keeps each
request and response (credentials redacted) within its size, oldest dropped first, and nothing without
it; `/api/metrics/activity` and `/api/metrics/stats` read the request rows."""

from __future__ import annotations

import base64
import json
import textwrap

import httpx
import pytest

from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture
from tests.served import Served, Worker, fake_cmd, model_ports, wait_until

pytestmark = pytest.mark.e2e

KEY = "sk-captures-1"
AUTH = {"Authorization": f"Bearer {KEY}"}


def config(extra: str = "") -> str:
    return f"""
        apiKeys: ["{KEY}"]
        healthCheckTimeout: 20
        {extra}
        models:
          m:
            cmd: {fake_cmd("m")}
          n:
            cmd: {fake_cmd("n")}
    """


def chat(served, content: str = "hello", *, model: str = "m", stream: bool = False, headers: dict | None = None):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream, "fake": {"tps": 0}}
    reply = httpx.post(served.base + "/v1/chat/completions", json=body, headers={**AUTH, **(headers or {})}, timeout=60)
    assert reply.status_code == 200, reply.text
    return body, reply, int(reply.headers["x-llamaswap-request-id"])


def capture(served, request_id: int) -> httpx.Response:
    return httpx.get(f"{served.base}/api/captures/{request_id}", headers=AUTH, timeout=10)


def decoded(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def size_of(found: dict) -> int:
    """What a capture counts against captureBuffer: its path, bodies and header text."""
    headers = [*found["req_headers"].items(), *(found["resp_headers"] or {}).items()]
    return (len(found["req_path"]) + len(decoded(found["req_body"]) or b"") + len(decoded(found["resp_body"]) or b"")
            + sum(len(k) + len(v) for k, v in headers))


def ended(served, count: int) -> list[dict]:
    """The activity page once `count` requests have ended (rows are written behind the answers)."""
    def page():
        data = httpx.get(served.base + "/api/metrics/activity", params={"limit": 999}, headers=AUTH, timeout=10).json()
        return data if data["total"] >= count else None

    return wait_until(page, 20, 0.05, f"{count} ended requests in /api/metrics/activity")["data"]


def test_a_request_and_its_answer_are_captured_with_credentials_redacted(tmp_path):
    with Served(tmp_path, config("captureBuffer: 1")) as served:
        secret_headers = {"x-api-key": KEY, "Cookie": "session=s3cret", "X-Trace": "t-1"}
        body, reply, request_id = chat(served, "what is in a capture?", headers=secret_headers)
        assert httpx.get(f"{served.base}/api/captures/{request_id}", timeout=10).status_code == 401

        found = capture(served, request_id)
        assert found.status_code == 200, found.text
        data = found.json()
        assert data["id"] == request_id and data["req_path"] == "/v1/chat/completions"
        assert json.loads(decoded(data["req_body"])) == body
        assert decoded(data["resp_body"]) == reply.content
        headers = data["req_headers"]
        assert headers["authorization"] == headers["x-api-key"] == headers["cookie"] == "[REDACTED]"
        assert headers["x-trace"] == "t-1"
        assert KEY not in found.text and "s3cret" not in found.text
        assert data["resp_headers"]["x-llamaswap-request-id"] == str(request_id)
        assert data["resp_headers"]["content-type"].startswith("application/json")

        # A stream is kept as the client read it.
        with httpx.stream("POST", served.base + "/v1/chat/completions", headers=AUTH, timeout=60,
                          json={"model": "m", "messages": [], "stream": True, "fake": {"tps": 0}}) as streamed:
            sent = streamed.read()
            stream_id = int(streamed.headers["x-llamaswap-request-id"])
        streamed_capture = capture(served, stream_id).json()
        assert decoded(streamed_capture["resp_body"]) == sent and b"data: [DONE]" in sent
        assert streamed_capture["resp_headers"]["content-type"].startswith("text/event-stream")

        rows = {row["id"]: row for row in ended(served, 2)}
        assert rows[request_id]["has_capture"] is True and rows[stream_id]["has_capture"] is True


def test_a_small_buffer_drops_the_oldest_captures_and_ones_too_large_for_it(tmp_path):
    limit = int(0.004 * 1024 * 1024)
    with Served(tmp_path, config("captureBuffer: 0.004")) as served:
        ids = [chat(served, f"{i}" * 800)[2] for i in range(3)]  # about 1.7 kB each
        kept = [capture(served, request_id) for request_id in ids]
        assert [r.status_code for r in kept] == [404, 200, 200], [r.text for r in kept]
        sizes = [size_of(r.json()) for r in kept[1:]]
        assert sum(sizes) <= limit < sum(sizes) + min(sizes), sizes  # room for two, not three
        assert "evicted to make room" in kept[0].json()["error"]["message"]

        too_large = chat(served, "x" * limit)[2]
        refused = capture(served, too_large)
        assert refused.status_code == 404 and "larger than captureBuffer" in refused.json()["error"]["message"]
        assert [capture(served, request_id).status_code for request_id in ids[1:]] == [200, 200]


def test_without_a_capture_buffer_nothing_is_captured_and_the_activity_api_reads_the_rows(tmp_path):
    with Served(tmp_path, config()) as served:
        sent = [chat(served, "a", model=model)[2] for model in ("m", "m", "n", "m", "n")]
        missing = capture(served, sent[0])
        assert missing.status_code == 404 and "captures are off" in missing.json()["error"]["message"]

        rows = ended(served, 5)
        assert [row["id"] for row in rows] == sorted(sent, reverse=True)
        assert not any(row["has_capture"] for row in rows)
        by_id = {row["id"]: row for row in rows}
        assert all(row["resp_status_code"] == 200 and row["tokens"]["output_tokens"] > 0 for row in rows)

        def activity(**params):
            reply = httpx.get(served.base + "/api/metrics/activity", params=params, headers=AUTH, timeout=10)
            assert reply.status_code == 200, reply.text
            return reply.json()

        only_n = activity(model="n")
        assert [row["id"] for row in only_n["data"]] == [sent[4], sent[2]] and only_n["total"] == 2
        second = activity(limit=2, page=2, order="asc")
        assert [row["id"] for row in second["data"]] == sent[2:4] and second["total_pages"] == 3
        by_model = activity(sort="model", order="asc")["data"]
        assert [row["model"] for row in by_model] == ["m", "m", "m", "n", "n"]
        window = activity(min_id=sent[1], max_id=sent[3])
        assert [row["id"] for row in window["data"]] == [sent[3], sent[2], sent[1]]
        bad = httpx.get(served.base + "/api/metrics/activity", params={"limit": 1000}, headers=AUTH, timeout=10)
        assert bad.status_code == 400 and "limit" in bad.json()["error"]["message"]

        stats = httpx.get(served.base + "/api/metrics/stats", headers=AUTH, timeout=10).json()
        assert stats["total_requests"] == 5
        assert stats["total_input_tokens"] == sum(row["tokens"]["input_tokens"] for row in rows)
        assert stats["total_output_tokens"] == sum(row["tokens"]["output_tokens"] for row in rows)
        speeds = sorted(row["tokens"]["tokens_per_second"] for row in rows)
        assert stats["gen_histogram"]["min"] == speeds[0] and stats["gen_histogram"]["max"] == speeds[-1]
        assert sum(stats["gen_histogram"]["bins"]) == 5 and stats["gen_histogram"]["p50"] == speeds[2]
        n_stats = httpx.get(served.base + "/api/metrics/stats", params={"model": "n"}, headers=AUTH, timeout=10).json()
        assert n_stats["total_output_tokens"] == sum(by_id[i]["tokens"]["output_tokens"] for i in (sent[2], sent[4]))

        version = httpx.get(served.base + "/api/version", headers=AUTH, timeout=10).json()
        assert set(version) == {"version", "commit", "build_date"} and version["version"] != "unknown"


def test_in_distributed_mode_the_front_end_that_relayed_a_request_holds_its_capture(tmp_path, distributed):
    env, _ = distributed
    text = f"""
        captureBuffer: 1
        startPort: {model_ports(2)}
        models:
          m: {{cmd: "{fake_cmd('m')}"}}
    """
    with Worker(tmp_path / "worker", textwrap.dedent(text), env):
        front = []
        for name in ("fe1", "fe2"):
            (tmp_path / name).mkdir()
            front.append(Served(tmp_path / name, text, env={**env, "LLAMASWAP_DATA_DIR": str(tmp_path / name / "data")}))
        with front[0] as relaying, front[1] as other:
            reply = httpx.post(relaying.base + "/v1/chat/completions", timeout=60,
                               json={"model": "m", "messages": [], "fake": {"tps": 0}})
            assert reply.status_code == 200, reply.text
            request_id = int(reply.headers["x-llamaswap-request-id"])
            assert decoded(httpx.get(f"{relaying.base}/api/captures/{request_id}", timeout=10).json()["resp_body"]) == reply.content
            elsewhere = httpx.get(f"{other.base}/api/captures/{request_id}", timeout=10)
            assert elsewhere.status_code == 404 and "did not relay it" in elsewhere.json()["error"]["message"]

            def row(served):
                data = httpx.get(served.base + "/api/metrics/activity", timeout=10).json()["data"]
                return data[0] if data and data[0]["id"] == request_id else None

            # Both front ends list the shared row; only the one that relayed it has its capture.
            assert wait_until(lambda: row(relaying), 20, 0.05, "the row on the relaying front end")["has_capture"] is True
            assert wait_until(lambda: row(other), 20, 0.05, "the row on the other front end")["has_capture"] is False
