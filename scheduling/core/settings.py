"""Tunables of the serial scheduler and the rules that keep them safe.

The same checks serve the config loader and the admin form, so each message
stands alone and says what to write instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .priority import BAND_SPACING

MAX_SWAP_AFFINITY_BONUS = BAND_SPACING - 1


def _shown(value: object) -> str:
    """A value as an operator typed it: numbers bare, anything else quoted."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _aging_divisor_problem(value: object) -> str | None:
    allowed = "use seconds per priority point, e.g. 60, or 0 to disable aging"
    if not _is_number(value):
        return f"{_shown(value)} is not a number — {allowed}"
    if not math.isfinite(value):
        return f"{_shown(value)} is not a finite number — {allowed}"
    if value < 0:
        return f"{_shown(value)} is negative — use 0 to disable aging, or seconds per priority point"
    return None


def _swap_affinity_bonus_problem(value: object) -> str | None:
    allowed = f"use a whole number from 0 to {MAX_SWAP_AFFINITY_BONUS} (0 disables it)"
    if not _is_number(value):
        return f"{_shown(value)} is not a number — {allowed}"
    if not math.isfinite(value) or value != int(value):
        return f"{_shown(value)} is not a whole number — {allowed}"
    if not 0 <= value <= MAX_SWAP_AFFINITY_BONUS:
        return (
            f"{_shown(value)} is outside 0..{MAX_SWAP_AFFINITY_BONUS} — "
            f"it must stay below the band spacing of {BAND_SPACING}"
        )
    return None


def serial_settings_problems(aging_divisor: object, swap_affinity_bonus: object) -> dict[str, str]:
    """Problems keyed by the llama-swap setting name; an empty dict means the values are usable."""
    problems = {}
    aging = _aging_divisor_problem(aging_divisor)
    if aging is not None:
        problems["agingDivisor"] = aging
    bonus = _swap_affinity_bonus_problem(swap_affinity_bonus)
    if bonus is not None:
        problems["swapAffinityBonus"] = bonus
    return problems


@dataclass(frozen=True)
class SerialSettings:
    """`routing.scheduler.settings.serial`: seconds of waiting per priority point, and the no-swap bonus."""

    aging_divisor: float = 60.0
    swap_affinity_bonus: int = 10

    def __post_init__(self) -> None:
        problems = serial_settings_problems(self.aging_divisor, self.swap_affinity_bonus)
        if problems:
            details = "; ".join(f"{key}: {message}" for key, message in problems.items())
            raise ValueError(f"invalid serial scheduler settings: {details}")
