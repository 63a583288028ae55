"""API keys as rows, end to end: keys made by `llamaswap keys create` against a running `llamaswap serve`,
used by real clients. Scopes (models, operator, read-only), the priority clamp as the rows record it, a key
revoked while the server runs, and the secret kept out of the model's requests, the rows and the log."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
import websocket
from openai import OpenAI, PermissionDeniedError
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import close_frame
from tests.e2e.test_distributed import config_text, distributed, two_front_ends  # noqa: F401 - the fixture
from tests.served import REPO, Served, fake_cmd, read_events, wait_until

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"


def config(events) -> str:
    return f"""
        healthCheckTimeout: 20
        models:
          qwen3:
            cmd: {fake_cmd("qwen3", events)}
            aliases: [chat]
          llama:
            cmd: {fake_cmd("llama", events)}
            aliases: [big]
    """


def run_keys(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`llamaswap keys …` with the environment `env`."""
    return subprocess.run([sys.executable, str(REPO / "manage.py"), "keys", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def keys(served: Served, *args: str) -> str:
    """`llamaswap keys …` against the served instance's database; its output."""
    done = run_keys(served.env, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def new_key(served: Served, name: str, *args: str) -> str:
    """A key made by the command: the secret is its last line."""
    return keys(served, "create", name, *args).strip().splitlines()[-1]


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat(served: Served, model: str, secret: str | None, **headers: str) -> httpx.Response:
    sent = {**(auth(secret) if secret else {}), **headers}
    return httpx.post(served.base + CHAT, headers=sent, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-keys")
    with Served(tmp, config(tmp / "events.jsonl")) as s:
        s.events = tmp / "events.jsonl"
        assert chat(s, "qwen3", None).status_code == 200  # no key anywhere: open, as before
        s.secrets = {
            "scoped": new_key(s, "scoped", "--models", "qwen*", "--max-priority", "normal",
                              "--default-priority", "-100"),
            "plain": new_key(s, "plain"),
            "ops": new_key(s, "ops", "--operator"),
            "reader": new_key(s, "reader", "--read-only", "--rpm", "60", "--weight", "3"),
        }
        yield s


def test_a_key_row_puts_every_route_behind_a_key_within_two_seconds(served):
    wait_until(lambda: chat(served, "qwen3", None).status_code == 401, 2.0, 0.05, "a keyless request refused")
    for path in ("/v1/models", "/running", "/api/queue", "/logs"):
        assert httpx.get(served.base + path).status_code == 401, path
    assert chat(served, "qwen3", "lsk-made-up-secret-that-is-no-key").status_code == 401


def test_a_scoped_key_reaches_its_models_only_and_lists_only_them(served):
    secret = served.secrets["scoped"]
    client = OpenAI(base_url=served.base + "/v1", api_key=secret, max_retries=0)
    reply = client.chat.completions.create(model="qwen3", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices[0].message.content
    with pytest.raises(PermissionDeniedError) as refused:
        client.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "'scoped'" in str(refused.value) and "'llama'" in str(refused.value)
    assert chat(served, "chat", secret).status_code == 200  # an alias reaches the model it names
    assert sorted(model.id for model in client.models.list()) == ["qwen3"]
    everything = httpx.get(served.base + "/v1/models", headers=auth(served.secrets["plain"])).json()["data"]
    assert sorted(entry["id"] for entry in everything) == ["llama", "qwen3"]


@pytest.mark.parametrize("model", ["llama", "big", "no-such-model"])
def test_a_scoped_key_is_told_nothing_of_the_models_outside_its_scope(served, model):
    """The same 403 for a model outside the key's scope, an alias of one (named as asked, not as the model it
    names) and a name configured nowhere: whether a model exists is not the key's to learn."""
    refused = chat(served, model, served.secrets["scoped"])
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"] == {"message": f"the API key 'scoped' may not use model '{model}'",
                                       "type": "permission_error", "param": None, "code": "model_not_allowed"}


def test_a_name_within_the_keys_scope_that_is_configured_nowhere_is_not_found(served):
    missing = chat(served, "qwen-none", served.secrets["scoped"])
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found", missing.text


def refusals_of(served: Served, key: str, status: str) -> float:
    """`llamaswap_key_refusals_total` of the row key `key` with `status`, as /metrics shows it now."""
    text = httpx.get(served.base + "/metrics", headers=auth(served.secrets["ops"])).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "llamaswap_key_refusals_total" and sample.labels == {"key": key, "status": status})


def test_operator_routes_need_an_operator_key(served):
    plain, ops = auth(served.secrets["plain"]), auth(served.secrets["ops"])
    counted_before = refusals_of(served, "plain", "403")
    refused = [
        httpx.post(served.base + "/api/models/unload", headers=plain),
        httpx.get(served.base + "/logs", headers=plain),
        httpx.get(served.base + "/logs/stream", headers=plain),
        httpx.get(served.base + "/api/captures/1", headers=plain),
        httpx.post(served.base + "/api/leases", headers=plain, json={"model": "qwen3", "seconds": 60}),
        httpx.delete(served.base + "/api/leases/1", headers=plain),
        httpx.delete(served.base + "/api/queue/1", headers=plain),
        httpx.patch(served.base + "/api/queue/1", headers=plain, json={"priority": 5}),
        httpx.post(served.base + "/api/inflight/1/cancel", headers=plain),
        httpx.put(served.base + "/api/profiles/active", headers=plain, json={"name": None}),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert all(r.json()["error"]["code"] == "operator_key_required" for r in refused)
    assert refusals_of(served, "plain", "403") == counted_before + len(refused)  # for its usage page too
    assert httpx.get(served.base + "/running", headers=plain).status_code == 200  # reads are anyone's
    assert httpx.get(served.base + "/api/leases", headers=plain).status_code == 200
    assert httpx.get(served.base + "/logs", headers=ops).status_code == 200
    assert httpx.post(served.base + "/api/models/unload", headers=ops).status_code == 200


def test_a_read_only_key_reads_and_sends_no_inference(served):
    reader = served.secrets["reader"]
    refused = chat(served, "qwen3", reader)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "key_read_only"
    assert httpx.get(served.base + "/upstream/qwen3/health", headers=auth(reader)).status_code == 403
    for path in ("/running", "/api/queue", "/api/activity", "/v1/models", "/metrics"):
        assert httpx.get(served.base + path, headers=auth(reader)).status_code == 200, path


@pytest.mark.parametrize("key, model, reason", [("scoped", "llama", "may not use the model at /upstream/llama/ws"),
                                                ("reader", "qwen3", "read-only")])
def test_a_websocket_is_refused_what_the_key_may_not_do(served, key, model, reason):
    url = served.base.replace("http://", "ws://") + f"/upstream/{model}/ws"
    counted_before = refusals_of(served, key, "403")
    ws = websocket.create_connection(url, header=[f"Authorization: Bearer {served.secrets[key]}"], timeout=15)
    try:
        assert close_frame(ws)[0] == 4403  # daphne drops close reasons: the log has it
        wait_until(lambda: reason in served.log(), 5, 0.05, "the refusal's reason in the log")
    finally:
        ws.close()
    assert refusals_of(served, key, "403") == counted_before + 1  # counted for its usage page, as a request's is


def test_the_priority_is_clamped_and_the_row_keeps_both_the_asked_and_the_applied_one(served):
    secret = served.secrets["scoped"]
    asked = chat(served, "qwen3", secret, **{"X-LlamaSwap-Priority": "interactive"})
    none = chat(served, "qwen3", secret)
    low = chat(served, "qwen3", secret, **{"X-LlamaSwap-Priority": "-5"})
    unrestricted = chat(served, "qwen3", served.secrets["plain"], **{"X-LlamaSwap-Priority": "interactive"})
    ids = [int(r.headers["x-llamaswap-request-id"]) for r in (asked, none, low, unrestricted)]

    def rows():
        found = {row["id"]: row for row in served.rows() if row["id"] in ids and row["state"] == "completed"}
        return [found[i] for i in ids] if len(found) == len(ids) else None

    recorded = wait_until(rows, 10, 0.05, "the four rows to complete")
    assert [(r["api_key"], r["asked_priority"], r["priority"]) for r in recorded] == [
        ("scoped", 100, 0), ("scoped", None, -100), ("scoped", -5, -5), ("plain", 100, 100)]
    shown = httpx.get(served.base + f"/api/queue/{ids[0]}", headers=auth(secret)).json()
    assert (shown["api_key"], shown["asked_priority"], shown["priority"], shown["band"]) == ("scoped", 100, 0, "normal")


def test_no_secret_reaches_the_model_the_rows_or_the_log(served):
    assert chat(served, "qwen3", served.secrets["plain"]).status_code == 200
    seen = [event.get("headers", {}) for event in read_events(served.events)]
    assert seen and not any({"authorization", "x-api-key"} & set(headers) for headers in seen)
    stored = " ".join(str(value) for row in served.rows() for value in row.values())
    text = served.log()
    for secret in served.secrets.values():
        assert secret not in stored and secret not in text


@pytest.mark.parametrize("path", [CHAT, "/upstream/qwen3/v1/chat/completions"])
def test_the_admins_session_and_csrf_cookies_reach_no_model_and_other_cookies_do(served, path):
    def sent_cookie(request_id: str, cookie: str) -> str | None:
        answer = httpx.post(served.base + path, timeout=30, headers={**auth(served.secrets["plain"]), "Cookie": cookie},
                            json={"model": "qwen3", "messages": [], "max_tokens": 2, "fake": {"id": request_id}})
        assert answer.status_code == 200
        seen = [event["headers"] for event in read_events(served.events) if event.get("id") == request_id]
        return seen[0].get("cookie") if seen else "no request"

    mixed = "sessionid=admin-session; theme=dark; csrftoken=admin-csrf; lang=en"
    assert sent_cookie(f"cookies-mixed-{path}", mixed) == "theme=dark; lang=en"
    assert sent_cookie(f"cookies-own-{path}", "sessionid=admin-session;csrftoken=admin-csrf") is None


@pytest.mark.parametrize("action", [["list"], ["create", "app"]])
def test_keys_before_the_database_is_migrated_says_how_in_one_line_and_creates_no_database(tmp_path, action):
    env = {**os.environ, "LLAMASWAP_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("DATABASE_URL", None)
    done = run_keys(env, *action)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert str(tmp_path / "llamaswap.sqlite3") in done.stderr and "`llamaswap migrate`" in done.stderr
    assert not (tmp_path / "llamaswap.sqlite3").exists()


@pytest.mark.parametrize("models", [[""], ["  "], ["qwen*", ""]])
def test_an_empty_models_glob_is_an_error_not_a_key_for_every_model(served, models):
    done = run_keys(served.env, "create", "blank", "--models", *models)
    assert done.returncode != 0 and "leave --models out for every model" in done.stderr, done.stderr
    assert "blank" not in {line.split("\t")[0] for line in keys(served, "list").splitlines()}


def test_the_list_shows_each_key_without_its_secret(served):
    listed = keys(served, "list")
    assert {line.split("\t")[0] for line in listed.splitlines()} >= {"scoped", "plain", "ops", "reader"}
    assert "rpm=60" in listed and "weight=3" in listed and "read-only" in listed
    assert not any(secret in listed for secret in served.secrets.values())


def test_a_key_revoked_while_the_server_runs_is_refused_within_two_seconds(served):
    secret = new_key(served, "short-lived")
    wait_until(lambda: chat(served, "qwen3", secret).status_code == 200, 2.0, 0.05, "the new key accepted")
    keys(served, "revoke", "short-lived")
    revoked_at = time.monotonic()
    refused = wait_until(lambda: (r := chat(served, "qwen3", secret)).status_code == 401 and r, 2.0, 0.02,
                         "the revoked key refused")
    assert "revoked" in refused.json()["error"]["message"]
    assert time.monotonic() - revoked_at < 2.0


def test_the_models_log_text_in_api_events_is_for_operators_only(served):
    assert chat(served, "qwen3", served.secrets["plain"]).status_code == 200  # the model has logged something

    def first_payload(secret: str) -> str:
        with httpx.stream("GET", served.base + "/api/events", headers=auth(secret), timeout=10) as events:
            return next(events.iter_text())

    assert '"logData"' in first_payload(served.secrets["ops"])
    plain = first_payload(served.secrets["plain"])
    assert '"modelStatus"' in plain and '"logData"' not in plain


def test_every_front_end_takes_a_new_and_a_revoked_key_within_two_seconds(tmp_path, distributed):  # noqa: F811
    env, _ = distributed
    text = config_text(tmp_path / "events.jsonl")
    with two_front_ends(tmp_path, text, env) as (first, second):
        assert [chat(fe, "chat", None).status_code for fe in (first, second)] == [200, 200]
        secret = new_key(first, "shared", "--models", "chat")
        deadline = time.monotonic() + 2.0
        for fe in (first, second):  # both within 2 s of the key's making, not each; the read that
            # switches the guard on brings the key too
            wait_until(lambda: chat(fe, "chat", None).status_code == 401, deadline - time.monotonic(), 0.02,
                       f"{fe.base} to take the new key")
        for fe in (first, second):
            assert chat(fe, "chat", secret).status_code == 200 and chat(fe, "coder", secret).status_code == 403
        keys(second, "revoke", "shared")
        deadline = time.monotonic() + 2.0
        for fe in (first, second):
            wait_until(lambda: chat(fe, "chat", secret).status_code == 401, deadline - time.monotonic(), 0.02,
                       f"{fe.base} to refuse the revoked key")
        rows = [row for row in first.rows() if row["api_key"] == "shared"]
        assert rows and all(row["model"] == "chat" for row in rows)
