"""Helpers for config tests: load YAML text, or get the ConfigError it raises."""

import textwrap

import pytest

from proxy.config import ConfigError, parse_config

CONFIG_NAME = "config.yaml"


@pytest.fixture(autouse=True)
def _default_health_timeout_rules(monkeypatch):
    monkeypatch.delenv("LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT", raising=False)


@pytest.fixture
def load():
    """Parse dedented YAML text as if it were config.yaml."""

    def load_text(text: str):
        return parse_config(textwrap.dedent(text), CONFIG_NAME)

    return load_text


@pytest.fixture
def config_error():
    """The ConfigError raised by dedented YAML text."""

    def error_of(text: str) -> ConfigError:
        with pytest.raises(ConfigError) as info:
            parse_config(textwrap.dedent(text), CONFIG_NAME)
        return info.value

    return error_of


@pytest.fixture
def problem():
    """The one problem reported for `key` (fails when there is none or several)."""

    def find(error: ConfigError, key: str) -> str:
        messages = [p.message for p in error.problems if p.key == key]
        assert len(messages) == 1, f"expected one problem at {key!r}, got:\n{error}"
        line = f"{CONFIG_NAME}: {key}: {messages[0]}"
        assert line in str(error).splitlines()
        return messages[0]

    return find
