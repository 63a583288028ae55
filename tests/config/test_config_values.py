"""Wrongly typed or out-of-range values: each names its key and says what to write."""

import pytest

MODEL = "models: {{m: {{cmd: run, proxy: 'http://h:1', {entry}}}}}\n"


@pytest.mark.parametrize(
    "entry, key, expected",
    [
        ("ttl: abc", "ttl", 'expected a number, got the string "abc" — e.g. ttl: 300'),
        ("ttl: -5", "ttl", "-5 is negative — use a number of idle seconds, 0 to never unload, or -1 for globalTTL"),
        ("ttl: true", "ttl", "expected a number, got the bool true"),
        ("unloadTimeout: -1", "unloadTimeout", "below the minimum of 0"),
        ("concurrencyLimit: -1", "concurrencyLimit", "-1 is below the minimum of 0 — e.g. concurrencyLimit: 4"),
        ("concurrencyLimit: 2.5", "concurrencyLimit", "expected a whole number"),
        ("unlisted: 'yes please'", "unlisted", "expected true or false"),
        ("aliases: gpt-4o", "aliases", 'expected a list, got the string "gpt-4o"'),
        ("name: 2024", "name", 'quote it: name: "2024"'),
        ("metadata: [a]", "metadata", "expected a mapping"),
        ("filters: strip", "filters", "expected a mapping"),
        ("proxy: localhost:8080", "proxy", "not an http(s) URL — e.g. proxy: http://127.0.0.1:8080"),
    ],
)
def test_bad_model_values(config_error, problem, entry, key, expected):
    text = MODEL.format(entry=entry).replace("proxy: 'http://h:1', proxy:", "proxy:")
    assert expected in problem(config_error(text), f"models.m.{key}")


@pytest.mark.parametrize(
    "env, expected",
    [
        ("[FOO]", "has no '=' (NAME=value) — write it like \"CUDA_VISIBLE_DEVICES=0\""),
        ("['=x']", '"=…" is not NAME=value'),
        ("['1X=y']", "do not start with a digit"),
    ],
)
def test_env_entries_must_be_name_equals_value(config_error, problem, env, expected):
    assert expected in problem(config_error(MODEL.format(entry=f"env: {env}")), "models.m.env[0]")


def test_model_entry_must_be_a_mapping(config_error, problem):
    assert "at least `cmd:`" in problem(config_error("models: {m: llama-server}\n"), "models.m")


def test_model_ids_must_be_text(config_error, problem):
    assert 'quote it: "3":' in problem(config_error("models: {3: {cmd: run, proxy: 'http://h:1'}}\n"), "models.3")


@pytest.mark.parametrize(
    "line, key, expected",
    [
        ("apiKeys: ['']", "apiKeys[0]", "empty API key"),
        ("apiKeys: ['sk a']", "apiKeys[0]", "cannot contain spaces"),
        ("apiKeys: [12345]", "apiKeys[0]", 'expected text, got a number — quote it: "<the key>"'),
        ("apiKeys: sk-one", "apiKeys", "expected a list"),
        ("logLevel: loud", "logLevel", "use one of: debug, info, warn, error"),
        ("startPort: 0", "startPort", "below the minimum of 1"),
        ("startPort: 70000", "startPort", "above the maximum of 65535"),
        ("globalTTL: -1", "globalTTL", "below the minimum of 0"),
        ("healthCheckTimeout: soon", "healthCheckTimeout", "expected a number"),
        ("maxRequestBodyBytes: 0", "maxRequestBodyBytes", "below the minimum of 1"),
        ("metricsRequireApiKey: 1", "metricsRequireApiKey", "expected true or false"),
        ("macros: [a]", "macros", "must be a mapping of name: value"),
        ("models: [a]", "models", "expected a mapping of model ID: settings"),
    ],
)
def test_bad_top_level_values(config_error, problem, line, key, expected):
    text = line + "\n" + ("" if line.startswith("models") else MODEL.format(entry="ttl: 1"))
    assert expected in problem(config_error(text), key)


def test_zero_health_timeout_is_refused_even_when_short_ones_are_allowed(config_error, problem, monkeypatch):
    monkeypatch.setenv("LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT", "1")
    error = config_error("healthCheckTimeout: 0\n" + MODEL.format(entry="ttl: 1"))
    assert "must be above 0" in problem(error, "healthCheckTimeout")
