"""The mutation script still applies its mutants to the current modules; the coexist property
machine catches the three mutants it was once blind to (a start standing in a reserved swap's way,
a call that must grant twice, a start waiting for stops whose victims get work); and the observer
flags a priority inversion in three calls that once passed every check."""

import subprocess
import sys

from .mutants import MUTANTS, ROOT, mutated_source

COEXIST = "tests/core/test_serial_coexist_properties.py"


def mutants_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.core.mutants", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_every_mutant_still_applies_to_its_module():
    for mutant in MUTANTS:
        assert mutated_source(mutant) != (ROOT / mutant.module).read_text()


def test_the_coexist_property_machine_catches_its_former_blind_spots():
    run = mutants_script("drop-may-start-beside", "walk-ends-after-first-grant", "ignore-promised-start-reservation",
                         "--tests", f"{COEXIST}::test_serial_scheduler_on_shared_hardware")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 of 3 mutants caught" in run.stdout


def test_the_observer_flags_a_lower_scoring_request_taking_a_reserved_model_in_the_call_that_queued_it():
    case = f"{COEXIST}::test_a_lower_scoring_request_does_not_take_a_model_a_waiting_swap_reserved"
    run = mutants_script("--run-one", "swap-reserves-nothing", "--", "-q", "-p", "no:cacheprovider", case)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "#3 took a, which better-scoring #2 reserved for its swap" in run.stdout
