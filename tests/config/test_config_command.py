"""`cmd` / `cmdStop`: comment lines, line continuations and POSIX quoting, no shell."""

import pytest

from proxy.config.command import split_command


def test_comment_lines_are_dropped_and_lines_join(load):
    model = load(
        r"""
        models:
          m:
            proxy: http://h:1
            cmd: |
              # the server binary
              /opt/llama-server \
                --model "/models/my model.gguf" \
                # --flash-attn is off for now
                --ctx-size 4096
              --jinja
        """
    ).models["m"]
    assert model.cmd == ("/opt/llama-server", "--model", "/models/my model.gguf", "--ctx-size", "4096", "--jinja")


def test_comment_lines_are_removed_before_macro_expansion(load, monkeypatch):
    model = load(
        """
        models:
          m:
            proxy: http://h:1
            cmd: |
              # ${undefined_macro} in a comment is fine
              run
        """
    ).models["m"]
    assert model.cmd == ("run",)


def test_shell_syntax_is_not_interpreted():
    assert split_command("echo $HOME | grep x > out; 'a b' \"c\\\"d\"") == (
        "echo", "$HOME", "|", "grep", "x", ">", "out;", "a b", 'c"d',
    )


def test_inline_hash_is_an_argument_not_a_comment():
    assert split_command("server --tag a#b # not a comment") == ("server", "--tag", "a#b", "#", "not", "a", "comment")


def test_folded_yaml_command(load):
    model = load(
        """
        models:
          m:
            proxy: http://h:1
            cmd: >
              /app/llama-server
              -hf org/repo:Q4_K_M
              --port 9999
        """
    ).models["m"]
    assert model.cmd == ("/app/llama-server", "-hf", "org/repo:Q4_K_M", "--port", "9999")


def test_cmd_stop_keeps_pid_placeholder_and_drops_comments(load):
    model = load(
        """
        models:
          m:
            cmd: docker run --name ${MODEL_ID} image
            proxy: http://h:1
            cmdStop: |
              # graceful
              docker stop ${MODEL_ID} --pid=${PID}
        """
    ).models["m"]
    assert model.cmd_stop == ("docker", "stop", "m", "--pid=${PID}")


def test_unclosed_quote_is_reported(config_error, problem):
    message = problem(config_error("models: {m: {cmd: 'run \"oops', proxy: 'http://h:1'}}"), "models.m.cmd")
    assert "no closing quotation" in message and "close every quote" in message


@pytest.mark.parametrize("cmd", ["''", "'# only a comment'", "null"])
def test_empty_cmd_is_reported(config_error, problem, cmd):
    message = problem(config_error(f"models: {{m: {{cmd: {cmd}, checkEndpoint: none}}}}"), "models.m.cmd")
    assert "every model needs the command" in message


@pytest.mark.parametrize("cmd", ["", "cmd: ''", "cmd: '# only a comment'"])
def test_a_model_with_a_proxy_and_no_cmd_is_loaded_as_llama_swap_loads_it(load, cmd):
    """llama-swap's loader takes it (its schema asks for cmd, its code does not) and fails each request for it;
    the warning says so, and where a server that runs on its own belongs."""
    config = load(f"models: {{remote: {{proxy: 'https://api.example.com', {cmd}}}, m: {{cmd: run, proxy: 'http://h:1'}}}}")
    assert config.models["remote"].cmd == () and config.models["remote"].proxy == "https://api.example.com"
    (warning,) = config.warnings
    assert warning.startswith("config.yaml: models.remote.cmd: ")
    assert "a request for it gets 503" in warning and "peers: {<name>: {proxy: <its URL>, models: [remote]}}" in warning
    assert "(none: each request for it gets 503)" in config.describe()


def test_cmd_must_be_text(config_error, problem):
    assert "quote it" in problem(config_error("models: {m: {cmd: 42, proxy: 'http://h:1'}}"), "models.m.cmd")
