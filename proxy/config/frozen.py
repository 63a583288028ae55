"""Read-only containers for values that come from YAML and end up in JSON.

A loaded config is shared by every request, so nothing may mutate it. Values
such as `metadata` and `filters.setParams` are sent to clients and upstreams as
JSON, so they are frozen into a dict subclass (which `json.dumps` accepts) and
tuples rather than into `MappingProxyType`.
"""

from __future__ import annotations

from typing import Any


class FrozenDict(dict):
    """A dict that refuses every change after construction."""

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("config values are read-only; copy them with thaw() before changing them")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenDict:
        return self

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


def freeze(value: Any) -> Any:
    """Deep read-only copy: dicts become FrozenDict, lists become tuples."""
    if isinstance(value, dict):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """Deep mutable copy of a frozen value, shaped like parsed JSON (dicts and lists)."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value
