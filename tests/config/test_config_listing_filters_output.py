"""llama-swap keys read since: includeAliasesInList, filters.setParamsByID, capabilities,
upstream.ignorePaths, the transport timeouts, logToStdout and logTimeFormat."""

from datetime import datetime, timedelta, timezone

import pytest

from proxy.config.capabilities import ModelCapabilities
from proxy.config.log_output import TIME_LAYOUTS
from proxy.config.upstream_paths import DEFAULT_IGNORE_PATHS, is_ignored

MODEL = """
models:
  m:
    cmd: run --port ${PORT}
"""


def model_with(extra: str) -> str:
    return MODEL + "".join(f"    {line}\n" for line in extra.strip("\n").splitlines())


def test_absent_keys_keep_the_defaults(load):
    config = load(MODEL)
    assert config.include_aliases_in_list is False
    assert config.ignore_paths == DEFAULT_IGNORE_PATHS
    assert (config.log_output.to_stdout, config.log_output.time_format) == (None, None)
    m = config.models["m"]
    assert m.capabilities.is_empty and not m.filters.set_params_by_id
    assert (m.timeouts.keepalive, m.timeouts.tls_handshake, m.timeouts.idle_conn) == (30.0, 10.0, 5.0)
    assert not config.warnings


def test_set_params_by_id_keys_are_expanded_and_become_aliases(load):
    config = load(model_with("""
macros: {tier: high}
aliases: [chat]
filters:
  setParams: {temperature: 0.5}
  setParamsByID:
    "${MODEL_ID}": {effort: medium}
    "${MODEL_ID}:${tier}": {effort: "${tier}", model: other}
    chat: {effort: low}
"""))
    m = config.models["m"]
    assert dict(m.filters.set_params_by_id) == {"m": {"effort": "medium"}, "m:high": {"effort": "high"}, "chat": {"effort": "low"}}
    assert m.aliases == ("chat", "m:high")  # the own ID is not an alias, an existing alias is not repeated
    assert config.resolve("m:high") is m
    assert any("setParamsByID.${MODEL_ID}:${tier}.model: model is protected" in w for w in config.warnings)
    body = {"model": "m:high", "temperature": 1, "effort": "x"}
    assert m.filters.apply(body, requested="m:high") == {"model": "m:high", "temperature": 0.5, "effort": "high"}
    assert m.filters.apply(body, requested="m") == {"model": "m:high", "temperature": 0.5, "effort": "medium"}
    assert m.filters.apply(body, requested="nobody")["effort"] == "x"


def test_a_set_params_by_id_key_that_names_another_model_is_an_error(config_error, problem):
    error = config_error("""
    models:
      a:
        cmd: run --port ${PORT}
        aliases: [shared]
      b:
        cmd: run --port ${PORT}
        filters:
          setParamsByID:
            a: {x: 1}
            shared: {x: 2}
            "${undefined}": {x: 3}
            bad: [1]
    """)
    assert "already the ID of model a" in problem(error, "models.b.filters.setParamsByID.a")
    assert "already an alias of model a" in problem(error, "models.b.filters.setParamsByID.shared")
    assert "not a defined macro" in problem(error, "models.b.filters.setParamsByID.${undefined}")
    assert "expected a mapping of param: value" in problem(error, "models.b.filters.setParamsByID.bad")


def test_capabilities_are_checked(load, config_error, problem):
    m = load(model_with("capabilities: {in: [text, image], out: [text], tools: true, context: 8192}")).models["m"]
    assert m.capabilities == ModelCapabilities(("text", "image"), ("text",), True, False, 8192)
    error = config_error(model_with("capabilities: {in: [text, video, text], out: text, context: -1, tools: 1, extra: 2}"))
    assert "'video' is not a modality" in problem(error, "models.m.capabilities.in[1]")
    assert "listed twice" in problem(error, "models.m.capabilities.in[2]")
    assert "expected a list of modalities" in problem(error, "models.m.capabilities.out")
    assert "below the minimum of 0" in problem(error, "models.m.capabilities.context")
    assert "expected true or false" in problem(error, "models.m.capabilities.tools")


def test_ignore_paths_compile_and_a_bad_one_is_named(load, config_error, problem):
    config = load("upstream:\n  ignorePaths: ['^/static/', '\\.map$']\n" + MODEL)
    assert is_ignored("/static/x", config.ignore_paths) and is_ignored("/a.map", config.ignore_paths)
    assert not is_ignored("/app.js", config.ignore_paths)  # the list replaces the default
    assert load("upstream: {ignorePaths: []}\n" + MODEL).ignore_paths == DEFAULT_IGNORE_PATHS
    error = config_error("upstream:\n  ignorePaths: ['ok', '(unclosed', 3]\n" + MODEL)
    assert "not a valid regular expression" in problem(error, "upstream.ignorePaths[1]")
    assert "expected a regular expression" in problem(error, "upstream.ignorePaths[2]")


@pytest.mark.parametrize("path, ignored", [("/app.js", True), ("/x/favicon.ico", True), ("/v1/models", False),
                                           ("/", False), ("/data.json", True), ("/a.jsx", False)])
def test_the_default_ignore_path_matches_static_assets(path, ignored):
    assert is_ignored(path, DEFAULT_IGNORE_PATHS) is ignored


def test_transport_timeouts_are_read_and_zero_turns_them_off(load, config_error, problem):
    m = load(model_with("timeouts: {keepalive: 0, tlsHandshake: 3, idleConn: 90, expectContinue: 1}")).models["m"]
    assert (m.timeouts.keepalive, m.timeouts.tls_handshake, m.timeouts.idle_conn) == (None, 3.0, 90.0)
    error = config_error(model_with("timeouts: {idleConn: -1, expectContinue: soon}"))
    assert "below the minimum of 0" in problem(error, "models.m.timeouts.idleConn")
    assert "expected a number" in problem(error, "models.m.timeouts.expectContinue")


def test_log_keys_accept_llama_swap_values_only(load, config_error, problem):
    output = load("logToStdout: both\nlogTimeFormat: rfc3339\n" + MODEL).log_output
    assert (output.to_stdout, output.time_format) == ("both", "rfc3339")
    assert output.own_lines_on_stdout and output.model_output_on_stdout
    assert load('logTimeFormat: ""\n' + MODEL).log_output.time_format == ""
    error = config_error("logToStdout: stderr\nlogTimeFormat: iso\nincludeAliasesInList: yes-please\n" + MODEL)
    assert '"stderr" is not one of "proxy", "upstream", "both", "none"' in problem(error, "logToStdout")
    assert '"iso" is not one of' in problem(error, "logTimeFormat")
    assert "expected true or false" in problem(error, "includeAliasesInList")


def test_time_layouts_render_like_go():
    utc = datetime(2006, 1, 2, 15, 4, 5, 123400, tzinfo=timezone.utc)
    east = datetime(2006, 1, 2, 15, 4, 5, tzinfo=timezone(timedelta(hours=-7), "MST"))
    assert TIME_LAYOUTS["rfc3339"](utc) == "2006-01-02T15:04:05Z"
    assert TIME_LAYOUTS["rfc3339"](east) == "2006-01-02T15:04:05-07:00"
    assert TIME_LAYOUTS["rfc3339nano"](utc) == "2006-01-02T15:04:05.1234Z"
    assert TIME_LAYOUTS["ansic"](east) == "Mon Jan  2 15:04:05 2006"
    assert TIME_LAYOUTS["unixdate"](east) == "Mon Jan  2 15:04:05 MST 2006"
    assert TIME_LAYOUTS["rubydate"](east) == "Mon Jan 02 15:04:05 -0700 2006"
    assert TIME_LAYOUTS["rfc822z"](east) == "02 Jan 06 15:04 -0700"
    assert TIME_LAYOUTS["rfc850"](east) == "Monday, 02-Jan-06 15:04:05 MST"
    assert TIME_LAYOUTS["rfc1123"](east) == "Mon, 02 Jan 2006 15:04:05 MST"
    assert TIME_LAYOUTS["kitchen"](east) == "3:04PM"
    assert TIME_LAYOUTS["stampmilli"](utc) == "Jan  2 15:04:05.123"
    assert TIME_LAYOUTS["stampnano"](utc) == "Jan  2 15:04:05.123400000"
