"""Groups, aliases, the scheduler block and startup preload."""

import pytest

from scheduling.core.settings import SerialSettings
from scheduling.core.swap import SwapGroup

MODELS = """
models:
  llama: {cmd: a, proxy: "http://h:1", aliases: [gpt-4o]}
  qwen: {cmd: b, proxy: "http://h:2", aliases: [coder]}
  embed: {cmd: c, proxy: "http://h:3"}
"""


def test_routing_router_groups_with_flags_and_alias_members(load):
    config = load(
        MODELS
        + """
routing:
  router:
    use: group
    settings:
      groups:
        big: {members: [llama, coder]}
        side: {swap: false, exclusive: false, persistent: true, members: [embed]}
"""
    )
    assert config.groups == (
        SwapGroup(name="big", members=("llama", "qwen"), swap=True, exclusive=True, persistent=False),
        SwapGroup(name="side", members=("embed",), swap=False, exclusive=False, persistent=True),
    )
    assert config.warnings == ()


def test_legacy_top_level_groups(load):
    config = load(MODELS + "groups: {pair: {swap: false, members: [llama, qwen]}}\n")
    assert config.groups == (SwapGroup("pair", ("llama", "qwen"), swap=False),)


def test_mixing_legacy_groups_and_routing_router_is_an_error(config_error, problem):
    error = config_error(
        MODELS
        + """
groups: {a: {members: [llama]}}
routing: {router: {settings: {groups: {b: {members: [qwen]}}}}}
"""
    )
    assert "move the groups to routing.router.settings.groups" in problem(error, "groups")


def test_group_member_problems(config_error, problem):
    error = config_error(
        MODELS
        + """
routing:
  router:
    settings:
      groups:
        one: {members: [llama, ghost, llama]}
        two: {members: [gpt-4o]}
        "(default)": {members: [embed]}
        three: {swap: true}
"""
    )
    assert 'no model or alias is called "ghost"' in problem(error, "routing.router.settings.groups.one.members[1]")
    assert "listed twice" in problem(error, "routing.router.settings.groups.one.members[2]")
    assert "already in group one" in problem(error, "routing.router.settings.groups.two.members[0]")
    assert "rename this group" in problem(error, "routing.router.settings.groups.(default)")
    assert "members: [model-a" in problem(error, "routing.router.settings.groups.three.members")


def test_unknown_router_is_refused(config_error, problem):
    assert "valid routers are: group, matrix" in problem(config_error(MODELS + "routing: {router: {use: best}}\n"), "routing.router.use")


def test_serial_scheduler_settings(load):
    config = load(
        MODELS
        + """
routing:
  scheduler:
    use: serial
    settings:
      serial: {agingDivisor: 30, swapAffinityBonus: 0}
"""
    )
    assert config.scheduler.use == "serial"
    assert config.scheduler.serial == SerialSettings(aging_divisor=30.0, swap_affinity_bonus=0)


def test_unknown_scheduler_lists_the_valid_ones(config_error, problem):
    message = problem(config_error(MODELS + "routing: {scheduler: {use: lottery}}\n"), "routing.scheduler.use")
    assert '"lottery"' in message and "fifo, serial" in message


@pytest.mark.parametrize(
    "settings, key, expected",
    [
        ("{agingDivisor: -1}", "agingDivisor", "-1 is negative"),
        ("{swapAffinityBonus: 150}", "swapAffinityBonus", "150 is outside 0..99 — it must stay below the band spacing of 100"),
        ("{swapAffinityBonus: 2.5}", "swapAffinityBonus", "not a whole number"),
        ("{swapAffinityBonus: ten}", "swapAffinityBonus", "not a number"),
        ("{fairness: users}", "fairness", "'users' is not a fairness mode — use keys"),
        ("{fairness: true}", "fairness", "True is not a fairness mode"),
    ],
)
def test_serial_settings_problems(config_error, settings, key, expected):
    error = config_error(MODELS + f"routing: {{scheduler: {{use: serial, settings: {{serial: {settings}}}}}}}\n")
    line = f"config.yaml: routing.scheduler.settings.serial.{key}: "
    assert any(text.startswith(line) and expected in text for text in str(error).splitlines()), str(error)


@pytest.mark.parametrize("written, fairness", [("keys", "keys"), ("off", "off"), ('"off"', "off")])
def test_serial_fairness_is_keys_or_off(load, written, fairness):
    config = load(MODELS + f"routing: {{scheduler: {{settings: {{serial: {{fairness: {written}}}}}}}}}\n")
    assert config.scheduler.serial.fairness == fairness


def test_serial_fairness_is_off_unless_given(load):
    assert load(MODELS).scheduler.serial.fairness == "off"


def test_serial_slots_resolve_aliases_to_model_ids(load):
    config = load(MODELS + "routing: {scheduler: {use: serial, settings: {serial: {slots: {gpt-4o: 4, embed: 2}}}}}\n")
    serial = config.scheduler.serial
    assert dict(serial.slots) == {"llama": 4, "embed": 2}
    assert (serial.slots_for("llama"), serial.slots_for("qwen")) == (4, 1)
    assert serial.aging_divisor == SerialSettings().aging_divisor


@pytest.mark.parametrize(
    "slots, key, expected",
    [
        ("{llama: 0}", "slots.llama", "0 is below the minimum of 1"),
        ("{llama: two}", "slots.llama", "expected a whole number"),
        ("{llama: 1.5}", "slots.llama", "expected a whole number"),
        ("{mystery: 2}", "slots.mystery", "mystery"),
        ("{llama: 2, gpt-4o: 3}", "slots.gpt-4o", 'whose slots are already set by "llama"'),
        ("[llama]", "slots", "expected a mapping"),
    ],
)
def test_serial_slots_problems_name_the_key_path(config_error, slots, key, expected):
    error = config_error(MODELS + f"routing: {{scheduler: {{use: serial, settings: {{serial: {{slots: {slots}}}}}}}}}\n")
    line = f"config.yaml: routing.scheduler.settings.serial.{key}: "
    assert any(text.startswith(line) and expected in text for text in str(error).splitlines()), str(error)


def test_fifo_priority_resolves_aliases_to_model_ids(load):
    config = load(MODELS + "routing: {scheduler: {settings: {fifo: {priority: {gpt-4o: 10, qwen: 5}}}}}\n")
    assert config.scheduler.use == "fifo"
    assert dict(config.scheduler.fifo_priority) == {"llama": 10, "qwen": 5}
    with pytest.raises(TypeError):
        config.scheduler.fifo_priority["embed"] = 1


def test_fifo_priority_problems(config_error, problem):
    error = config_error(
        MODELS + "routing: {scheduler: {settings: {fifo: {priority: {ghost: 1, llama: 2, gpt-4o: 3, qwen: high}}}}}\n"
    )
    prefix = "routing.scheduler.settings.fifo.priority"
    message = problem(error, f"{prefix}.ghost")
    assert '"ghost"' in message and "defined models: embed, llama, qwen" in message
    assert 'already set by "llama"' in problem(error, f"{prefix}.gpt-4o")
    assert "whole number" in problem(error, f"{prefix}.qwen")


def test_preload_resolves_aliases_and_drops_repeats(load):
    config = load(MODELS + "hooks: {on_startup: {preload: [coder, llama, qwen, gpt-4o]}}\n")
    assert config.preload == ("qwen", "llama")


def test_preload_of_unknown_model_is_an_error(config_error, problem):
    error = config_error(MODELS + "hooks: {on_startup: {preload: [llama, selector-x]}}\n")
    assert '"selector-x"' in problem(error, "hooks.on_startup.preload[1]")


def test_alias_clashes(config_error, problem):
    error = config_error(
        """
models:
  a: {cmd: x, proxy: "http://h:1", aliases: [shared, b, a, twice, twice]}
  b: {cmd: y, proxy: "http://h:2", aliases: [shared]}
"""
    )
    assert "already the ID of model b" in problem(error, "models.a.aliases[1]")
    assert "model's own ID" in problem(error, "models.a.aliases[2]")
    assert "listed twice" in problem(error, "models.a.aliases[4]")
    assert "already an alias of model a" in problem(error, "models.b.aliases[0]")
