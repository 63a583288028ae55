"""What a newcomer does first against `llamaswap serve`: asks the openai SDK for a model (`models.retrieve`), opens
llama-swap's UI address, mistypes an admin address, makes a first API key, which closes the open server, and brings a
llama-swap config with a remote server written as a model."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.admin.session import AdminSession, create_superuser
from tests.e2e.test_api_keys import auth, run_keys
from tests.served import Served, fake_cmd

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("first-steps")
    events = tmp / "events.jsonl"
    text = f"""
        models:
          org/chat:
            cmd: {fake_cmd("chat", events)}
            aliases: [chat]
            name: Chat
            capabilities: {{tools: true, context: 8192}}
          "qwen3:8b":
            cmd: {fake_cmd("qwen", events)}
          hidden:
            cmd: {fake_cmd("hidden", events)}
            unlisted: true
          remote:  # an OpenAI-compatible server elsewhere, written as a model
            proxy: http://127.0.0.1:9
    """
    with Served(tmp, text) as s:
        s.open_before_keys = httpx.get(s.base + "/v1/models", timeout=10).status_code
        s.first_key = run_keys(s.env, "create", "ops", "--operator")
        s.secrets = {"ops": s.first_key.stdout.strip().splitlines()[-1]}
        made = run_keys(s.env, "create", "tenant", "--models", "org/*")
        s.secrets["tenant"] = made.stdout.strip().splitlines()[-1]
        yield s


def client(served: Served, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key=served.secrets[key], max_retries=0)


def without_created(entry) -> dict:
    return {name: value for name, value in entry.model_dump().items() if name != "created"}


def test_the_sdk_retrieves_each_listed_model_as_the_list_gives_it(served):
    ops = client(served, "ops")
    listed = list(ops.models.list())
    assert {entry.id for entry in listed} == {"org/chat", "qwen3:8b", "remote"}  # an ID with a slash, one with a colon
    for entry in listed:
        assert without_created(ops.models.retrieve(entry.id)) == without_created(entry)
    chat = ops.models.retrieve("org/chat")
    assert (chat.object, chat.owned_by, chat.name, chat.context_length) == ("model", "llamaswap", "Chat", 8192)


def test_an_alias_and_an_unlisted_model_are_retrieved_though_the_list_leaves_them_out(served):
    ops = client(served, "ops")
    alias = ops.models.retrieve("chat")  # as includeAliasesInList would list it
    assert alias.id == "chat" and alias.meta["llamaswap"] | {"type": "alias", "modelID": "org/chat"} == alias.meta["llamaswap"]
    assert ops.models.retrieve("hidden").id == "hidden"
    plain = httpx.get(served.base + "/v1/models/chat", headers=auth(served.secrets["ops"]), timeout=10)
    assert plain.status_code == 200 and plain.json()["meta"]["llamaswap"]["modelID"] == "org/chat"


def test_an_unknown_model_is_an_openai_shaped_404(served):
    with pytest.raises(openai.NotFoundError) as missing:
        client(served, "ops").models.retrieve("no-such-model")
    assert missing.value.body == {"message": "The model 'no-such-model' does not exist.",
                                  "type": "not_found_error", "param": None, "code": "model_not_found"}


def test_a_key_retrieves_only_the_models_of_its_scope(served):
    tenant = client(served, "tenant")
    assert tenant.models.retrieve("org/chat").id == "org/chat"
    assert [entry.id for entry in tenant.models.list()] == ["org/chat"]
    # An alias of one of its models is its model whatever the alias's own name, as a request for it is served.
    assert tenant.models.retrieve("chat").meta["llamaswap"]["modelID"] == "org/chat"
    # Outside its globs, configured or not: refused alike, as a request would be.
    for name in ("qwen3:8b", "hidden", "no-such-model"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            tenant.models.retrieve(name)
        assert refused.value.body == {"message": f"the API key 'tenant' may not use model '{name}'",
                                      "type": "permission_error", "param": None, "code": "model_not_allowed"}, name
    with pytest.raises(openai.NotFoundError):  # inside its globs and configured nowhere
        tenant.models.retrieve("org/none")


def test_the_first_key_says_that_every_route_but_health_now_needs_a_key(served):
    assert served.open_before_keys == 200
    note = served.first_key.stderr
    assert "every API route but /health and /wol-health needs one" in note and 'api_key="unused"' in note
    assert "metricsRequireApiKey" in note and "Authorization: Bearer <secret>" in note
    unused = openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        unused.models.list()
    for path, status in (("/health", 200), ("/wol-health", 200), ("/metrics", 200), ("/running", 401),
                         ("/api/queue", 401), ("/v1/models/org/chat", 401)):  # /metrics: no metricsRequireApiKey
        assert httpx.get(served.base + path, timeout=10).status_code == status, path


@pytest.mark.parametrize("path", ["/ui", "/ui/", "/ui/models", "/ui/logs?x=1"])
def test_llama_swaps_ui_address_leads_to_the_admin(served, path):
    answer = httpx.get(served.base + path, timeout=10)
    assert answer.status_code == 302 and answer.headers["location"] == "/admin/"


def test_an_unknown_admin_address_gets_the_admins_own_page(served):
    create_superuser(served, "alice", "correct-horse-battery")
    session = AdminSession(served, "alice", "correct-horse-battery")
    try:
        answer = session.http.get("/admin/no/such/page/")
    finally:
        session.close()
    assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html")
    assert 'id="not-found"' in answer.text and "<code>/admin/no/such/page/</code>" in answer.text
    assert 'href="/admin/"' in answer.text and "Log out" in answer.text  # the admin's header, for the user
    api = httpx.get(served.base + "/v1/no-such-route", headers=auth(served.secrets["ops"]), timeout=10)
    assert api.status_code == 404 and api.json()["error"]["code"] == "route_not_found"  # API clients keep JSON


def test_a_model_with_a_proxy_and_no_cmd_is_loaded_and_each_request_for_it_says_why_it_fails(served):
    assert "models.remote.cmd: missing: llama-swap loads a model with a proxy and no cmd" in served.log()
    answer = httpx.post(served.base + "/v1/chat/completions", headers=auth(served.secrets["ops"]), timeout=30,
                        json={"model": "remote", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_start_failed"
    assert error["message"] == ("model 'remote' failed to start: it has no cmd, and llamaswap serves only models it "
                                "starts (a server that runs on its own goes under peers:, see the warning at load)")
    assert client(served, "ops").models.retrieve("qwen3:8b").id == "qwen3:8b"  # the service carries on
