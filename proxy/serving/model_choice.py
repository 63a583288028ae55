"""Which name a model request goes on with: the active profile's pin first, then a selector's pick.

What comes out is resolved as if the client had asked for it (a model ID, an alias or a peer model),
and is the `model` the upstream receives unless the model sets useModelName. The selector that
picked it is recorded in the request's row.

Spillover counts the requests each selector sent to each target and that have not finished yet, in
this process: with several front ends, each fills the targets on its own.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

from proxy.serving.active_profile import active_profile
from proxy.serving.errors import ProxyError
from proxy.serving.inbound import ModelRequest
from proxy.serving.upstream_names import leading_names
from scheduling.door.questions import Processes
from scheduling.core import ModelState

# (selector ID, target as written) -> requests picked through the selector and not finished yet.
_reserved: Counter[tuple[str, str]] = Counter()
_turns = itertools.count()  # breaks ties between equally busy spillover targets in turn


@dataclass
class ModelChoice:
    """The name to serve (`model`), and the selector that chose it ("" when none did)."""

    model: str
    selector: str = ""
    rewritten: bool = False  # the name differs from the one the client sent
    _reservation: tuple[str, str] | None = None

    @property
    def body_model(self) -> str:
        """The `model` to send upstream in place of the client's ("" to leave the body as sent)."""
        return self.model if self.rewritten else ""

    def applied_to(self, request: ModelRequest) -> ModelRequest:
        """The request as if the client had asked for the chosen name."""
        return dataclasses.replace(request, requested_model=self.model) if self.rewritten else request

    def release(self) -> None:
        """The request has ended: its spillover reservation, if any, is free again. Idempotent."""
        if self._reservation is not None:
            _reserved[self._reservation] -= 1
            if _reserved[self._reservation] <= 0:
                del _reserved[self._reservation]
            self._reservation = None


async def choose_model(service, requested: str) -> ModelChoice:
    """Apply the active profile's pin, then a selector; raises ProxyError 404 for a disabled pin and
    503 when a selector has no target it can use."""
    config = service.config
    name = requested
    profile = await active_profile(config)
    if profile:
        pins = config.profiles[profile].pins
        if requested in pins:
            name = pins[requested] or _disabled(requested, profile)
    selector = config.selectors.get(name)
    if selector is None:
        return ModelChoice(name, rewritten=name != requested)
    if selector.strategy == "pin":
        return ModelChoice(selector.targets[0], selector.id, True)
    states = await service.door.ask(Processes())
    if selector.strategy == "warm":
        return ModelChoice(_warm(config, selector, states), selector.id, True)
    target = _spillover(config, selector, states)
    _reserved[(selector.id, target)] += 1
    return ModelChoice(target, selector.id, True, (selector.id, target))


async def pinned_upstream_path(service, rest: str) -> str:
    """`<model>/<path>` of an /upstream request with the active profile's pin applied to the model (the
    longest pinned run of segments, as model IDs may hold '/'). Selectors are not chosen on /upstream."""
    profile = await active_profile(service.config)
    if not profile:
        return rest
    pins = service.config.profiles[profile].pins
    for pinned, after in leading_names(rest, max(map(len, pins), default=0)):
        if pinned in pins:
            target = pins[pinned] or _disabled(pinned, profile)
            return target if after is None else f"{target}/{after}"
    return rest


def _disabled(requested: str, profile: str) -> NoReturn:
    raise ProxyError(
        404, f"model '{requested}' is disabled while profile '{profile}' is active; "
        "PUT /api/profiles/active to switch profiles", "model_not_found",
    )


def _state(config, target: str, states: dict[str, str]) -> str | None:
    """A local target's process state; None for a peer model."""
    model = config.resolve(target)
    return None if model is None else states.get(model.id, ModelState.STOPPED)


def _warm(config, selector, states: dict[str, str]) -> str:
    """The first target that is ready, else the first starting, else the first (which then starts)."""
    for wanted in (ModelState.READY, ModelState.STARTING):
        for target in selector.targets:
            if _state(config, target, states) == wanted:
                return target
    return selector.targets[0]


def _spillover(config, selector, states: dict[str, str]) -> str:
    """As llama-swap: the least busy of the targets in use while it holds fewer than
    `settings.spillover` of this selector's requests; else the first target not in use (it starts);
    when every target is in use and full, the least busy. A local target that is stopping is skipped."""
    in_use, idle = [], []
    for target in selector.targets:
        state = _state(config, target, states)
        held = _reserved[(selector.id, target)]
        if state == ModelState.STOPPING:
            continue
        if held or state in (ModelState.READY, ModelState.STARTING):
            in_use.append(target)
        else:
            idle.append(target)
    if not in_use and not idle:
        raise ProxyError(
            503, f"selector '{selector.id}' has no target it can use now: every target is stopping; retry shortly",
            "selector_unavailable",
        )
    if in_use:
        fewest = min(_reserved[(selector.id, target)] for target in in_use)
        if fewest < selector.spillover or not idle:
            tied = [target for target in in_use if _reserved[(selector.id, target)] == fewest]
            return tied[next(_turns) % len(tied)]
    return idle[0]


def models_led_to(config, name: str) -> tuple[str, ...]:
    """The model IDs (a peer's as `<peer>/<model>`) a request for `name` may reach: each of a selector's targets, an
    alias's model, else `name` itself. A key is shown a name only where it may use them all."""
    selector = config.selectors.get(name)
    return tuple(map(partial(_model_id, config), selector.targets if selector else (name,)))


def _model_id(config, name: str) -> str:
    if (model := config.resolve(name)) is not None:
        return model.id
    found = config.peer_model(name)
    return name if found is None else f"{found[0].id}/{found[1]}"


def listed_choices(config, profile: str, states: dict[str, str], created: int, listed: set[str], *,
                   unlisted: bool = False) -> list[dict]:
    """`/v1/models` entries for the selectors (the unlisted ones too with `unlisted`) and the active profile's pins
    (a disabled pin, or one whose ID is listed already, adds nothing). `listed`: the IDs already there."""
    entries = []

    def entry(model_id: str, kind: str, targets: tuple[str, ...], name="", description="", metadata=()) -> dict:
        loaded = any(_state(config, target, states) not in (None, ModelState.STOPPED) for target in targets)
        return {
            "id": model_id, "object": "model", "created": created, "owned_by": "llamaswap", "name": name,
            "description": description, "status": {"value": "loaded" if loaded else "unloaded"},
            "meta": {"llamaswap": {"type": kind, "targets": list(targets), **dict(metadata)}},
        }

    for selector in config.selectors.values():
        if (unlisted or not selector.unlisted) and selector.id not in listed:
            entries.append(entry(selector.id, "selector", selector.targets, selector.name, selector.description,
                                 selector.metadata))
    pins = config.profiles[profile].pins if profile else {}
    for pinned, target in pins.items():
        if target and pinned not in listed and pinned not in config.selectors:
            selector = config.selectors.get(target)
            entries.append(entry(pinned, "profile", selector.targets if selector else (target,)))
    return entries
