"""Tunables of the serial scheduler and the rules that keep them safe.

The same checks serve the config loader and the admin form, so each message
stands alone and says what to write instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

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


def _slots_problem(value: object, model_ids: Iterable[str] | None) -> str | None:
    """`slots` maps model ids to whole numbers ≥ 1; ids are checked only when `model_ids` is given."""
    if not isinstance(value, Mapping):
        return f"{_shown(value)} is not a mapping — use model id: number of parallel slots, e.g. {{chat: 4}}"
    known = None if model_ids is None else set(model_ids)
    for model, count in value.items():
        if not isinstance(model, str):
            return f"{_shown(model)} is not a model id — use model id: number of parallel slots"
        if known is not None and model not in known:
            return f"{model!r} is not a configured model — use a model id or alias from `models`"
        allowed = f"use a whole number ≥ 1 (the server's parallel slots, e.g. llama-server -np 4)"
        if not _is_number(count) or not math.isfinite(count) or count != int(count):
            return f"{model}: {_shown(count)} is not a whole number — {allowed}"
        if count < 1:
            return f"{model}: {_shown(count)} is below 1 — {allowed}"
    return None


def serial_settings_problems(
    aging_divisor: object,
    swap_affinity_bonus: object,
    slots: object = None,
    model_ids: Iterable[str] | None = None,
) -> dict[str, str]:
    """Problems keyed by the llama-swap setting name; an empty dict means the values are usable.
    `slots` (None: not set) is checked against `model_ids` when those are given."""
    problems = {}
    aging = _aging_divisor_problem(aging_divisor)
    if aging is not None:
        problems["agingDivisor"] = aging
    bonus = _swap_affinity_bonus_problem(swap_affinity_bonus)
    if bonus is not None:
        problems["swapAffinityBonus"] = bonus
    if slots is not None:
        slots_problem = _slots_problem(slots, model_ids)
        if slots_problem is not None:
            problems["slots"] = slots_problem
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

    def get(self, model: str, default: int | None = None) -> int | None:  # the Mapping mixin's is slow
        return self._table.get(model, default)

    def __len__(self) -> int:
        return len(self._table)

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __repr__(self) -> str:
        return f"SlotTable({self._table!r})"


@dataclass(frozen=True)
class SerialSettings:
    """`routing.scheduler.settings.serial`: seconds of waiting per priority point, the no-swap
    bonus, and how many requests each model's server takes at once (1 unless listed)."""

    aging_divisor: float = 60.0
    swap_affinity_bonus: int = 10
    slots: Mapping[str, int] = field(default_factory=SlotTable)

    def __post_init__(self) -> None:
        problems = serial_settings_problems(self.aging_divisor, self.swap_affinity_bonus, self.slots)
        if problems:
            details = "; ".join(f"{key}: {message}" for key, message in problems.items())
            raise ValueError(f"invalid serial scheduler settings: {details}")
        if not isinstance(self.slots, SlotTable):
            object.__setattr__(self, "slots", SlotTable({m: int(n) for m, n in self.slots.items()}))

    def slots_for(self, model: str) -> int:
        """Jobs `model` may run at once."""
        return self.slots.get(model, 1)
