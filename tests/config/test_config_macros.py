"""Macros: declaration rules, scopes, typed substitution, ${env.*}, ${PORT} and ${MODEL_ID}."""

import textwrap

import pytest

from proxy.config import parse_config


def test_global_macro_expands_in_cmd_and_macros_use_earlier_macros(load):
    model = load(
        """
        macros:
          base: /models
          path: ${base}/llama
          full: "${path}/model.gguf"
        models:
          m: {cmd: "load ${full}", proxy: "http://h:1"}
        """
    ).models["m"]
    assert model.cmd == ("load", "/models/llama/model.gguf")


def test_model_macro_overrides_global_even_inside_other_global_macros(load):
    config = load(
        """
        macros:
          tag: global
          msg: value-${tag}
        models:
          overriding:
            macros: {tag: model-level}
            cmd: echo ${msg}
            proxy: http://h:1
          plain: {cmd: "echo ${msg}", proxy: "http://h:2"}
        """
    )
    assert config.models["overriding"].cmd == ("echo", "value-model-level")
    assert config.models["plain"].cmd == ("echo", "value-global")


def test_model_id_macro_works_in_global_macros_and_model_fields(load):
    model = load(
        """
        macros:
          podman: podman run --name ${MODEL_ID} image
        models:
          my-model:
            cmd: ${podman} -m model.gguf
            cmdStop: podman stop ${MODEL_ID}
            proxy: http://h:1
            name: "Model: ${MODEL_ID}"
        """
    ).models["my-model"]
    assert model.cmd == ("podman", "run", "--name", "my-model", "image", "-m", "model.gguf")
    assert model.cmd_stop == ("podman", "stop", "my-model")
    assert model.name == "Model: my-model"


def test_macros_expand_in_every_model_value(load):
    model = load(
        """
        macros: {dev: "0", who: me}
        models:
          m:
            cmd: a
            proxy: http://h:1
            checkEndpoint: /health/${who}
            aliases: ["${MODEL_ID}-alias"]
            env: ["CUDA_VISIBLE_DEVICES=${dev}"]
            useModelName: org/${who}
            description: by ${who}
            filters: {stripParams: "${who}", setParams: {user: "${who}"}}
        """
    ).models["m"]
    assert model.check_endpoint == "/health/me"
    assert model.aliases == ("m-alias",)
    assert model.env == (("CUDA_VISIBLE_DEVICES", "0"),)
    assert model.use_model_name == "org/me"
    assert model.description == "by me"
    assert model.filters.strip_params == ("me",)
    assert model.filters.set_params == {"user": "me"}


def test_typed_substitution_keeps_the_macro_type_only_for_whole_values(load):
    model = load(
        """
        macros: {ctx: 4096, temp: 0.7, fast: true, label: x}
        models:
          m:
            cmd: run --ctx ${ctx} --temp ${temp} --fast ${fast}
            proxy: http://h:1
            ttl: ${ctx}
            metadata:
              ctx: ${ctx}
              temp: ${temp}
              fast: ${fast}
              label: ${label}
              text: "ctx=${ctx} fast=${fast}"
              list: ["${temp}", "${MODEL_ID}"]
        """
    ).models["m"]
    assert model.cmd == ("run", "--ctx", "4096", "--temp", "0.7", "--fast", "true")
    assert model.ttl == 4096
    assert model.metadata["ctx"] == 4096 and isinstance(model.metadata["ctx"], int)
    assert model.metadata["temp"] == 0.7
    assert model.metadata["fast"] is True
    assert model.metadata["label"] == "x"
    assert model.metadata["text"] == "ctx=4096 fast=true"
    assert model.metadata["list"] == (0.7, "m")


def test_numeric_macro_in_a_text_field_becomes_text(load):
    assert load("macros: {v: 2}\nmodels: {m: {cmd: a, proxy: 'http://h:1', name: '${v}'}}").models["m"].name == "2"


def test_mapping_keys_are_not_expanded(load):
    metadata = load("macros: {k: v}\nmodels: {m: {cmd: a, proxy: 'http://h:1', metadata: {'${k}': 1}}}").models["m"].metadata
    assert metadata == {"${k}": 1}


def test_global_macros_expand_in_top_level_values(load):
    config = load(
        """
        macros: {key: sk-secret, timeout: 30}
        healthCheckTimeout: ${timeout}
        apiKeys: ["${key}"]
        models:
          m: {cmd: a, proxy: "http://h:1"}
        """
    )
    assert config.api_keys == ("sk-secret",)
    assert config.health_check_timeout == 30


@pytest.mark.parametrize("name", ["PORT", "MODEL_ID", "PID"])
def test_reserved_macro_names_are_rejected(config_error, problem, name):
    error = config_error(f"macros: {{{name}: x}}\nmodels: {{m: {{cmd: a, proxy: 'http://h:1'}}}}")
    message = problem(error, f"macros.{name}")
    assert "reserved" in message and "choose another name" in message


def test_macro_name_rules(config_error, problem):
    long_name = "n" * 64
    error = config_error(
        f"""
        macros:
          "bad name": x
          {long_name}: x
        models:
          m: {{cmd: a, proxy: "http://h:1", macros: {{"a.b": x}}}}
        """
    )
    assert "letters, digits" in problem(error, "macros.bad name")
    assert "under 64" in problem(error, f"macros.{long_name}")
    assert "letters, digits" in problem(error, "models.m.macros.a.b")


@pytest.mark.parametrize("value, got", [("[1, 2]", "a list"), ("{a: 1}", "a mapping"), ("null", "nothing")])
def test_macro_values_must_be_scalars(config_error, problem, value, got):
    message = problem(config_error(f"macros: {{m: {value}}}\nmodels: {{x: {{cmd: a, proxy: 'http://h:1'}}}}"), "macros.m")
    assert got in message and "string, number or bool" in message


def test_macro_may_not_refer_to_itself(config_error, problem):
    error = config_error("macros: {loop: 'x ${loop}'}\nmodels: {m: {cmd: a, proxy: 'http://h:1'}}")
    assert "refers to itself" in problem(error, "macros.loop")


def test_macro_may_only_use_macros_declared_before_it(config_error, problem):
    error = config_error(
        """
        macros:
          args: --ctx ${ctx}
          ctx: 4096
          other: ${nowhere}
        models:
          m: {cmd: a, proxy: "http://h:1"}
        """
    )
    assert "move ctx above args" in problem(error, "macros.args")
    assert "not declared" in problem(error, "macros.other")


def test_override_loop_between_model_and_global_macros_is_reported(config_error, problem):
    error = config_error(
        """
        macros:
          a: x
          b: ${a}
        models:
          m:
            macros: {a: "${b}"}
            cmd: run ${a}
            proxy: http://h:1
        """
    )
    assert "refer to each other" in problem(error, "models.m.cmd")


def test_unknown_macro_left_in_a_field_is_named(config_error, problem):
    error = config_error("models: {m: {cmd: 'run ${ctx}', proxy: 'http://h:1', description: '${nope}'}}")
    message = problem(error, "models.m.cmd")
    assert "${ctx} is not a defined macro" in message and "models.m.macros" in message
    assert "${nope}" in problem(error, "models.m.description")


def test_pid_is_only_allowed_in_cmd_stop(config_error, problem):
    error = config_error("models: {m: {cmd: 'run ${PID}', cmdStop: 'kill ${PID}', proxy: 'http://h:1'}}")
    assert "only known in cmdStop" in problem(error, "models.m.cmd")
    assert all(p.key != "models.m.cmdStop" for p in error.problems)


def test_model_id_outside_models_is_an_error(config_error, problem):
    error = config_error("apiKeys: ['${MODEL_ID}']\nmodels: {m: {cmd: a, proxy: 'http://h:1'}}")
    assert "only exists inside a model" in problem(error, "apiKeys[0]")


class TestEnvironmentMacros:
    def test_env_macro_is_replaced_everywhere_and_keeps_yaml_types(self, load, monkeypatch):
        monkeypatch.setenv("MODELS_DIR", "/srv/models")
        monkeypatch.setenv("TTL", "90")
        monkeypatch.setenv("QUOTED", 'say "hi" \\ bye')
        config = load(
            """
            macros:
              dir: ${env.MODELS_DIR}
            models:
              m:
                cmd: run -m ${dir}/a.gguf
                proxy: http://h:1
                ttl: ${env.TTL}
                description: "${env.QUOTED}"
                metadata: {ttl_text: "${env.TTL}"}
            """
        )
        model = config.models["m"]
        assert model.cmd == ("run", "-m", "/srv/models/a.gguf")
        assert model.ttl == 90
        assert model.description == 'say "hi" \\ bye'
        assert model.metadata == {"ttl_text": "90"}

    def test_env_macros_in_comments_are_ignored(self, load, monkeypatch):
        monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
        config = load(
            """
            # uses ${env.NOT_SET_ANYWHERE} in a comment
            models:
              m: {cmd: a, proxy: "http://h:1"}  # ${env.NOT_SET_ANYWHERE}
            """
        )
        assert "m" in config.models

    def test_unset_env_variable_is_an_error_naming_it_and_its_line(self, config_error, problem, monkeypatch):
        monkeypatch.delenv("HF_TOKEN_FOR_TEST", raising=False)
        error = config_error(
            """
            models:
              m:
                cmd: run --token ${env.HF_TOKEN_FOR_TEST}
                proxy: http://h:1
            """
        )
        message = problem(error, "models.m.cmd")
        assert "${env.HF_TOKEN_FOR_TEST}" in message and "line 4" in message
        assert "export HF_TOKEN_FOR_TEST" in message

    def test_unset_env_variables_do_not_hide_the_other_problems(self, config_error, problem, monkeypatch):
        for name in ("UNSET_PORT_FOR_TEST", "UNSET_TOKEN_FOR_TEST", "UNSET_FLAG_FOR_TEST"):
            monkeypatch.delenv(name, raising=False)
        error = config_error(
            """
            startPort: ${env.UNSET_PORT_FOR_TEST}
            models:
              m:
                cmd: run --token ${env.UNSET_TOKEN_FOR_TEST} ${env.UNSET_FLAG_FOR_TEST}
                proxy: http://h:1
                ttl: -5
            routing:
              scheduler:
                use: serial
                settings:
                  serial: {swapAffinityBonus: 150}
            """
        )
        assert sorted({p.key for p in error.problems}) == [
            "models.m.cmd", "models.m.ttl", "routing.scheduler.settings.serial.swapAffinityBonus", "startPort",
        ], str(error)
        assert "${env.UNSET_PORT_FOR_TEST}" in problem(error, "startPort")
        cmd_problems = [p.message for p in error.problems if p.key == "models.m.cmd"]
        assert len(cmd_problems) == 2
        assert "UNSET_TOKEN_FOR_TEST" in cmd_problems[0] and "UNSET_FLAG_FOR_TEST" in cmd_problems[1]

    def test_an_unset_env_variable_reached_through_a_macro_is_reported_once_where_it_is_used(
        self, config_error, problem, monkeypatch
    ):
        monkeypatch.delenv("UNSET_DIR_FOR_TEST", raising=False)
        error = config_error(
            """
            macros:
              dir: ${env.UNSET_DIR_FOR_TEST}
            models:
              a:
                cmd: ${dir}/llama-server
              b:
                cmd: llama-server --port ${PORT}
                aliases: [a]
            """
        )
        assert "export UNSET_DIR_FOR_TEST" in problem(error, "macros.dir")
        # b's alias clashes with a's ID; a's cmd and proxy depend on the unset variable and say nothing.
        assert sorted(p.key for p in error.problems) == ["macros.dir", "models.b.aliases[0]"], str(error)

    def test_env_value_with_a_newline_is_rejected(self, config_error, problem, monkeypatch):
        monkeypatch.setenv("MULTI_LINE", "a\nb")
        error = config_error("models: {m: {cmd: 'run ${env.MULTI_LINE}', proxy: 'http://h:1'}}")
        assert "newline" in problem(error, "models.m.cmd")


class TestPortAllocation:
    def test_ports_go_to_models_whose_cmd_uses_port_in_sorted_id_order(self, load):
        config = load(
            """
            startPort: 7000
            models:
              zeta: {cmd: "z --port ${PORT}"}
              fixed: {cmd: "f --port 9999", proxy: "http://127.0.0.1:9999"}
              alpha: {cmd: "a --port ${PORT}"}
              beta: {cmd: "b --port=${PORT}", proxy: "http://127.0.0.1:${PORT}/v1"}
            """
        )
        ports = {model_id: model.port for model_id, model in config.models.items()}
        assert ports == {"alpha": 7000, "beta": 7001, "fixed": None, "zeta": 7002}
        assert config.models["beta"].cmd == ("b", "--port=7001")
        assert config.models["beta"].proxy == "http://127.0.0.1:7001/v1"
        assert config.models["zeta"].proxy == "http://127.0.0.1:7002"

    def test_a_reload_keeps_each_models_port_and_gives_new_models_free_ones(self):
        """Adding `aaa` (sorted first) and removing `beta` renumbers nothing: each model's process keeps running."""
        def ports(text, kept=None):
            config = parse_config(textwrap.dedent(text), "config.yaml", kept)
            return {model_id: model.port for model_id, model in config.models.items()}

        before = ports("""
            startPort: 7000
            models: {alpha: {cmd: "a ${PORT}"}, beta: {cmd: "b ${PORT}"}, zeta: {cmd: "z ${PORT}"}}
            """)
        assert before == {"alpha": 7000, "beta": 7001, "zeta": 7002}
        after = ports("""
            startPort: 7000
            models: {aaa: {cmd: "n ${PORT}"}, alpha: {cmd: "a ${PORT}"}, mid: {cmd: "m ${PORT}"}, zeta: {cmd: "z ${PORT}"}}
            """, before)
        assert after == {"aaa": 7001, "alpha": 7000, "mid": 7003, "zeta": 7002}
        # A kept number below a raised startPort is not kept; a model read fresh numbers in ID order again.
        assert ports("startPort: 7002\nmodels: {alpha: {cmd: 'a ${PORT}'}, zeta: {cmd: 'z ${PORT}'}}", before) \
            == {"alpha": 7003, "zeta": 7002}
        assert ports("startPort: 7000\nmodels: {alpha: {cmd: 'a ${PORT}'}, zeta: {cmd: 'z ${PORT}'}}") \
            == {"alpha": 7000, "zeta": 7001}

    def test_port_through_a_macro_counts_and_expands_in_metadata(self, load):
        model = load(
            """
            macros:
              server: llama-server --port ${PORT}
            models:
              m:
                cmd: ${server} -m a.gguf
                metadata: {port: "${PORT}", url: "http://x:${PORT}"}
            """
        ).models["m"]
        assert model.port == 5800
        assert model.cmd == ("llama-server", "--port", "5800", "-m", "a.gguf")
        assert model.metadata == {"port": 5800, "url": "http://x:5800"}

    def test_port_in_proxy_without_port_in_cmd_is_an_error(self, config_error, problem):
        error = config_error("models: {m: {cmd: 'server --port 8080', proxy: 'http://127.0.0.1:${PORT}'}}")
        message = problem(error, "models.m.proxy")
        assert "${PORT} is only assigned to models whose cmd uses ${PORT}" in message
        assert "--port ${PORT}" in message

    def test_default_proxy_needs_port_in_cmd(self, config_error, problem):
        message = problem(config_error("models: {m: {cmd: 'server --port 8080'}}"), "models.m.proxy")
        assert message.startswith("not set") and "set proxy:" in message

    def test_running_out_of_ports_is_reported(self, config_error, problem):
        error = config_error("startPort: 65535\nmodels: {a: {cmd: 'a ${PORT}'}, b: {cmd: 'b ${PORT}'}}")
        assert "lower startPort" in problem(error, "startPort")
