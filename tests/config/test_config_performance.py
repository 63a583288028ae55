"""`performance:` — llama-swap's system/GPU sampler settings: Go durations, a 5 s floor, clear errors."""

import pytest

from proxy.config.performance import PerformanceConfig, parse_duration

MODELS = "models: {m: {cmd: run, proxy: 'http://h:1'}}\n"


def test_default_samples_every_five_seconds(load):
    assert load(MODELS).performance == PerformanceConfig(disabled=False, every=5.0)


@pytest.mark.parametrize("every, seconds", [("15s", 15), ("1m30s", 90), ("2h10s", 7210), ("1.5m", 90), ("90m", 5400)])
def test_every_takes_go_durations(load, every, seconds):
    config = load(MODELS + f"performance: {{every: {every}, disabled: true}}\n")
    assert config.performance == PerformanceConfig(disabled=True, every=seconds)
    assert not config.warnings


def test_every_below_five_seconds_is_raised_with_a_warning(load):
    config = load(MODELS + "performance: {every: 500ms}\n")
    assert config.performance.every == 5.0
    assert config.warnings == ("config.yaml: performance.every: 500ms is below the minimum of 5s, using 5s",)


@pytest.mark.parametrize(
    "entry, key, expected",
    [
        ("{every: 10}", "performance.every", '"10" is not a duration — write a number with a unit (ms, s, m, h), e.g. every: 5s'),
        ("{every: soon}", "performance.every", '"soon" is not a duration'),
        ("{every: [5s]}", "performance.every", "expected a duration, got a list"),
        ("{every: 99999999h}", "performance.every", "99999999h is above the maximum of 24h — e.g. every: 5s or every: 1h"),
        ("{every: 24h1s}", "performance.every", "24h1s is above the maximum of 24h"),
        ("{disabled: maybe}", "performance.disabled", "expected true or false"),
        ("off", "performance", "expected a mapping"),
    ],
)
def test_bad_performance_values_name_the_key_and_the_fix(config_error, problem, entry, key, expected):
    assert expected in problem(config_error(MODELS + f"performance: {entry}\n"), key)


def test_unknown_performance_keys_are_warned(load):
    (warning,) = load(MODELS + "performance: {evry: 10s}\n").warnings
    assert "performance.evry" in warning and "every" in warning


def test_parse_duration():
    assert parse_duration("0") == 0 and parse_duration("250ms") == 0.25
    assert parse_duration("") is None and parse_duration("5") is None and parse_duration("5 s") is None
