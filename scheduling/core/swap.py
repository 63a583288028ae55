"""Which running models must stop before another one starts (llama-swap's group router).

A pure function of the target and the running set, so every scheduler can ask
it at decision time without consulting process state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_GROUP = "(default)"


@dataclass(frozen=True)
class SwapGroup:
    """`groups.<name>`: swap = one member at a time; exclusive = loading a member evicts other
    groups; persistent = other groups never evict this one."""

    name: str
    members: tuple[str, ...]
    swap: bool = True
    exclusive: bool = True
    persistent: bool = False


class SwapPolicy:
    """The eviction rules of a set of groups; models in no group share the implicit "(default)"
    group, so with no groups at all only one model runs at a time."""

    def __init__(self, groups: Iterable[SwapGroup], model_ids: Iterable[str]) -> None:
        known = set(model_ids)
        self._groups: dict[str, SwapGroup] = {}
        self._group_of: dict[str, str] = {}
        for group in groups:
            if group.name in self._groups:
                raise ValueError(f"swap group {group.name!r} is defined twice — give each group a unique name")
            if group.name == DEFAULT_GROUP:
                raise ValueError(
                    f"swap group name {DEFAULT_GROUP!r} is reserved for models in no group — rename the group"
                )
            self._groups[group.name] = group
            for member in group.members:
                if member not in known:
                    raise ValueError(
                        f"swap group {group.name!r} lists unknown model {member!r} — "
                        "members must be configured model ids"
                    )
                previous = self._group_of.setdefault(member, group.name)
                if previous != group.name:
                    raise ValueError(
                        f"model {member!r} is in swap groups {previous!r} and {group.name!r} — "
                        "a model may belong to at most one group"
                    )
        ungrouped = tuple(sorted(known - self._group_of.keys()))
        if ungrouped:
            self._groups[DEFAULT_GROUP] = SwapGroup(DEFAULT_GROUP, ungrouped)
            self._group_of.update((model, DEFAULT_GROUP) for model in ungrouped)

    def group_of(self, model: str) -> str:
        """Name of the group `model` belongs to."""
        try:
            return self._group_of[model]
        except KeyError:
            raise KeyError(f"model {model!r} is not configured, so it has no swap group") from None

    def group(self, name: str) -> SwapGroup:
        return self._groups[name]

    def evictions(self, target: str, running: Iterable[str]) -> frozenset[str]:
        """Models of `running` that must stop before `target` starts.

        A swapping group evicts its other members; an exclusive group evicts every
        non-persistent model of other groups. As in llama-swap, starting a member of
        a non-exclusive group leaves running exclusive groups alone.
        """
        group = self._groups[self.group_of(target)]
        evict = set()
        for model in running:
            if model == target:
                continue
            other = self._groups[self.group_of(model)]
            if other is group:
                if group.swap:
                    evict.add(model)
            elif group.exclusive and not other.persistent:
                evict.add(model)
        return frozenset(evict)
