"""`hardware:` and each model's `memory`, `gpus`, `pinned`, `minResidency`, and `${GPUS}`: what they load as,
and every mistake named by key path with its fix, never a crash."""

import pytest

from proxy.config.hardware import MAX_MIB, SizeError, parse_size
from scheduling.core.placement import Hardware, MemoryNeed

TWO_GPUS = """
hardware:
  gpus:
    - {id: 0, memory: 24GiB}
    - {id: GPU-5b1e, memory: 16GB}
  cpu: {memory: 64GiB}
"""


def with_models(models: str, hardware: str = TWO_GPUS) -> str:
    return hardware + "models:\n" + models


@pytest.mark.parametrize(
    "written, mib",
    [
        (1024, 1024),
        ("1024", 1024),
        ("24GiB", 24 * 1024),
        ("24 gib", 24 * 1024),
        ("1.5GiB", 1536),
        ("0.5MiB", 1),  # rounded up: a need is never understated
        ("16GB", 15259),  # 16e9 bytes / 2^20 = 15258.8
        ("8000mb", 7630),
        (".5GiB", 512),
        ("+2GiB", 2048),
        (1e3, 1000),  # YAML 1.2 reads 1e3 as a number
        (MAX_MIB, MAX_MIB),
        ("1073741824GiB", MAX_MIB),
    ],
)
def test_sizes_are_whole_mib_rounded_up(written, mib):
    assert parse_size(written) == mib


@pytest.mark.parametrize(
    "written, reason",
    [
        (0, "0 is zero"),
        ("0GiB", '0GiB is zero'),
        (-1, "-1 is negative"),
        ("-2GiB", "-2GiB is negative"),
        ("24KB", 'has an unknown unit "KB"'),
        ("24G", 'has an unknown unit "G"'),
        ("lots", '"lots" is not a size'),
        ("GiB", '"GiB" is not a size'),
        ("\u0661\u0662GiB", "is not a size"),  # digits other than 0-9
        ("1.5", '"1.5" is not a whole number of MiB'),
        (1.5, "1.5 is not a whole number of MiB"),
        (float("inf"), "inf is not a finite size"),
        (float("nan"), "nan is not a finite size"),
        (True, "expected a size, got the bool true"),
        ([1], "expected a size, got a list"),
        (MAX_MIB + 1, "above the maximum of 2^40 MiB"),
        ("1073741825GiB", "above the maximum of 2^40 MiB"),
        ("1200000000GB", "above the maximum of 2^40 MiB"),
        ("9" * 50, "above the maximum of 2^40 MiB"),
        ("0." + "0" * 50 + "1GiB", "more than 40 decimals"),
    ],
)
def test_what_is_not_a_size_says_why(written, reason):
    with pytest.raises(SizeError) as raised:
        parse_size(written)
    assert reason in str(raised.value)


def test_hardware_and_model_needs_load(load):
    config = load(with_models("""
      big:
        cmd: llama-server --port ${PORT} --device ${GPUS}
        cmdStop: stop ${PID} ${GPUS}
        memory: 14GiB
        gpus: 2
        pinned: true
      small:
        cmd: llama-server --port ${PORT}
        memory: 8000MB
        minResidency: 300
      cpu-only:
        cmd: llama-server --port ${PORT}
        memory: 2GiB
        gpus: 0
    """))
    assert config.hardware == Hardware(gpus={"0": 24576, "GPU-5b1e": 15259}, cpu_mib=65536)
    assert list(config.hardware.gpus) == ["0", "GPU-5b1e"], "the file's order"
    big, small, cpu = config.models["big"], config.models["small"], config.models["cpu-only"]
    assert (big.memory, big.pinned, big.min_residency) == (MemoryNeed(14336, 2), True, 0.0)
    assert (small.memory, small.pinned, small.min_residency) == (MemoryNeed(7630, 1), False, 300.0)
    assert cpu.memory == MemoryNeed(2048, 0)
    assert big.cmd[-2:] == ("--device", "${GPUS}"), "filled in at each start, not by the loader"
    assert big.cmd_stop == ("stop", "${PID}", "${GPUS}")
    assert config.warnings == ()


def test_without_hardware_pinned_and_min_residency_are_read_and_warned_about_since_they_do_nothing(load):
    config = load("models: {m: {cmd: 'run --port ${PORT}', pinned: true, minResidency: 12.5}}")
    model = config.models["m"]
    assert config.hardware is None
    assert (model.memory, model.pinned, model.min_residency) == (None, True, 12.5)
    warned = [w for w in config.warnings if "takes effect with a top-level hardware" in w]
    assert len(warned) == 2 and "models.m.pinned" in warned[0] and "models.m.minResidency" in warned[1], config.warnings


def test_cpu_memory_is_optional_and_then_not_counted(load):
    config = load(with_models(
        "  m: {cmd: 'run --port ${PORT}', memory: 1000GiB, gpus: 0}\n",
        hardware="hardware: {gpus: [{id: 3, memory: 8GiB}]}\n",
    ))
    assert config.hardware == Hardware(gpus={"3": 8192}, cpu_mib=None)
    assert config.models["m"].memory == MemoryNeed(1000 * 1024, 0)


def test_a_macro_may_carry_gpus_into_cmd_but_none_may_be_named_gpus(load, config_error, problem):
    config = load(with_models("  m: {cmd: 'run --port ${PORT} ${devices}', memory: 1GiB}\n").replace(
        "hardware:", "macros: {devices: '--device ${GPUS}'}\nhardware:"))
    assert config.models["m"].cmd[-2:] == ("--device", "${GPUS}")

    error = config_error("macros: {GPUS: '0,1'}\nmodels: {m: {cmd: 'run --port ${PORT}', macros: {GPUS: 1}}}")
    assert "GPUS is reserved (set by llamaswap itself" in problem(error, "macros.GPUS")
    assert "GPUS is reserved" in problem(error, "models.m.macros.GPUS")


@pytest.mark.parametrize(
    "models, key, expected",
    [
        ("  m: {cmd: 'run --port ${PORT}'}\n", "models.m.memory",
         "missing — with a top-level `hardware:` section every model says what it needs on each GPU it uses, "
         "e.g. memory: 8GiB"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, gpus: 3}\n", "models.m.gpus",
         "3 is more than the 2 GPUs under hardware.gpus — use at most 2"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, gpus: -1}\n", "models.m.gpus", "below the minimum of 0"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, gpus: 1.5}\n", "models.m.gpus", "expected a whole number"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 25GiB}\n", "models.m.memory",
         "25600 MiB is more than any GPU has (the largest, GPU 0, has 24576 MiB), so the model could never start"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 20GiB, gpus: 2}\n", "models.m.memory",
         "20480 MiB on each of 2 GPUs fits on no 2 GPUs even with nothing else loaded: 1 of them has that much "
         "(the largest, GPU 0, has 24576 MiB)"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 65GiB, gpus: 0}\n", "models.m.memory",
         "66560 MiB is more than hardware.cpu.memory (65536 MiB), so this CPU-only model could never start"),
        ("  m: {cmd: 'run --port ${PORT}', memory: -8GiB}\n", "models.m.memory",
         "-8GiB is negative — write a whole number of MiB, or a number with MiB, GiB, MB or GB, e.g. memory: 8GiB"),
        ("  m: {cmd: 'run --port ${PORT}', memory: .inf}\n", "models.m.memory", "inf is not a finite size"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, pinned: sometimes}\n", "models.m.pinned",
         "expected true or false"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, minResidency: -1}\n", "models.m.minResidency",
         "below the minimum of 0 — e.g. minResidency: 300"),
        ("  m: {cmd: 'run --port ${PORT}', memory: 8GiB, minResidency: .inf}\n", "models.m.minResidency",
         "must be a finite number"),
    ],
)
def test_model_needs_that_cannot_be_placed(config_error, problem, models, key, expected):
    assert expected in problem(config_error(with_models(models)), key)


@pytest.mark.parametrize("name, value", [("memory", "8GiB"), ("gpus", "2")])
def test_memory_or_gpus_without_hardware(config_error, problem, name, value):
    error = config_error(f"models: {{m: {{cmd: 'run --port ${{PORT}}', {name}: {value}}}}}")
    assert problem(error, f"models.m.{name}") == (
        "is set, but there is no top-level `hardware:` section to place the model on — describe the GPUs "
        f"(hardware: {{gpus: [{{id: 0, memory: 24GiB}}]}}), or remove {name}"
    )


@pytest.mark.parametrize("key, cmd", [("cmd", "cmd: 'run --port ${PORT} --device ${GPUS}'"),
                                      ("cmdStop", "cmd: 'run --port ${PORT}', cmdStop: 'stop ${GPUS}'")])
def test_gpus_in_a_command_needs_hardware(config_error, problem, key, cmd):
    message = problem(config_error(f"models: {{m: {{{cmd}}}}}"), f"models.m.{key}")
    assert message.startswith("${GPUS} stands for the GPUs the model starts on, which need a top-level "
                              "`hardware:` section, and this config has none")
    assert message.endswith("or remove ${GPUS}")


def test_gpus_anywhere_but_a_command_is_an_error(config_error, problem):
    error = config_error(with_models("  m: {cmd: 'run --port ${PORT}', memory: 1GiB, description: 'on ${GPUS}'}\n"))
    assert problem(error, "models.m.description") == "${GPUS} is only filled in a model's cmd and cmdStop — remove it here"


@pytest.mark.parametrize(
    "hardware, key, expected",
    [
        ("hardware: {gpus: []}", "hardware.gpus", "is empty — list each GPU with its id and memory"),
        ("hardware: {cpu: {memory: 8GiB}}", "hardware.gpus", "missing — list each GPU with its id and memory"),
        ("hardware: {gpus: {id: 0}}", "hardware.gpus", "expected a list of GPUs, got a mapping"),
        ("hardware: [0]", "hardware", "expected a mapping of key: value"),
        ("hardware: {gpus: [0]}", "hardware.gpus[0]", "expected a mapping with id and memory, got the number 0"),
        ("hardware: {gpus: [{id: 0, memory: 8GiB}, {id: '0', memory: 8GiB}]}", "hardware.gpus[1].id",
         '"0" is also the id of hardware.gpus[0] — give each GPU its own id'),
        ("hardware: {gpus: [{memory: 8GiB}]}", "hardware.gpus[0].id", "missing — write the GPU's index or UUID"),
        ("hardware: {gpus: [{id: -1, memory: 8GiB}]}", "hardware.gpus[0].id", "-1 is negative"),
        ("hardware: {gpus: [{id: '0,1', memory: 8GiB}]}", "hardware.gpus[0].id", "has a comma or a space"),
        ("hardware: {gpus: [{id: true, memory: 8GiB}]}", "hardware.gpus[0].id", "expected text or a whole number"),
        ("hardware: {gpus: [{id: 0}]}", "hardware.gpus[0].memory", "missing — how much memory this GPU has"),
        ("hardware: {gpus: [{id: 0, memory: 0}]}", "hardware.gpus[0].memory", "0 is zero"),
        ("hardware: {gpus: [{id: 0, memory: 24GIGS}]}", "hardware.gpus[0].memory", 'unknown unit "GIGS"'),
        ("hardware: {gpus: [{id: 0, memory: 24GiB}], cpu: {}}", "hardware.cpu.memory", "missing"),
        ("hardware: {gpus: [{id: 0, memory: 24GiB}], cpu: {memory: lots}}", "hardware.cpu.memory", "is not a size"),
    ],
)
def test_hardware_mistakes(config_error, problem, hardware, key, expected):
    error = config_error(hardware + "\nmodels: {m: {cmd: 'run --port ${PORT}', memory: 8GiB}}\n")
    assert expected in problem(error, key)
    assert [p.key for p in error.problems] == [key], "a broken hardware section adds no problems to the models"


def test_every_problem_is_reported_at_once(config_error):
    error = config_error(with_models(
        "  a: {cmd: 'run --port ${PORT}'}\n  b: {cmd: 'run --port ${PORT}', memory: 99GiB}\n",
        hardware="hardware: {gpus: [{id: 0, memory: 24GiB}, {id: 1, memory: -3}, {id: 0, memory: 8GiB}]}\n",
    ))
    assert [p.key for p in error.problems] == [
        "hardware.gpus[1].memory", "hardware.gpus[2].id", "models.a.memory",
    ], "b is not judged against hardware that has problems; a still lacks memory"


def test_unknown_keys_under_hardware_are_warned_about(load):
    config = load(with_models("  m: {cmd: 'run --port ${PORT}', memory: 1GiB}\n", hardware=(
        "hardware: {gpus: [{id: 0, memory: 8GiB, memroy: 1}], cpus: {memory: 1GiB}}\n")))
    assert any("hardware.gpus[0].memroy: unknown key" in warning for warning in config.warnings)
    assert any("hardware.cpus: unknown key" in warning for warning in config.warnings)


def test_cuda_visible_devices_in_env_is_replaced_by_placement_and_says_so(load):
    config = load(with_models("  m: {cmd: 'run --port ${PORT}', memory: 1GiB, env: [CUDA_VISIBLE_DEVICES=1]}\n"))
    [warning] = config.warnings
    assert warning.startswith("config.yaml: models.m.env: CUDA_VISIBLE_DEVICES is set at each start")


def test_an_unset_variable_in_a_size_is_reported_once(config_error, monkeypatch):
    monkeypatch.delenv("GPU_MEMORY_FOR_TEST", raising=False)
    error = config_error(with_models(
        "  m: {cmd: 'run --port ${PORT}', memory: '${env.GPU_MEMORY_FOR_TEST}'}\n",
        hardware="hardware: {gpus: [{id: 0, memory: '${env.GPU_MEMORY_FOR_TEST}'}]}\n",
    ))
    assert [p.key for p in error.problems] == ["hardware.gpus[0].memory", "models.m.memory"]
    assert all("GPU_MEMORY_FOR_TEST" in p.message for p in error.problems)


def test_the_check_summary_shows_the_hardware_and_each_need(load):
    lines = load(with_models("""
      big: {cmd: 'run --port ${PORT}', memory: 14GiB, gpus: 2, pinned: true, minResidency: 60}
      cpu: {cmd: 'run --port ${PORT}', memory: 2GiB, gpus: 0}
      small: {cmd: 'run --port ${PORT}', memory: 1024}
    """)).describe().splitlines()
    assert "hardware: GPU 0 24576 MiB, GPU GPU-5b1e 15259 MiB; CPU 65536 MiB (memory alone decides what runs together)" in lines
    assert "  big  [memory: 14336 MiB on each of 2 GPUs; pinned; minResidency 60s]" in lines
    assert "  cpu  [memory: 2048 MiB of the CPU's]" in lines
    assert "  small  [memory: 1024 MiB on 1 GPU]" in lines


def test_the_summary_says_groups_constrain_too_when_given(load):
    text = load(with_models("  m: {cmd: 'run --port ${PORT}', memory: 1GiB}\n") + "groups: {g: {members: [m]}}\n").describe()
    assert "(memory and the router both decide what runs together)" in text
    assert "  m  [group: g; memory: 1024 MiB on 1 GPU]" in text.splitlines()


def test_pinned_models_that_cannot_all_be_loaded_at_once_are_warned_about(load):
    one_gpu = "hardware: {gpus: [{id: 0, memory: 24GiB}]}\n"
    config = load(with_models("""
  a: {cmd: 'run --port ${PORT}', memory: 16GiB, pinned: true}
  b: {cmd: 'run --port ${PORT}', memory: 12GiB, pinned: true}
  c: {cmd: 'run --port ${PORT}', memory: 4GiB}
""", hardware=one_gpu))
    assert [w for w in config.warnings if "cannot all be loaded at once" in w] == [
        "config.yaml: models: the pinned models a, b cannot all be loaded at once on the memory under hardware: — "
        "a pinned model is never stopped to make room, so those loaded first keep the others out (their requests wait for "
        "an operator's unload); unpin one, lower a memory: or describe more memory"], config.warnings


def test_pinned_models_that_fit_only_in_one_order_are_not_warned_about(load):
    # in the file's order the 10 GiB model would take the freest GPU (24 GiB), leaving none for the 20 GiB one
    config = load(with_models("""
  a: {cmd: 'run --port ${PORT}', memory: 10GiB, pinned: true}
  b: {cmd: 'run --port ${PORT}', memory: 20GiB, pinned: true}
""", hardware="hardware: {gpus: [{id: 0, memory: 24GiB}, {id: 1, memory: 12GiB}]}\n"))
    assert not [w for w in config.warnings if "cannot all be loaded" in w], config.warnings


def test_a_gpu_index_written_with_leading_zeros_is_that_gpu(config_error):
    error = config_error("hardware: {gpus: [{id: 0, memory: 24GiB}, {id: '00', memory: 24GiB}]}\n"
                         "models: {m: {cmd: 'run --port ${PORT}', memory: 1GiB}}\n")
    assert [(p.key, p.message.split(" —")[0]) for p in error.problems] == [
        ("hardware.gpus[1].id", '"0" is also the id of hardware.gpus[0]')]


def test_a_gpu_memory_over_a_tebibyte_is_warned_about_as_a_unit_mistaken(load):
    config = load(with_models("  m: {cmd: 'run --port ${PORT}', memory: 1GiB}\n",
                              hardware="hardware: {gpus: [{id: 0, memory: 25769803776}]}\n"))
    assert any("hardware.gpus[0].memory: 25769803776 MiB is over 1 TiB, more than any GPU has — a bare number is MiB"
               in warning for warning in config.warnings), config.warnings
