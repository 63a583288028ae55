"""`selectors:` and `profiles:`: what they read, and the errors that name the key path and the fix."""

MODELS = """
models:
  a:
    cmd: llama-server --port ${PORT}
  b:
    cmd: llama-server --port ${PORT}
    aliases: [bee]
  c:
    cmd: llama-server --port ${PORT}
peers:
  box:
    proxy: http://192.168.1.23:8080
    models: [remote-m]
"""


def test_selectors_are_read_with_their_defaults(load):
    config = load(MODELS + """
macros:
  purpose: coding
selectors:
  coding:
    strategy: warm
    targets: [a, bee, box/remote-m]
    name: Coding
    description: the loaded coder
    unlisted: true
    metadata: {purpose: "${purpose}"}
  plain:
    strategy: pin
    targets: [remote-m]
""")
    coding = config.selectors["coding"]
    assert (coding.strategy, coding.targets, coding.name, coding.description, coding.unlisted) == (
        "warm", ("a", "bee", "box/remote-m"), "Coding", "the loaded coder", True)
    assert coding.metadata == {"purpose": "coding"}
    assert coding.spillover == 1
    assert config.selectors["plain"].targets == ("remote-m",)
    assert config.warnings == ()


def test_spillover_targets_that_can_run_together(load):
    config = load(MODELS + """
groups:
  pair: {swap: false, members: [a, b]}
selectors:
  wide:
    strategy: spillover
    targets: [a, bee, box/remote-m]
    settings: {spillover: 4}
""")
    assert config.selectors["wide"].spillover == 4


def test_spillover_targets_in_one_matrix_set(load):
    config = load(MODELS + """
routing:
  router:
    use: matrix
    settings:
      matrix:
        vars: {a: a, b: b, c: c}
        sets:
          pair: "a & b"
selectors:
  wide: {strategy: spillover, targets: [a, b]}
  lonely: {strategy: warm, targets: [a, c]}
""")
    assert set(config.selectors) == {"wide", "lonely"}


def test_spillover_targets_that_swap_are_refused_with_the_fix(config_error, problem):
    error = config_error(MODELS + """
routing:
  router:
    use: matrix
    settings:
      matrix:
        vars: {a: a, b: b, c: c}
        sets:
          pair: "a & b"
selectors:
  wide: {strategy: spillover, targets: [a, c]}
""")
    message = problem(error, "selectors.wide.targets")
    assert "a, c run together" in message and "swap: false" in message and "one matrix set" in message

    error = config_error(MODELS + """
selectors:
  wide: {strategy: spillover, targets: [a, bee]}
""")
    assert "does not let a, b run together" in problem(error, "selectors.wide.targets")


def test_selector_errors_name_the_key_path_and_the_fix(config_error, problem):
    error = config_error(MODELS + """
selectors:
  a: {strategy: pin, targets: [b]}
  bee: {strategy: pin, targets: [b]}
  box: {strategy: pin, targets: [b]}
  box/remote-m: {strategy: pin, targets: [b]}
  no-strategy: {targets: [a]}
  bad-strategy: {strategy: fastest, targets: [a]}
  no-targets: {strategy: pin}
  empty-targets: {strategy: pin, targets: []}
  bad-targets: {strategy: warm, targets: [nope, no-strategy, a, a, 3]}
  bad-spillover: {strategy: spillover, targets: [a], settings: {spillover: 0}}
  empty:
""")
    assert "already a model ID" in problem(error, "selectors.a")
    assert "already an alias of model b" in problem(error, "selectors.bee")
    assert "already a peer's ID" in problem(error, "selectors.box")
    assert "already the name of a peer's model" in problem(error, "selectors.box/remote-m")
    assert "missing — choose one of: pin, warm, spillover" in problem(error, "selectors.no-strategy.strategy")
    assert 'unknown strategy "fastest"' in problem(error, "selectors.bad-strategy.strategy")
    assert "list at least one" in problem(error, "selectors.no-targets.targets")
    assert "list at least one" in problem(error, "selectors.empty-targets.targets")
    assert 'no model, alias or peer model is called "nope"' in problem(error, "selectors.bad-targets.targets[0]")
    assert "cannot target another selector" in problem(error, "selectors.bad-targets.targets[1]")
    assert "listed twice" in problem(error, "selectors.bad-targets.targets[3]")
    assert "expected text" in problem(error, "selectors.bad-targets.targets[4]")
    assert "below the minimum of 1" in problem(error, "selectors.bad-spillover.settings.spillover")
    assert "give the selector a strategy and its targets" in problem(error, "selectors.empty")


def test_unknown_selector_keys_are_warned(load):
    config = load(MODELS + """
selectors:
  s: {strategy: pin, targets: [a], stratgy: warm, settings: {spilover: 2}}
""")
    assert any("selectors.s.stratgy: unknown key" in w for w in config.warnings)
    assert any("selectors.s.settings.spilover: unknown key" in w for w in config.warnings)


def test_profiles_are_read_with_disabled_pins(load):
    config = load(MODELS + """
selectors:
  warmest: {strategy: warm, targets: [a, b]}
profiles:
  coding:
    description: Coding models
    pins:
      llm-code: bee
      llm-plan: warmest
      remote: box/remote-m
      a: b
      image: ~
      audio: ""
  bare: {}
""")
    coding = config.profiles["coding"]
    assert coding.description == "Coding models"
    assert dict(coding.pins) == {"llm-code": "bee", "llm-plan": "warmest", "remote": "box/remote-m", "a": "b",
                                 "image": "", "audio": ""}
    assert dict(config.profiles["bare"].pins) == {}
    assert config.warnings == ()
    described = config.describe().splitlines()
    assert "selector warmest (warm): a, b" in described
    assert "profile coding: llm-code → bee, llm-plan → warmest, remote → box/remote-m, a → b, image → disabled, " \
           "audio → disabled" in described
    assert "profile bare: no pins" in described


def test_profile_errors_name_the_key_path_and_the_fix(config_error, problem):
    error = config_error(MODELS + """
profiles:
  coding:
    pins:
      llm-code: nope
      number: 3
  not-pins:
    pins: [a]
  empty:
""")
    message = problem(error, "profiles.coding.pins.llm-code")
    assert 'no model, alias, peer model or selector is called "nope"' in message and "~ to disable" in message
    assert "expected a model ID, alias, peer model or selector" in problem(error, "profiles.coding.pins.number")
    assert "expected a mapping of model ID: target" in problem(error, "profiles.not-pins.pins")
    assert "give the profile its pins" in problem(error, "profiles.empty")


def test_no_selectors_or_profiles(load):
    config = load(MODELS)
    assert dict(config.selectors) == {} and dict(config.profiles) == {}


def test_the_startup_profile_must_be_a_profile(load, config_error, problem):
    profiles = MODELS + """
profiles:
  coding: {pins: {llm-code: a}}
hooks:
  on_startup:
    preload: [a]
    profile: %s
"""
    config = load(profiles % "coding")
    assert (config.startup_profile, config.preload) == ("coding", ("a",))
    assert load(MODELS).startup_profile == ""
    message = problem(config_error(profiles % "writing"), "hooks.on_startup.profile")
    assert '"writing" is not a profile' in message and "coding" in message
