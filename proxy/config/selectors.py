"""`selectors:` — virtual model IDs that stand for one of several targets, chosen per request.

`pin` always takes the first target, `warm` the first one already loaded (then one starting, then
the first), `spillover` fills each target up to `settings.spillover` requests before the next.
The choice itself is made at request time (proxy/serving/model_choice.py); here the file is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduling.core.matrix import MatrixPolicy
from scheduling.core.swap import SwapGroup, SwapPolicy

from .errors import kind_of
from .fields import Section
from .frozen import FrozenDict
from .model import _read_metadata
from .model_index import ModelIndex

STRATEGIES = ("pin", "warm", "spillover")
DEFAULT_SPILLOVER = 1


@dataclass(frozen=True)
class SelectorConfig:
    id: str
    strategy: str
    targets: tuple[str, ...]  # as written: a model ID, an alias or a peer model
    name: str = ""
    description: str = ""
    unlisted: bool = False
    metadata: Mapping[str, Any] = field(default_factory=FrozenDict)
    spillover: int = DEFAULT_SPILLOVER  # settings.spillover: requests per target before the next one


def coexistence_check(groups: Sequence[SwapGroup], matrix: MatrixPolicy | None, model_ids: Collection[str]
                      ) -> Callable[[Sequence[str]], bool]:
    """Whether the router lets all of some local models run at once: none of them, started while the
    others run, would stop one of the others."""
    policy = matrix if matrix is not None else SwapPolicy(groups, model_ids)

    def together(models: Sequence[str]) -> bool:
        return all(not policy.evictions(model, [m for m in models if m != model]) for model in models)

    return together


def read_selectors(
    top: Section,
    index: ModelIndex,
    *,
    together: Callable[[Sequence[str]], bool],
    peer_model: Callable[[str], bool] = lambda name: False,
    peer_ids: Collection[str] = (),
) -> dict[str, SelectorConfig]:
    """Every entry under `selectors:`. `peer_model` tells whether a name reaches a peer's model."""
    section = top.section("selectors")
    if section is None:
        return {}
    selectors: dict[str, SelectorConfig] = {}
    for raw_id in list(section.data):
        selector_id = str(raw_id)
        key = section.path(selector_id)
        if not isinstance(raw_id, str) or not raw_id.strip():
            section.raw(raw_id)
            top.log.error(key, f'a selector ID must be non-empty text, got {kind_of(raw_id)} — quote it: "{raw_id}":')
            continue
        clash = _id_clash(raw_id, index, peer_model, peer_ids)
        entry = section.section(raw_id)
        if clash:
            top.log.error(key, f'"{raw_id}" is already {clash} — a selector needs an ID of its own: rename it')
        if entry is None:
            if section.data.get(raw_id) is None:
                top.log.error(key, "empty — give the selector a strategy and its targets, e.g. {strategy: warm, targets: [model-a, model-b]}")
            continue
        selector = _read_selector(raw_id, entry, index, together, peer_model, section.data)
        if selector is not None and not clash:
            selectors[raw_id] = selector
    return selectors


def _id_clash(selector_id: str, index: ModelIndex, peer_model: Callable[[str], bool], peer_ids: Collection[str]) -> str:
    real = index.resolve(selector_id)
    if real == selector_id:
        return "a model ID"
    if real is not None:
        return f"an alias of model {real}"
    if selector_id in peer_ids:
        return "a peer's ID"
    if peer_model(selector_id):
        return "the name of a peer's model"
    return ""


def _read_selector(selector_id: str, entry: Section, index: ModelIndex, together, peer_model, all_selectors: Mapping
                   ) -> SelectorConfig | None:
    strategy = entry.text("strategy", "")
    ok = True
    if not entry.has("strategy"):
        entry.error("strategy", f"missing — choose one of: {', '.join(STRATEGIES)}")
        ok = False
    elif strategy not in STRATEGIES:
        entry.error("strategy", f'unknown strategy "{strategy}" — valid strategies are: {", ".join(STRATEGIES)}')
        ok = False
    targets = entry.text_list("targets", example="model-a, model-b")
    if not targets:
        entry.error("targets", "missing or empty — list at least one model ID, alias or peer model, e.g. targets: [model-a, model-b]")
        ok = False
    local: list[str] = []
    for position, target in enumerate(targets):
        key = f"{entry.path('targets')}[{position}]"
        real = index.resolve(target)
        if real is not None:
            local.append(real)
        elif target in all_selectors:
            entry.log.error(key, f'"{target}" is a selector — a selector cannot target another selector; name its models instead')
            ok = False
        elif not peer_model(target):
            entry.log.error(key, index.unknown(target).replace("no model or alias", "no model, alias or peer model", 1))
            ok = False
        if targets.index(target) != position:
            entry.log.error(key, f'"{target}" is listed twice — remove one')
            ok = False
    spillover = DEFAULT_SPILLOVER
    settings = entry.section("settings")
    if settings is not None:
        spillover = settings.integer("spillover", DEFAULT_SPILLOVER, minimum=1, example="1")
        settings.warn_unread()
    distinct = list(dict.fromkeys(local))
    if ok and strategy == "spillover" and len(distinct) > 1 and not together(distinct):
        entry.error(
            "targets",
            f"spillover runs its targets side by side, but the router does not let {', '.join(distinct)} "
            "run together — put them in one group with swap: false (routing.router.settings.groups), "
            "or in one matrix set, or use strategy: warm",
        )
        ok = False
    selector = SelectorConfig(
        id=selector_id,
        strategy=strategy,
        targets=targets,
        name=entry.text("name"),
        description=entry.text("description"),
        unlisted=entry.boolean("unlisted", False),
        metadata=_read_metadata(entry),
        spillover=spillover,
    )
    entry.warn_unread()
    return selector if ok else None
