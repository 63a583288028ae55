"""Keys llamaswap does not act on are warned about by key path, never fatal."""

BASE = """
models:
  m:
    cmd: run
    proxy: http://h:1
"""


def test_no_warnings_for_a_clean_config(load):
    assert load(BASE).warnings == ()


def test_llama_swap_keys_done_another_way_are_ignored_with_the_reason(load):
    config = load(
        """
        metricsMaxInMemory: 500
        store: {path: /var/lib/llama-swap/activity.db}
        ui: {activity: {session_id: [X-Session-ID]}}
        profiles: {}
        selectors: {}
        includeAliasesInList: true
        logRequests: true
        routing:
          router:
            settings:
              matrix: {sets: {a: m}}
        models:
          m:
            cmd: run
            proxy: http://h:1
            capabilities: {tools: true}
            timeouts: {connect: 5, idleConn: 90}
            sendLoadingState: true
            healthCheckTimeout: 10
            filters:
              setParamsByID: {"m:high": {effort: high}}
        """
    )
    warnings = set(config.warnings)
    for key, reason in (
        ("metricsMaxInMemory", "activity lives in its database"),
        ("store", "keeps every request in its database"),
        ("ui", "no llama-swap web UI"),
    ):
        assert any(w.startswith(f"config.yaml: {key}: ignored: ") and reason in w for w in warnings), key
    assert not any("not supported" in w for w in warnings)
    assert "config.yaml: logRequests: deprecated in llama-swap and ignored — remove it" in warnings
    assert any(w.startswith("config.yaml: models.m.healthCheckTimeout: cannot be set per model") for w in warnings)
    assert any(w.startswith("config.yaml: routing.router.settings.matrix: ignored") for w in warnings)


def test_unknown_keys_are_warned_with_a_spelling_hint(load):
    config = load(
        """
        logLevl: debug
        models:
          m:
            cmd: run
            proxy: http://h:1
            ttL: 5
            whatever: 1
        routing:
          scheduler:
            use: serial
            settings:
              serial: {agingDivisr: 5}
        hooks:
          on_startup: {preload: [m], warmup: yes}
        """
    )
    warnings = set(config.warnings)
    assert "config.yaml: logLevl: unknown key, ignored — did you mean logLevel?" in warnings
    assert "config.yaml: models.m.ttL: unknown key, ignored — did you mean ttl?" in warnings
    assert "config.yaml: models.m.whatever: unknown key, ignored — check the spelling" in warnings
    assert (
        "config.yaml: routing.scheduler.settings.serial.agingDivisr: unknown key, ignored — did you mean agingDivisor?"
        in warnings
    )
    assert any(w.startswith("config.yaml: hooks.on_startup.warmup: unknown key") for w in warnings)
    assert config.models["m"].ttl == 0


def test_names_from_other_tools_point_to_the_key_that_does_that_job(load):
    config = load(
        """
        readyTimeout: 30
        host: 0.0.0.0
        Port: 8080
        ttl: 60
        LogLevel: debug
        models:
          m:
            cmd: run --port ${PORT}
            readyTimeout: 30
            url: http://127.0.0.1:9000
            command: run
            hots: x
        """
    )
    hints = {w.split(": ", 2)[1]: w.split(" — ", 1)[1] for w in config.warnings}
    assert hints["readyTimeout"].startswith("did you mean healthCheckTimeout? (the seconds a starting model")
    assert hints["host"] == hints["Port"] == ("the address llamaswap listens on is no config key: "
                                              "`llamaswap serve --listen HOST:PORT`, as llama-swap's --listen")
    assert hints["ttl"] == "did you mean globalTTL? (a model's own is models.<id>.ttl)"
    assert hints["LogLevel"] == "did you mean logLevel?"  # letter case aside
    assert hints["models.m.readyTimeout"] == "a start is bounded by the top-level healthCheckTimeout (llama-swap has no per-model one)"
    assert hints["models.m.url"] == "did you mean proxy? (the URL of the model's server)"
    assert hints["models.m.command"] == "did you mean cmd?"
    assert hints["models.m.hots"] == "check the spelling"  # no key of a model is close enough
    assert not any("hooks" in w or "unloadTimeout" in w for w in config.warnings)


def test_a_top_level_key_that_holds_yaml_anchors_is_said_to_be_there_for_them(load):
    config = load(
        """
        defaults: &defaults
          ttl: 300
          env: [&lang "LANG=C"]
        x-commands:
          - &serve "run --port ${PORT}"
        also: *defaults
        models:
          m:
            <<: *defaults
            cmd: *serve
        """
    )
    assert config.models["m"].ttl == 300 and config.models["m"].cmd == ("run", "--port", str(config.models["m"].port))
    assert set(config.warnings) == {
        "config.yaml: defaults: not a setting: it holds the YAML anchors &defaults, &lang that other entries use, "
        "and is otherwise ignored, as llama-swap ignores it",
        "config.yaml: x-commands: not a setting: it holds the YAML anchors &serve that other entries use, and is "
        "otherwise ignored, as llama-swap ignores it",
        "config.yaml: also: unknown key, ignored — check the spelling",  # it only uses an anchor set elsewhere
    }


def test_empty_models_section_is_a_warning(load):
    config = load("models: {}\n")
    assert config.models == {}
    assert any("no models are defined" in w for w in config.warnings)


def test_connect_and_response_header_timeouts_are_read(load):
    config = load(
        """
        models:
          m:
            cmd: run --port ${PORT}
            timeouts: {connect: 5, responseHeader: 120}
          n:
            cmd: run --port ${PORT}
        """
    )
    assert (config.models["m"].timeouts.connect, config.models["m"].timeouts.response_header) == (5, 120)
    assert (config.models["n"].timeouts.connect, config.models["n"].timeouts.response_header) == (30, None)
    assert config.models["n"].proxy.startswith("http://127.0.0.1:")


def test_settings_of_the_scheduler_not_in_use_are_warned_by_key_path(load):
    config = load(BASE + "routing: {scheduler: {use: fifo, settings: {serial: {slots: {m: 2}}}}}\n")
    assert config.warnings == (
        "config.yaml: routing.scheduler.settings.serial.slots: ignored because routing.scheduler.use is fifo — "
        "serial settings apply only to the serial scheduler (use: serial)",
    )
    defaulted = load(BASE + "routing: {scheduler: {settings: {serial: {agingDivisor: 5}}}}\n")
    assert any(
        w.startswith("config.yaml: routing.scheduler.settings.serial.agingDivisor: ignored because "
                     "routing.scheduler.use is fifo (the default)")
        for w in defaulted.warnings
    ), defaulted.warnings
    serial = load(BASE + "routing: {scheduler: {use: serial, settings: {fifo: {priority: {m: 5}}, serial: {slots: {m: 2}}}}}\n")
    assert serial.warnings == (
        "config.yaml: routing.scheduler.settings.fifo.priority: ignored because routing.scheduler.use is serial — "
        "fifo settings apply only to the fifo scheduler (use: fifo)",
    )


def test_a_matrix_var_named_like_another_model_is_warned(load):
    config = load(
        """
        models:
          a: {cmd: run, proxy: "http://h:1", aliases: [alpha]}
          b: {cmd: run, proxy: "http://h:2"}
        routing:
          router:
            use: matrix
            settings:
              matrix:
                vars: {a: b, alpha: b, bee: b}
                sets: {one: "a"}
        """
    )
    key = "config.yaml: routing.router.settings.matrix.vars"
    assert config.warnings == (
        f'{key}.a: "a" is also model a, but this var stands for model b: in sets and evict_costs "a" means b, '
        "not a (a var wins over a model ID or alias) — rename the var if you meant a",
        f'{key}.alpha: "alpha" is also alias alpha of model a, but this var stands for model b: in sets and '
        'evict_costs "alpha" means b, not a (a var wins over a model ID or alias) — rename the var if you meant a',
    )
