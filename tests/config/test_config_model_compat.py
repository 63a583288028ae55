"""`compat.ignoreWebsockets`, and the settings the reserved comfyui_auto model always gets."""

import pytest


def models(text_of_models: str) -> str:
    return "models:\n" + text_of_models


def test_ignore_websockets_is_off_unless_set(load):
    config = load(models(
        "  ignoring: {cmd: run, proxy: 'http://h:1', compat: {ignoreWebsockets: true}}\n"
        "  counting: {cmd: run, proxy: 'http://h:2'}\n"
    ))
    assert config.models["ignoring"].ignore_websockets is True
    assert config.models["counting"].ignore_websockets is False
    assert not [w for w in config.warnings if "compat" in w]


@pytest.mark.parametrize("limit, expected", [(None, 50), (10, 50), (50, 50), (60, 60)])
def test_comfyui_auto_gets_at_least_50_and_ignores_websockets(load, limit, expected):
    limit_text = "" if limit is None else f", concurrencyLimit: {limit}"
    config = load(models(
        f"  comfyui_auto: {{cmd: run, proxy: 'http://h:1', compat: {{ignoreWebsockets: false}}{limit_text}}}\n"
        "  regular: {cmd: run, proxy: 'http://h:2', concurrencyLimit: 10}\n"
    ))
    assert config.models["comfyui_auto"].concurrency_limit == expected
    assert config.models["comfyui_auto"].ignore_websockets is True
    assert config.models["regular"].concurrency_limit == 10
    assert config.models["regular"].ignore_websockets is False


def test_a_wrong_compat_value_names_its_key(config_error, problem):
    error = config_error(models("  m: {cmd: run, proxy: 'http://h:1', compat: {ignoreWebsockets: sometimes}}\n"))
    assert "expected true or false" in problem(error, "models.m.compat.ignoreWebsockets")


def test_an_unknown_compat_key_is_warned(load):
    config = load(models("  m: {cmd: run, proxy: 'http://h:1', compat: {ignoreWebsocket: true}}\n"))
    assert any("models.m.compat.ignoreWebsocket" in w and "did you mean ignoreWebsockets" in w for w in config.warnings)
