"""Config problems and the start-up summary name a secret's key path and the fix, never its value:
they are printed at `serve --check`, at start and in a rejected reload's log."""

import textwrap

import pytest

from proxy.config import ConfigError, load_config, parse_config
from proxy.config.secrets import hidden_values, scrubbed, shown_argv

SECRET = "sk-live-7f3a9c"
MODEL = "models:\n  m: {cmd: run, proxy: 'http://127.0.0.1:9001'}\n"


def error_text(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), "config.yaml")
    return str(info.value)


@pytest.mark.parametrize("text, expected", [
    (f"apiKeys: {SECRET}\n" + MODEL, "config.yaml: apiKeys: expected a list, got a string — e.g. apiKeys: "),
    (f"apiKeys: {{main: {SECRET}}}\n" + MODEL, "config.yaml: apiKeys: expected a list, got a mapping"),
    (f"apiKeys: [[{SECRET}]]\n" + MODEL, 'config.yaml: apiKeys[0]: expected text, got a list — quote it: "<the key>"'),
    ("apiKeys: [73105112]\n" + MODEL, 'config.yaml: apiKeys[0]: expected text, got a number — quote it: "<the key>"'),
    (MODEL + f"peers:\n  box: {{proxy: 'http://10.0.0.2:8080', models: [a], apiKey: [{SECRET}]}}\n",
     'config.yaml: peers.box.apiKey: expected text, got a list — quote it: apiKey: "<the key>"'),
    (MODEL + f"peers:\n  box: {{proxy: 'http://10.0.0.2:8080', models: [a], apiKey: {{k: {SECRET}}}}}\n",
     "config.yaml: peers.box.apiKey: expected text, got a mapping"),
    ("models:\n  m: {cmd: run, proxy: 'http://127.0.0.1:9', env: [{HF_TOKEN: %s}]}\n" % SECRET,
     'config.yaml: models.m.env[0]: expected text, got a mapping — quote it: "<NAME=value>"'),
    ("models:\n  m: {cmd: run, proxy: 'http://127.0.0.1:9', env: 'HF_TOKEN=%s'}\n" % SECRET,
     "config.yaml: models.m.env: expected a list, got a string"),
    (MODEL + f"peers:\n  box: {{proxy: 'https://api.example/v1?key={SECRET}', models: [a]}}\n",
     'config.yaml: peers.box.proxy: "https://api.example/v1?…" has a query or fragment'),
])
def test_a_misshapen_key_is_named_by_its_path_never_shown(text, expected):
    shown = error_text(text)
    assert expected in shown
    assert SECRET not in shown and "73105112" not in shown


def test_a_non_ascii_api_key_no_header_could_carry_is_refused_by_its_path_never_shown():
    shown = error_text(f"apiKeys: ['{SECRET}', 'sk-clé-4d2e']\n" + MODEL)
    assert "config.yaml: apiKeys[1]: API keys must be ASCII" in shown
    assert "apiKeys[0]" not in shown and "sk-clé-4d2e" not in shown and SECRET not in shown


def test_two_config_dir_files_with_different_api_keys_name_both_files_not_the_keys(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "a.yaml").write_text(f"apiKeys: ['{SECRET}']\n" + MODEL)
    (conf_d / "b.yaml").write_text("apiKeys: ['sk-other-1b2c']\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, conf_d)
    assert str(info.value) == (
        f"{conf_d}/b.yaml: apiKeys: {conf_d}/a.yaml and {conf_d}/b.yaml set different values — set it in one file only"
    )


def test_a_conflict_of_other_settings_still_shows_both_values(tmp_path):
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    (conf_d / "a.yaml").write_text("globalTTL: 60\n" + MODEL)
    (conf_d / "b.yaml").write_text("globalTTL: 90\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, conf_d)
    assert "sets 60 and" in str(info.value) and "sets 90" in str(info.value)


@pytest.mark.parametrize("env", ["[HF_TOKEN hf_secret42]", "['HF TOKEN=hf_secret42']"])
def test_a_malformed_env_entry_is_not_echoed(env):
    shown = error_text(f"models:\n  m: {{cmd: run, proxy: 'http://127.0.0.1:9001', env: {env}}}\n")
    assert "models.m.env[0]:" in shown and "hf_secret42" not in shown


@pytest.mark.parametrize("text", [
    "models:\n  m: {cmd: run, proxy: 'http://bob:hunter2@[zz]:80'}\n",
    MODEL + "peers:\n  box: {proxy: 'http://bob:hunter2@10.0.0.2:8080/?a=1', models: [a]}\n",
    MODEL + "peers:\n  box: {proxy: 'ftp://bob:hunter2@10.0.0.2', models: [a]}\n",
])
def test_a_bad_url_is_shown_without_its_userinfo(text):
    shown = error_text(text)
    assert "hunter2" not in shown and "bob" not in shown and "***@" in shown


def test_the_start_up_summary_shows_urls_without_their_userinfo():
    config = parse_config(
        "models:\n  m: {cmd: run, proxy: 'http://bob:hunter2@127.0.0.1:9001'}\n"
        "peers:\n  box: {proxy: 'https://bob:hunter3@10.0.0.2:8080', models: [a], apiKey: sk-peer-9d8e}\n",
        "config.yaml",
    )
    summary = config.describe()
    assert "proxy: http://***@127.0.0.1:9001" in summary
    assert "peer box (https://***@10.0.0.2:8080, apiKey set): a" in summary
    assert "hunter" not in summary and "sk-peer-9d8e" not in summary


@pytest.mark.parametrize("argv, shown", [
    (["llama-server", "--api-key", "sk-1", "-m", "x.gguf"], "llama-server --api-key *** -m x.gguf"),
    (["llama-server", "--api-key=sk-1", "--port", "9"], "llama-server --api-key=*** --port 9"),
    (["vllm", "serve", "--hf-token", "hf_abc", "--API_KEY", "k"], "vllm serve --hf-token *** --API_KEY ***"),
    (["run", "--model-url", "https://bob:pw@hf.co/m.gguf"], "run --model-url https://***@hf.co/m.gguf"),
    (["run", "--tokens", "5", "--api-key"], "run --tokens 5 --api-key"),
])
def test_a_command_line_is_shown_without_its_credentials(argv, shown):
    assert " ".join(shown_argv(argv)) == shown


def test_the_start_up_summary_shows_commands_without_their_keys():
    summary = parse_config("models:\n  m: {cmd: 'llama-server --api-key sk-up-77 --port ${PORT}'}\n",
                           "config.yaml").describe()
    assert "cmd:   llama-server --api-key '***' --port" in summary and "sk-up-77" not in summary


def test_a_credential_inside_a_shell_script_argument_is_hidden_and_scrubbed_from_output():
    argv = ["sh", "-c", "exec llama-server --api-key sk-abcdef --port 8080 --hf-token='hf_xyz123' -m http://u:pw@h/m"]
    shown = shown_argv(argv)
    assert shown[:2] == ["sh", "-c"]
    assert shown[2] == "exec llama-server --api-key *** --port 8080 --hf-token='***' -m http://***@h/m", shown
    assert set(hidden_values(argv)) == {b"sk-abcdef", b"hf_xyz123"}
    assert scrubbed(b"error: bad --api-key sk-abcdef", hidden_values(argv)) == b"error: bad --api-key ***"
