"""`peers:`: what a peer entry reads, the errors it reports, and which names reach a peer."""

from proxy.config.peers import DEFAULT_PEER_RESPONSE_HEADER_TIMEOUT

LOCAL = """
models:
  local:
    cmd: llama-server --port ${PORT}
    aliases: [local-alias]
"""


def test_defaults(load):
    config = load(LOCAL + """
peers:
  box:
    proxy: http://192.168.1.23:8080/
    models: [model_a, embeddings/model_c]
""")
    peer = config.peers["box"]
    assert peer.proxy == "http://192.168.1.23:8080"
    assert peer.models == ("model_a", "embeddings/model_c")
    assert peer.api_key == ""
    assert peer.filters.is_empty
    assert peer.timeouts.connect == 30
    assert peer.timeouts.response_header == DEFAULT_PEER_RESPONSE_HEADER_TIMEOUT == 60
    assert config.warnings == ()


def test_api_key_filters_and_timeouts(load, monkeypatch):
    monkeypatch.setenv("ROUTER_KEY", "sk-or-1")
    config = load(LOCAL + """
macros:
  retention: deny
peers:
  openrouter:
    proxy: https://openrouter.ai/api
    apiKey: ${env.ROUTER_KEY}
    models: [meta-llama/llama-3.1-8b-instruct]
    timeouts: {connect: 5, responseHeader: 0, keepalive: 30}
    filters:
      stripParams: "temperature, top_p, model"
      setParams:
        provider: {data_collection: "${retention}", zdr: true}
""")
    peer = config.peers["openrouter"]
    assert peer.api_key == "sk-or-1"
    assert peer.timeouts.connect == 5 and peer.timeouts.response_header is None
    assert peer.filters.strip_params == ("temperature", "top_p")
    body = peer.filters.apply({"model": "m", "temperature": 1, "top_p": 0.5, "n": 2})
    assert body == {"model": "m", "n": 2, "provider": {"data_collection": "deny", "zdr": True}}
    assert any("peers.openrouter.filters.stripParams: model is protected" in w for w in config.warnings)
    assert config.peers["openrouter"].timeouts.keepalive == 30
    assert not any("peers.openrouter.timeouts" in w for w in config.warnings)


def test_errors_name_the_key_path_and_the_fix(config_error, problem):
    error = config_error(LOCAL + """
peers:
  no-proxy:
    models: [a]
  bad-proxy:
    proxy: ftp://host
    models: [a]
  no-models:
    proxy: http://host:1
  empty-models:
    proxy: http://host:1
    models: []
  bad-model:
    proxy: http://host:1
    models: [a, a, 3]
  not-a-mapping: http://host:1
  bad-filters:
    proxy: http://host:1
    models: [a]
    filters: {setParams: [1]}
    timeouts: {responseHeader: -1}
""")
    assert "e.g. proxy: http" in problem(error, "peers.no-proxy.proxy")
    assert "not an http(s) URL" in problem(error, "peers.bad-proxy.proxy")
    assert "missing — list the model names" in problem(error, "peers.no-models.models")
    assert "is empty — list the model names" in problem(error, "peers.empty-models.models")
    assert "listed twice" in problem(error, "peers.bad-model.models[1]")
    assert "expected text" in problem(error, "peers.bad-model.models[2]")
    assert "expected a mapping" in problem(error, "peers.not-a-mapping")
    assert "e.g. setParams:" in problem(error, "peers.bad-filters.filters.setParams")
    assert "below the minimum" in problem(error, "peers.bad-filters.timeouts.responseHeader")


def test_unknown_peer_key_is_warned(load):
    config = load(LOCAL + """
peers:
  box: {proxy: "http://h:1", models: [a], apikey: x}
""")
    assert any("peers.box.apikey: unknown key, ignored — did you mean apiKey?" in w for w in config.warnings)


def test_names_that_reach_a_peer(load):
    config = load(LOCAL + """
peers:
  one:
    proxy: http://one:1
    models: [solo, both, local, local-alias]
  two:
    proxy: http://two:1
    models: [both]
""")
    peer, model = config.peer_model("one/solo")
    assert (peer.id, model) == ("one", "solo")
    peer, model = config.peer_model("solo")
    assert (peer.id, model) == ("one", "solo")
    assert config.peer_model("two/both")[0].id == "two"
    # a bare name two peers list is ambiguous: only the qualified names reach them
    assert config.peer_model("both") is None
    assert config.peers_offering("both") == ("one/both", "two/both")
    # local IDs and aliases always win over a peer's bare name
    assert config.peer_model("local") is None and config.resolve("local").id == "local"
    assert config.peer_model("local-alias") is None
    assert config.peer_model("one/local")[1] == "local"
    assert config.peer_model("one/nothing") is None and config.peer_model("nothing") is None


def test_a_qualified_name_that_is_a_local_alias_is_warned(load):
    config = load("""
models:
  local:
    cmd: llama-server --port ${PORT}
    aliases: [box/a]
peers:
  box: {proxy: "http://h:1", models: [a]}
""")
    assert config.peer_model("box/a") is None
    assert any('peers.box.models[0]: "box/a" is also a local model ID or alias, which wins' in w for w in config.warnings)


def test_no_peers(load):
    config = load(LOCAL)
    assert dict(config.peers) == {} and config.peer_model("anything") is None


def test_the_start_summary_names_each_peer(load):
    config = load(LOCAL + """
peers:
  box: {proxy: "http://h:1", apiKey: sk-x, models: [a, b]}
""")
    assert "peer box (http://h:1, apiKey set): a, b" in config.describe().splitlines()
    assert "sk-x" not in config.describe()


def test_two_peers_making_one_qualified_name_is_an_error(config_error, problem):
    error = config_error(LOCAL + """
peers:
  we: {proxy: "http://h:1", models: [ird/x]}
  we/ird: {proxy: "http://h:2", models: [y, x]}
""")
    message = problem(error, "peers.we/ird.models[1]")
    assert '"we/ird/x" is also the name of peers.we.models[0] ("ird/x" on peer we)' in message
    assert "rename one of the two peers" in message


def test_a_proxy_url_with_a_query_or_fragment_is_an_error(config_error, problem):
    error = config_error(LOCAL + """
peers:
  query: {proxy: "http://127.0.0.1:19101?x=1#frag", models: [a]}
  fragment: {proxy: "http://h:1/api#v1", models: [a]}
""")
    message = problem(error, "peers.query.proxy")
    assert "has a query or fragment" in message and "e.g. proxy: http://127.0.0.1:19101" in message
    assert "e.g. proxy: http://h:1/api" in problem(error, "peers.fragment.proxy")


def test_a_peer_id_that_could_never_be_asked_for_is_an_error(config_error, problem):
    error = config_error(LOCAL + """
peers:
  " sp ": {proxy: "http://h:1", models: [a]}
  "": {proxy: "http://h:2", models: [b]}
  7: {proxy: "http://h:3", models: [c]}
""")
    assert 'remove the spaces: "sp":' in problem(error, "peers. sp ")
    empty = problem(error, "peers.")
    assert "cannot be empty — name the peer" in empty and "quote" not in empty
    assert 'quote it: "7":' in problem(error, "peers.7")
