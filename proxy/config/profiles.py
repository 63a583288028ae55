"""`profiles:` — named sets of model ID replacements ("pins"), one of which an operator may switch on.

While a profile is active, a request for a pinned ID goes to the pin's target (a model, an alias,
a peer model or a selector) before anything else resolves the name; an empty pin makes the ID
answer 404. Which profile is active is runtime state (proxy/serving/active_profile.py), not config.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .errors import kind_of
from .fields import MISSING, Section
from .model_index import ModelIndex


@dataclass(frozen=True)
class ProfileConfig:
    name: str
    description: str
    pins: Mapping[str, str]  # requested ID -> target; "" disables the ID while the profile is active


def read_profiles(
    top: Section,
    index: ModelIndex,
    *,
    selector_ids: Collection[str],
    peer_model: Callable[[str], bool] = lambda name: False,
) -> dict[str, ProfileConfig]:
    """Every entry under `profiles:`; pin targets must name something a request could reach."""
    section = top.section("profiles")
    if section is None:
        return {}
    profiles: dict[str, ProfileConfig] = {}
    for raw_name in list(section.data):
        key = section.path(str(raw_name))
        if not isinstance(raw_name, str) or not raw_name.strip():
            section.raw(raw_name)
            top.log.error(key, f'a profile name must be non-empty text, got {kind_of(raw_name)} — quote it: "{raw_name}":')
            continue
        entry = section.section(raw_name)
        if entry is None:
            if section.data.get(raw_name) is None:
                top.log.error(key, 'empty — give the profile its pins, e.g. pins: {"llm-code": model-a}')
            continue
        description = entry.text("description")
        pins = _read_pins(entry, index, selector_ids, peer_model)
        entry.warn_unread()
        profiles[raw_name] = ProfileConfig(raw_name, description, MappingProxyType(pins))
    return profiles


def _read_pins(entry: Section, index: ModelIndex, selector_ids: Collection[str], peer_model) -> dict[str, str]:
    raw = entry.expanded("pins", typed=False)
    if raw is MISSING or raw is None:
        return {}
    if not isinstance(raw, dict):
        entry.error("pins", f'expected a mapping of model ID: target, got {kind_of(raw)} — e.g. pins: {{"llm-code": model-a}}')
        return {}
    pins: dict[str, str] = {}
    for pinned, target in raw.items():
        key = f"{entry.path('pins')}.{pinned}"
        if not isinstance(pinned, str) or not pinned.strip():
            entry.log.error(key, f'a pinned ID must be non-empty text, got {kind_of(pinned)} — quote it: "{pinned}":')
            continue
        if target is None or target == "":
            pins[pinned] = ""  # disabled while the profile is active
            continue
        if not isinstance(target, str):
            entry.log.error(key, f'expected a model ID, alias, peer model or selector, got {kind_of(target)} — quote it: "{target}"')
            continue
        if index.resolve(target) is None and target not in selector_ids and not peer_model(target):
            entry.log.error(
                key,
                index.unknown(target).replace("no model or alias", "no model, alias, peer model or selector", 1)
                + ", or ~ to disable the ID while the profile is active",
            )
            continue
        pins[pinned] = target
    return pins
