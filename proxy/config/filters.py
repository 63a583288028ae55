"""Per-model rewriting of JSON request bodies (`filters.stripParams` / `setParams` / `setParamsByID`).

Operators use filters to enforce sampling settings server-side. The `model`
field is protected: it decides routing, so a filter may never remove or
replace it (`useModelName` is the way to rename it upstream).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .frozen import FrozenDict, thaw

PROTECTED_PARAMS = frozenset({"model"})


@dataclass(frozen=True)
class ModelFilters:
    strip_params: tuple[str, ...] = ()
    set_params: Mapping[str, Any] = field(default_factory=FrozenDict)
    # Requested name (the model's ID or one of its aliases) -> params set after set_params: one model
    # served under several names, each with its own settings (`model:high`), without a reload.
    set_params_by_id: Mapping[str, Mapping[str, Any]] = field(default_factory=FrozenDict)

    @property
    def is_empty(self) -> bool:
        return not self.strip_params and not self.set_params and not self.set_params_by_id

    def apply(self, body: dict, requested: str | None = None) -> dict:
        """A new body: stripped keys removed, then set keys written, then those set for the name the
        client `requested`; `model` untouched."""
        result = {
            key: value
            for key, value in body.items()
            if key in PROTECTED_PARAMS or key not in self.strip_params
        }
        by_id = self.set_params_by_id.get(requested, {}) if requested is not None else {}
        for params in (self.set_params, by_id):
            for key, value in params.items():
                if key not in PROTECTED_PARAMS:
                    result[key] = thaw(value)
        return result


def parse_strip_params(text: str) -> tuple[list[str], list[str]]:
    """Split the comma-separated list; returns (params, protected ones that were dropped)."""
    names = [name.strip() for name in text.split(",")]
    kept = [name for name in dict.fromkeys(names) if name and name not in PROTECTED_PARAMS]
    dropped = [name for name in dict.fromkeys(names) if name in PROTECTED_PARAMS]
    return kept, dropped
