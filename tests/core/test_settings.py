"""Validation of agingDivisor and swapAffinityBonus, shared by the config loader and the admin."""

import math

import pytest

from scheduling.core import (
    MAX_SWAP_AFFINITY_BONUS,
    Grant,
    ModelSpec,
    SerialScheduler,
    SerialSettings,
    SwapPolicy,
    Ticket,
    serial_settings_problems,
)


def test_defaults_are_one_point_per_minute_and_a_bonus_of_ten():
    assert SerialSettings() == SerialSettings(aging_divisor=60.0, swap_affinity_bonus=10)
    assert serial_settings_problems(60, 10) == {}


@pytest.mark.parametrize(
    ("divisor", "bonus"), [(0, 0), (0.5, 99), (60, 0), (3600.0, 50), (1e9, 1), (60, 3.0)]
)
def test_valid_values_have_no_problems(divisor, bonus):
    assert serial_settings_problems(divisor, bonus) == {}
    SerialSettings(divisor, bonus)


def test_bonus_must_stay_below_the_band_spacing():
    assert MAX_SWAP_AFFINITY_BONUS == 99
    assert serial_settings_problems(60, 150) == {
        "swapAffinityBonus": "150 is outside 0..99 — it must stay below the band spacing of 100"
    }
    assert "outside 0..99" in serial_settings_problems(60, 100)["swapAffinityBonus"]
    assert "outside 0..99" in serial_settings_problems(60, -1)["swapAffinityBonus"]


def test_negative_divisor_explains_how_to_disable_aging():
    assert serial_settings_problems(-1, 10) == {
        "agingDivisor": "-1 is negative — use 0 to disable aging, or seconds per priority point"
    }


def test_a_divisor_so_large_that_scores_would_overflow_is_refused():
    assert serial_settings_problems(1e9, 10) == {}
    problem = serial_settings_problems(1e308, 10)["agingDivisor"]
    assert problem.startswith("1e+308 is above 1e+09 seconds per point") and "use 0 to disable aging" in problem
    assert "agingDivisor" in serial_settings_problems(10**400, 10)


def test_a_divisor_so_small_that_a_wait_scores_infinity_is_refused_and_zero_still_means_no_aging():
    assert serial_settings_problems(0.001, 10) == {} and serial_settings_problems(0, 10) == {}
    problem = serial_settings_problems(1e-320, 10)["agingDivisor"]
    assert problem.startswith("1e-320 is below 0.001 seconds per point") and "or 0 to disable aging" in problem


def test_the_largest_divisor_with_the_most_extreme_priorities_still_ranks_them():
    models = {"m": ModelSpec("m")}
    scheduler = SerialScheduler(models, SwapPolicy([], ("m",)), SerialSettings(aging_divisor=1e9))
    scheduler.submit(Ticket(1, "m", 0, 0.0), 0.0)
    scheduler.model_ready("m", 1.0)
    for ticket_id, priority in ((2, -(2**63)), (3, 2**63 - 1), (4, 0)):
        scheduler.submit(Ticket(ticket_id, "m", priority, 2.0), 2.0)
    order = []
    for finishing in (1, 3, 4):
        order += [e.ticket_id for e in scheduler.finished(finishing, 3.0) if isinstance(e, Grant)]
    assert order == [3, 4, 2]


@pytest.mark.parametrize("value", [True, False, "60", None, [60], math.nan, math.inf, -math.inf])
def test_divisor_must_be_a_finite_number(value):
    problems = serial_settings_problems(value, 10)
    assert set(problems) == {"agingDivisor"}
    assert "agingDivisor" not in problems["agingDivisor"]  # messages stand alone, no key path


@pytest.mark.parametrize("value", [2.5, True, "10", None, math.nan, math.inf])
def test_bonus_must_be_a_whole_number(value):
    problems = serial_settings_problems(60, value)
    assert set(problems) == {"swapAffinityBonus"}


def test_non_integer_bonus_message():
    assert serial_settings_problems(60, 2.5) == {
        "swapAffinityBonus": "2.5 is not a whole number — use a whole number from 0 to 99 (0 disables it)"
    }


def test_both_problems_are_reported_together():
    assert set(serial_settings_problems("x", 500)) == {"agingDivisor", "swapAffinityBonus"}


def test_settings_refuse_invalid_values_with_the_same_messages():
    with pytest.raises(ValueError, match=r"swapAffinityBonus: 150 is outside 0\.\.99"):
        SerialSettings(aging_divisor=60, swap_affinity_bonus=150)
    with pytest.raises(ValueError, match="agingDivisor: -5 is negative"):
        SerialSettings(aging_divisor=-5)
