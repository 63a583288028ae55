"""Loading a config file: defaults, resolved values, and whole-file errors."""

import dataclasses
import pickle

import pytest

from proxy.config import Config, ConfigError, ModelConfig, Problem, load_config, parse_config

MINIMAL = """
models:
  llama:
    cmd: llama-server --port ${PORT} -m /models/llama.gguf
"""


def test_minimal_config_gets_llama_swap_defaults(load):
    config = load(MINIMAL)
    assert isinstance(config, Config)
    assert config.path == "config.yaml"
    assert config.health_check_timeout == 120
    assert config.start_port == 5800
    assert config.global_ttl == 0
    assert config.unload_timeout == 10
    assert config.api_keys == ()
    assert config.log_level == "info"
    assert config.preload == ()
    assert config.groups == ()
    assert config.scheduler.use == "fifo"
    assert config.scheduler.fifo_priority == {}
    assert config.scheduler.serial.aging_divisor == 60
    assert config.scheduler.serial.swap_affinity_bonus == 10
    assert config.max_request_body_bytes == 32 * 1024 * 1024
    assert config.metrics_require_api_key is False
    assert config.warnings == ()


def test_minimal_model_gets_llama_swap_defaults(load):
    model = load(MINIMAL).models["llama"]
    assert isinstance(model, ModelConfig)
    assert model.id == "llama"
    assert model.cmd == ("llama-server", "--port", "5800", "-m", "/models/llama.gguf")
    assert model.cmd_stop == ()
    assert model.proxy == "http://127.0.0.1:5800"
    assert model.port == 5800
    assert model.check_endpoint == "/health"
    assert model.ttl == 0
    assert model.unload_timeout == 10
    assert model.aliases == ()
    assert model.env == ()
    assert model.unlisted is False
    assert model.use_model_name == ""
    assert model.name == "" and model.description == ""
    assert model.concurrency_limit == 10
    assert model.filters.is_empty
    assert model.metadata == {}


def test_every_model_key_is_read(load):
    model = load(
        """
        globalTTL: 600
        unloadTimeout: 20
        models:
          m:
            cmd: server
            cmdStop: kill -TERM ${PID}
            proxy: http://127.0.0.1:9000/
            checkEndpoint: none
            ttl: 30
            unloadTimeout: 3
            aliases: [a1, a2]
            env: ["CUDA_VISIBLE_DEVICES=0,1", "EMPTY="]
            unlisted: true
            useModelName: org/m
            name: The M
            description: It is M
            concurrencyLimit: 2
            metadata: {family: m}
        """
    ).models["m"]
    assert model.cmd_stop == ("kill", "-TERM", "${PID}")
    assert model.proxy == "http://127.0.0.1:9000"
    assert model.port is None
    assert model.check_endpoint is None
    assert model.ttl == 30
    assert model.unload_timeout == 3
    assert model.aliases == ("a1", "a2")
    assert model.env == (("CUDA_VISIBLE_DEVICES", "0,1"), ("EMPTY", ""))
    assert model.unlisted is True
    assert model.use_model_name == "org/m"
    assert (model.name, model.description) == ("The M", "It is M")
    assert model.concurrency_limit == 2
    assert model.metadata == {"family": "m"}


def test_ttl_and_unload_timeout_fall_back_to_global_values(load):
    config = load(
        """
        globalTTL: 600
        unloadTimeout: 20
        models:
          inherits: {cmd: a, proxy: "http://h:1", ttl: -1, unloadTimeout: 0}
          never: {cmd: b, proxy: "http://h:2", ttl: 0}
        """
    )
    assert config.models["inherits"].ttl == 600
    assert config.models["inherits"].unload_timeout == 20
    assert config.models["never"].ttl == 0


def test_check_endpoint_gets_a_leading_slash(load):
    model = load("models: {m: {cmd: a, proxy: 'http://h:1', checkEndpoint: v1/models}}").models["m"]
    assert model.check_endpoint == "/v1/models"


def test_top_level_settings_are_read(load):
    config = load(
        """
        healthCheckTimeout: 300
        startPort: 9000
        logLevel: debug
        apiKeys: [sk-one, sk-two]
        maxRequestBodyBytes: 1024
        metricsRequireApiKey: true
        models:
          m: {cmd: "s --port ${PORT}"}
        """
    )
    assert config.health_check_timeout == 300
    assert config.models["m"].port == 9000
    assert config.log_level == "debug"
    assert config.api_keys == ("sk-one", "sk-two")
    assert config.max_request_body_bytes == 1024
    assert config.metrics_require_api_key is True


def test_short_health_check_timeout_is_raised_to_15_with_a_warning(load):
    config = load("healthCheckTimeout: 5\n" + MINIMAL)
    assert config.health_check_timeout == 15
    assert any("healthCheckTimeout" in w and "15" in w for w in config.warnings)


def test_short_health_check_timeout_is_kept_when_the_environment_allows_it(load, monkeypatch):
    monkeypatch.setenv("LLAMASWAP_ALLOW_SHORT_HEALTH_TIMEOUT", "1")
    assert load("healthCheckTimeout: 2\n" + MINIMAL).health_check_timeout == 2


def test_models_are_sorted_by_id_and_read_only(load):
    config = load(
        """
        models:
          zeta: {cmd: z, proxy: "http://h:1"}
          alpha: {cmd: a, proxy: "http://h:2"}
        """
    )
    assert list(config.models) == ["alpha", "zeta"]
    with pytest.raises(TypeError):
        config.models["beta"] = config.models["alpha"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.models["alpha"].ttl = 5


def test_nested_metadata_cannot_be_changed_but_serialises_as_json(load):
    import json

    model = load("models: {m: {cmd: a, proxy: 'http://h:1', metadata: {tags: [x], nested: {k: 1}}}}").models["m"]
    with pytest.raises(TypeError):
        model.metadata["nested"]["k"] = 2
    with pytest.raises(AttributeError):
        model.metadata["tags"].append("y")
    assert json.loads(json.dumps(model.metadata)) == {"tags": ["x"], "nested": {"k": 1}}


def test_resolve_finds_models_by_id_and_alias(load):
    config = load("models: {llama: {cmd: a, proxy: 'http://h:1', aliases: [gpt-4o]}}")
    assert config.resolve("llama").id == "llama"
    assert config.resolve("gpt-4o").id == "llama"
    assert config.resolve("nope") is None
    assert config.aliases == {"gpt-4o": "llama"}


def test_load_config_reads_the_file_and_names_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    config = load_config(path)
    assert config.path == str(path)
    assert config.models["llama"].port == 5800


def test_missing_file_is_a_config_error_with_its_path(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: file not found")
    assert "--config" in str(info.value)


def test_yaml_syntax_error_gives_the_line(config_error):
    error = config_error(
        """
        models:
          llama:
            cmd: a
           proxy: b
        """
    )
    assert error.path == "config.yaml"
    assert error.key == ""
    assert "line 5" in error.message
    assert "YAML syntax error" in error.message
    assert "indentation" in error.message


def test_duplicate_yaml_keys_are_reported_with_both_lines(config_error, problem):
    error = config_error(
        """
        models:
          llama: {cmd: a, proxy: "http://h:1"}
          llama: {cmd: b, proxy: "http://h:2"}
        """
    )
    message = problem(error, "models.llama")
    assert "lines 3 and 4" in message and "remove or rename" in message


@pytest.mark.parametrize("text, got", [("", "empty"), ("- a\n- b\n", "a list"), ("just text\n", "string")])
def test_top_level_must_be_a_mapping(config_error, text, got):
    error = config_error(text)
    assert error.key == ""
    assert got in error.message
    assert "models:" in error.message


def test_missing_models_section(config_error, problem):
    assert "add a `models:` section" in problem(config_error("logLevel: info\n"), "models")


def test_missing_cmd(config_error, problem):
    message = problem(config_error("models: {llama: {checkEndpoint: none}}"), "models.llama.cmd")
    assert message.startswith("missing") and "cmd: llama-server" in message


def test_all_problems_of_a_file_are_reported_at_once(config_error):
    error = config_error(
        """
        logLevel: loud
        models:
          a: {unlisted: true}
          b: {cmd: x, proxy: "http://h:2", ttl: abc, concurrencyLimit: -1}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {agingDivisor: -1, swapAffinityBonus: 150}
        """
    )
    keys = {p.key for p in error.problems}
    assert keys == {
        "logLevel",
        "models.a.cmd",
        "models.a.proxy",
        "models.b.ttl",
        "models.b.concurrencyLimit",
        "routing.scheduler.settings.serial.agingDivisor",
        "routing.scheduler.settings.serial.swapAffinityBonus",
    }
    assert len(str(error).splitlines()) == len(error.problems)
    assert all(line.startswith("config.yaml: ") for line in str(error).splitlines())


def test_config_error_survives_pickling():
    error = ConfigError("c.yaml", [Problem("a.b", "bad — fix it")])
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.problems, str(copy)) == ("c.yaml", error.problems, "c.yaml: a.b: bad — fix it")


def test_parse_config_default_path_appears_in_messages():
    with pytest.raises(ConfigError) as info:
        parse_config("logLevel: info\n")
    assert str(info.value).startswith("<string>: models:")


def test_describe_summarises_scheduler_and_models(load):
    text = load(
        """
        routing:
          router:
            settings:
              groups:
                big: {members: [llama]}
          scheduler:
            use: serial
            settings: {serial: {agingDivisor: 30, swapAffinityBonus: 5, slots: {gpt-4o: 2}}}
        models:
          llama:
            cmd: llama-server --port ${PORT} -m "/models/my model.gguf"
            aliases: [gpt-4o]
            ttl: 300
        """
    ).describe()
    assert "serial (agingDivisor 30, swapAffinityBonus 5, slots llama: 2)" in text
    assert "llama" in text and "gpt-4o" in text and "group: big" in text
    assert "llama-server --port 5800 -m '/models/my model.gguf'" in text
    assert "http://127.0.0.1:5800" in text and "300s" in text
