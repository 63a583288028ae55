"""What a key is shown, end to end against `llamaswap serve`: a key limited to some models sees only those models'
state, and a key that is not an operator's sees only its own requests — in /running, /api/events, /api/activity,
/api/metrics/*, /api/queue, /api/placement and /metrics — while an operator key sees everything."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.e2e.test_api_keys import auth, chat, new_key
from tests.e2e.test_key_quotas import Held
from tests.e2e.test_key_revocation import config_text
from tests.served import Served, fake_cmd, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("key-visibility")
    events = tmp / "events.jsonl"
    text = config_text({name: f'cmd: "{fake_cmd(name, events)}", memory: 10GiB' for name in ("chat", "llama")},
                       "metricsRequireApiKey: true\nhardware: {gpus: [{id: 0, memory: 24GiB}, {id: 1, memory: 24GiB}]}\n"
                       "profiles: {night: {pins: {chat: chat, llama: llama}}}")
    with Served(tmp, text) as s:
        s.secrets = {name: new_key(s, name, *args) for name, args in (
            ("tenant", ("--models", "chat")), ("neighbour", ("--models", "chat")), ("ops", ("--operator",)))}
        wait_until(lambda: chat(s, "chat", s.secrets["tenant"]).status_code == 200, 5, 0.05, "the keys to count")
        s.ids = {name: int(chat(s, model, s.secrets[name]).headers["x-llamaswap-request-id"])
                 for name, model in (("tenant", "chat"), ("neighbour", "chat"), ("ops", "llama"))}
        yield s


def get(served: Served, path: str, key: str) -> httpx.Response:
    return httpx.get(served.base + path, headers=auth(served.secrets[key]), timeout=10)


def ids_in(page: dict) -> set[int]:
    return {row["id"] for row in page["data"]}


def test_running_placement_and_profiles_name_only_the_keys_models(served):
    assert {item["model"] for item in get(served, "/running", "tenant").json()["running"]} == {"chat"}
    assert {item["model"] for item in get(served, "/running", "ops").json()["running"]} == {"chat", "llama"}
    assert "llama" not in get(served, "/api/placement", "tenant").text
    assert '"llama"' in get(served, "/api/placement", "ops").text
    for model in ("llama", "no-such-model"):  # configured or not, outside the key's scope: the same answer
        refused = get(served, f"/api/placement/can-load/{model}", "tenant")
        assert refused.status_code == 403 and refused.json()["error"] == {
            "message": f"the API key 'tenant' may not use model '{model}'", "type": "permission_error", "param": None,
            "code": "model_not_allowed"}
    assert get(served, "/api/placement/can-load/no-such-model", "ops").status_code == 404
    assert get(served, "/api/placement/can-load/chat", "tenant").json()["model"] == "chat"
    assert get(served, "/api/placement/can-load/llama", "ops").status_code == 200
    assert get(served, "/api/profiles", "tenant").json()["profiles"][0]["pins"] == {"chat": "chat"}
    assert get(served, "/api/profiles", "ops").json()["profiles"][0]["pins"] == {"chat": "chat", "llama": "llama"}


def test_a_key_reads_its_own_requests_only(served):
    mine, theirs = served.ids["tenant"], served.ids["neighbour"]
    shown = ids_in(get(served, "/api/activity", "tenant").json())
    assert mine in shown and theirs not in shown and served.ids["ops"] not in shown
    assert ids_in(get(served, "/api/activity?key=neighbour", "tenant").json()) == set()
    assert {mine, theirs, served.ids["ops"]} <= ids_in(get(served, "/api/activity", "ops").json())
    llama_swap = {row["id"] for row in get(served, "/api/metrics/activity", "tenant").json()["data"]}
    assert mine in llama_swap and theirs not in llama_swap
    own_count = len(get(served, "/api/activity", "tenant").json()["data"])
    assert get(served, "/api/metrics/stats", "tenant").json()["total_requests"] == own_count
    assert get(served, f"/api/queue/{theirs}", "tenant").status_code == 404
    assert get(served, f"/api/queue/{mine}", "tenant").json()["api_key"] == "tenant"
    assert get(served, f"/api/queue/{theirs}", "ops").json()["api_key"] == "neighbour"


def test_the_queue_and_the_event_stream_show_the_keys_own_requests_and_models(served):
    running = {name: Held(served, served.secrets[name], f"{name}-long", tokens=400, tps=20)
               for name in ("tenant", "neighbour")}
    try:
        ids = {name: int(held.response.headers["x-llamaswap-request-id"]) for name, held in running.items()}
        assert {entry["id"] for entry in get(served, "/api/queue", "tenant").json()["data"]} == {ids["tenant"]}
        assert set(ids.values()) <= {entry["id"] for entry in get(served, "/api/queue", "ops").json()["data"]}
        for key, seen, models in (("tenant", {ids["tenant"]}, {"chat"}), ("ops", set(ids.values()), {"chat", "llama"})):
            with httpx.stream("GET", served.base + "/api/events", headers=auth(served.secrets[key]), timeout=10) as feed:
                first = events_of(next(feed.iter_text()))
            assert {model["id"] for model in first["modelStatus"][0]} == models
            assert {request["id"] for request in first["inflight"][0]["requests"]} & set(ids.values()) == seen
            assert {entry["id"] for entry in first["queue"][0]} & set(ids.values()) == seen
    finally:
        for held in running.values():
            held.close()


def test_the_event_streams_activity_shows_the_keys_own_requests(served):
    with httpx.stream("GET", served.base + "/api/events", headers=auth(served.secrets["tenant"]), timeout=10) as events:
        chunks = events.iter_text()
        next(chunks)  # the first payload: from here on, only what changes
        theirs = int(chat(served, "chat", served.secrets["neighbour"]).headers["x-llamaswap-request-id"])
        mine = int(chat(served, "chat", served.secrets["tenant"]).headers["x-llamaswap-request-id"])
        seen: set[int] = set()

        def mine_arrived() -> bool:
            seen.update(row["id"] for row in events_of(next(chunks)).get("activity", []))
            return any(row_id >= mine for row_id in seen)

        wait_until(mine_arrived, 10, 0, "the key's own request in the stream's activity")
    assert mine in seen and theirs not in seen


def test_metrics_carry_only_the_keys_models_and_its_own_key(served):
    assert chat(served, "llama", served.secrets["ops"]).status_code == 200
    tenant, ops = get(served, "/metrics", "tenant").text, get(served, "/metrics", "ops").text
    assert 'model="chat"' in tenant and 'key="tenant"' in tenant
    assert not re.search(r'model="llama"|key="(neighbour|ops)"', tenant)
    assert 'model="llama"' in ops and 'key="neighbour"' in ops
    assert "# HELP llamaswap_scheduler_queue_depth" in tenant  # the service's aggregates stay


def events_of(text: str) -> dict[str, list]:
    """The SSE chunk's envelopes by type, each payload decoded."""
    found: dict[str, list] = {}
    for line in text.splitlines():
        if line.startswith("data: "):
            outer = json.loads(line[len("data: "):])
            found.setdefault(outer["type"], []).append(json.loads(outer["data"]))
    return found


def test_a_name_that_leads_to_a_model_outside_the_keys_scope_is_refused_as_asked(tmp_path):
    """A selector, a profile's pin or an alias may lead to a model the key may not use: the refusal names what the
    key asked for, never the model it led to (nor so which model a selector would pick now)."""
    events = tmp_path / "events.jsonl"
    text = config_text({"chat": f'cmd: "{fake_cmd("chat", events)}"',
                        "secretcoder": f'cmd: "{fake_cmd("secretcoder", events)}", aliases: [chat-alias]'},
                       "selectors: {chat-sel: {strategy: pin, targets: [secretcoder]}}\n"
                       "profiles: {day: {pins: {chat-pin: secretcoder}}}\nhooks: {on_startup: {profile: day}}")
    with Served(tmp_path, text) as s:
        secret = new_key(s, "globbed", "--models", "chat*")
        wait_until(lambda: chat(s, "chat", secret).status_code == 200, 5, 0.05, "the key to count")
        sent = {"chat-sel": chat(s, "chat-sel", secret), "chat-pin": chat(s, "chat-pin", secret),
                "chat-alias": chat(s, "chat-alias", secret),
                "/v1/models/chat-alias": httpx.get(s.base + "/v1/models/chat-alias", headers=auth(secret), timeout=10),
                "/upstream/chat-pin/v1/models": httpx.get(s.base + "/upstream/chat-pin/v1/models", headers=auth(secret),
                                                          timeout=10)}
    for asked, answer in sent.items():
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "model_not_allowed", (asked, answer.text)
        message = answer.json()["error"]["message"]
        assert asked.removeprefix("/v1/models/") in message and "secretcoder" not in message, (asked, message)


def test_the_model_list_shows_a_key_the_names_that_lead_to_its_models_only(tmp_path):
    """A selector or a profile's pin is listed, retrieved and shown in /api/profiles for a key only where each model it
    may lead to is the key's (its state and targets would tell of the others), and an alias wherever its model is the
    key's, as a request for it is served: whatever its own name."""
    events = tmp_path / "events.jsonl"
    text = config_text({"chat": f'cmd: "{fake_cmd("chat", events)}", aliases: [talk]',
                        "secretcoder": f'cmd: "{fake_cmd("secretcoder", events)}", aliases: [chat-alias]'},
                       "selectors: {chat-sel: {strategy: pin, targets: [chat-alias]}, talk-sel: {strategy: warm, "
                       "targets: [talk]}, chat-mixed: {strategy: warm, targets: [chat, secretcoder]}}\n"
                       "profiles: {day: {pins: {chat-pin: secretcoder, talk-pin: talk}}}\n"
                       "hooks: {on_startup: {profile: day}}")
    with Served(tmp_path, text) as s:
        globbed, exact = new_key(s, "globbed", "--models", "chat*"), new_key(s, "exact", "--models", "chat")
        wait_until(lambda: chat(s, "chat", exact).status_code == 200, 5, 0.05, "the keys to count")
        assert chat(s, "secretcoder", None, **{"x-api-key": new_key(s, "ops", "--operator")}).status_code == 200
        listed = {name: httpx.get(s.base + "/v1/models", headers=auth(secret), timeout=10).json()["data"]
                  for name, secret in (("globbed", globbed), ("exact", exact))}
        retrieved = {(name, model): httpx.get(s.base + f"/v1/models/{model}", headers=auth(secret), timeout=10)
                     for name, secret in (("globbed", globbed), ("exact", exact))
                     for model in ("talk", "talk-sel", "talk-pin", "chat-sel", "chat-pin", "chat-mixed")}
        served_to_exact = {model: chat(s, model, exact).status_code for model in ("talk", "talk-sel", "talk-pin")}
        pins = {name: httpx.get(s.base + "/api/profiles", headers=auth(secret), timeout=10).json()["profiles"][0]["pins"]
                for name, secret in (("globbed", globbed), ("exact", exact))}
    for name, entries in listed.items():
        assert {entry["id"] for entry in entries} == {"chat", "talk-sel", "talk-pin"}, (name, entries)
        assert "secretcoder" not in json.dumps(entries) and "chat-alias" not in json.dumps(entries), (name, entries)
    assert served_to_exact == {"talk": 200, "talk-sel": 200, "talk-pin": 200}
    assert pins == {"globbed": {"talk-pin": "talk"}, "exact": {"talk-pin": "talk"}}
    for (name, model), answer in retrieved.items():
        if model.startswith("talk"):
            assert answer.status_code == 200 and answer.json()["id"] == model, (name, model, answer.text)
        else:
            assert answer.status_code == 403 and answer.json()["error"] == {
                "message": f"the API key '{name}' may not use model '{model}'", "type": "permission_error",
                "param": None, "code": "model_not_allowed"}, (name, model, answer.text)
