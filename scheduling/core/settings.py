"""Tunables of the serial scheduler and the rules that keep them safe.

The same checks serve the config loader and the admin form, so each message
stands alone and says what to write instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from .fairness import fairness_problem
from .priority import BAND_SPACING

MAX_SWAP_AFFINITY_BONUS = BAND_SPACING - 1


def _shown(value: object) -> str:
    """A value as an operator typed it: numbers bare, anything else quoted."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """Every int is finite; math.isfinite would overflow on one beyond a float's range."""
    return not isinstance(value, float) or math.isfinite(value)


# Seconds per priority point beyond which aging is nil anyway; larger values would overflow the queue's
# keys (priority × divisor) to infinity for large priorities.
MAX_AGING_DIVISOR = 1e9
MIN_AGING_DIVISOR = 0.001  # a point a millisecond; below it (denormals) a wait's score becomes infinite


def _aging_divisor_problem(value: object) -> str | None:
    allowed = "use seconds per priority point, e.g. 60, or 0 to disable aging"
    if not _is_number(value):
        return f"{_shown(value)} is not a number — {allowed}"
    if not _is_finite(value):
        return f"{_shown(value)} is not a finite number — {allowed}"
    if value < 0:
        return f"{_shown(value)} is negative — use 0 to disable aging, or seconds per priority point"
    if 0 < value < MIN_AGING_DIVISOR:
        return (
            f"{_shown(value)} is below {MIN_AGING_DIVISOR:g} seconds per point (aging would swamp every priority at "
            f"once, and scores stop being numbers) — use {MIN_AGING_DIVISOR:g} or more, or 0 to disable aging"
        )
    if value > MAX_AGING_DIVISOR:
        return (
            f"{_shown(value)} is above {MAX_AGING_DIVISOR:.0e} seconds per point (31 years: no aging at all, and beyond "
            "it scores stop being numbers) — use 0 to disable aging"
        )
    return None


def _swap_affinity_bonus_problem(value: object) -> str | None:
    allowed = f"use a whole number from 0 to {MAX_SWAP_AFFINITY_BONUS} (0 disables it)"
    if not _is_number(value):
        return f"{_shown(value)} is not a number — {allowed}"
    if not _is_finite(value) or value != int(value):
        return f"{_shown(value)} is not a whole number — {allowed}"
    if not 0 <= value <= MAX_SWAP_AFFINITY_BONUS:
        return (
            f"{_shown(value)} is outside 0..{MAX_SWAP_AFFINITY_BONUS} — "
            f"it must stay below the band spacing of {BAND_SPACING}"
        )
    return None


def kind_of(value: object) -> str:
    """What the user wrote, in words, for "expected X, got Y" messages."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the bool {'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f'the string "{value}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


# Job slots of one model: llama-server's -np is a few dozen at most; beyond this a count is a typo, and
# a count past 64 bits could not even be sent to a worker.
MAX_SLOTS = 1024


def slots_example(model: str) -> str:
    """The fix a slots message suggests; shared so the config file and the admin word it alike."""
    return f"{model}: 4 (and start its server with as many slots, e.g. llama-server -np 4)"


def slot_count_problem(model: str, count: object) -> str | None:
    """What is wrong with `count` as the job slots of `model`, worded as the config file words it
    (a whole number written 2.0 is refused there too), or None."""
    if isinstance(count, bool) or not isinstance(count, int):
        return f"expected a whole number, got {kind_of(count)} — e.g. {slots_example(model)}"
    if count < 1:
        return f"{count} is below the minimum of 1 — e.g. {slots_example(model)}"
    if count > MAX_SLOTS:
        return f"{count} is above the maximum of {MAX_SLOTS} — e.g. {slots_example(model)}"
    return None


def _slots_problem(value: object) -> str | None:
    """`slots` maps model ids to whole numbers ≥ 1; which ids are models is the caller's to check."""
    if not isinstance(value, Mapping):
        return f"{_shown(value)} is not a mapping — use model id: number of parallel slots, e.g. {{chat: 4}}"
    for model, count in value.items():
        if not isinstance(model, str):
            return f"{_shown(model)} is not a model id — use model id: number of parallel slots"
        problem = slot_count_problem(model, count)
        if problem is not None:
            return f"{model}: {problem}"
    return None


def serial_settings_problems(
    aging_divisor: object,
    swap_affinity_bonus: object,
    slots: object = None,
    fairness: object = "off",
) -> dict[str, str]:
    """Problems keyed by the llama-swap setting name; an empty dict means the values are usable.
    `slots` (None: not set) is checked only for its counts."""
    problems = {}
    aging = _aging_divisor_problem(aging_divisor)
    if aging is not None:
        problems["agingDivisor"] = aging
    bonus = _swap_affinity_bonus_problem(swap_affinity_bonus)
    if bonus is not None:
        problems["swapAffinityBonus"] = bonus
    if slots is not None:
        slots_problem = _slots_problem(slots)
        if slots_problem is not None:
            problems["slots"] = slots_problem
    fair = fairness_problem(fairness)
    if fair is not None:
        problems["fairness"] = fair
    return problems


class SlotTable(Mapping[str, int]):
    """Read-only model id → job slots, hashable so settings stay a frozen value."""

    __slots__ = ("_pairs", "_table")

    def __init__(self, slots: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = slots.items() if isinstance(slots, Mapping) else slots
        self._pairs = tuple(sorted(pairs))
        self._table = dict(self._pairs)

    def __getitem__(self, model: str) -> int:
        return self._table[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def count(self, model: str) -> int:
        """Job slots of `model`: 1 unless listed (the scheduler asks this for every request it weighs)."""
        return self._table.get(model, 1)

    def __len__(self) -> int:
        return len(self._table)

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"SlotTable({self._table!r})"


@dataclass(frozen=True)
class SerialSettings:
    """`routing.scheduler.settings.serial`: seconds of waiting per priority point, the no-swap
    bonus, how many requests each model's server takes at once (1 unless listed), and whether API
    keys take turns among equal requests (`keys`) or those go in arrival order (`off`)."""

    aging_divisor: float = 60.0
    swap_affinity_bonus: int = 10
    slots: Mapping[str, int] = field(default_factory=SlotTable)
    fairness: str = "off"

    def __post_init__(self) -> None:
        problems = serial_settings_problems(self.aging_divisor, self.swap_affinity_bonus, self.slots, self.fairness)
        if problems:
            details = "; ".join(f"{key}: {message}" for key, message in problems.items())
            raise ValueError(f"invalid serial scheduler settings: {details}")
        if not isinstance(self.slots, SlotTable):
            object.__setattr__(self, "slots", SlotTable({m: int(n) for m, n in self.slots.items()}))

    def slots_for(self, model: str) -> int:
        """Jobs `model` may run at once."""
        return self.slots.count(model)
