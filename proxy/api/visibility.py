"""What a key is shown of the service's state and traffic, whatever route shows it.

An operator key — a config file's apiKey, any caller of an open server — sees everything. Any other key sees
the state of the models its globs allow (every model without `--models`: `KeyScope.sees_model`) and, of the
requests, its own only (`KeyScope.owner_filter`): another key's requests — their ids, paths, clients, rows —
are not shown to it, on its models or not, so one tenant never reads another's traffic. The texts about its own
requests — why one waits, what its start stopped, why it was refused, whose turn fair share gave it — name no model
outside its scope and no other key (`told_in`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from scheduling.keys.scope import KeyScope
from scheduling.models import Batch, QueuedRequest

_Item = TypeVar("_Item")
# A sample's `model` or `key` label in the Prometheus text format, its value still escaped.
_SCOPED_LABEL = re.compile(rb'[{,](model|key)="((?:[^"\\]|\\.)*)"')
_ESCAPED = re.compile(r"\\(.)")
# The fields of the JSON of a request (`activity_row`, llama-swap's activity), a queue entry or a lease that hold
# texts about it, which may mention other models.
_TEXTS = ("explanation", "waited_because", "error", "error_msg", "outlook", "why", "blocked_by", "last_error")


async def own_entries(scope: KeyScope, entries: Sequence[_Item]) -> list[_Item]:
    """The scheduler's queue entries (`QueueEntry`) of the key's own requests; one lookup of their rows. A request
    whose row is not written yet is left out until it is."""
    return await _owned(scope, entries, lambda entry: entry.ticket_id, QueuedRequest)


def own_rows(scope: KeyScope, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Request rows as JSON (`activity_row`) of the key's own requests."""
    owner = scope.owner_filter()
    return list(rows) if owner is None else [row for row in rows if row["api_key"] == owner]


async def own_batches(scope: KeyScope, shown: Sequence[_Item]) -> list[_Item]:
    """Batches' progress (`BatchProgress`) of the key's own batches."""
    return await _owned(scope, shown, lambda batch: batch.id, Batch)


async def _owned(scope: KeyScope, items: Sequence[_Item], id_of: Callable[[_Item], Any], table) -> list[_Item]:
    """The `items` whose row in `table` (by id) was made under the key's name: one query."""
    owner = scope.owner_filter()
    if owner is None or not items:
        return list(items)
    mine = await sync_to_async(_owned_ids)(table, owner, [id_of(item) for item in items])
    return [item for item in items if id_of(item) in mine]


def _owned_ids(table, owner: str, ids: list) -> set:
    return set(table.objects.filter(id__in=ids, api_key=owner).values_list("id", flat=True))


def told_in(scope: KeyScope, item: dict[str, Any]) -> dict[str, Any]:
    """A request's, queue entry's or lease's JSON with its texts (why it waited, what its start stopped, why it was
    refused, what it waits on, whose turn fair share gave it) as the key is told them (`KeyScope.told`): a model
    outside its scope is "another model", its lease id and eviction cost left out, another key "another key"."""
    return {**item, **{field: _told(scope, item[field]) for field in _TEXTS if field in item}}


def told_page(scope: KeyScope, page: dict[str, Any]) -> dict[str, Any]:
    """A page of request rows (`/api/activity`'s, llama-swap's activity) with each row's texts as the key is told them."""
    return {**page, "data": [told_in(scope, row) for row in page["data"]]}


def _told(scope: KeyScope, value: Any) -> Any:
    if isinstance(value, str):
        return scope.told(value)
    return [scope.told(text) for text in value] if isinstance(value, list) else value


def shown_models(scope: KeyScope, models: Sequence[str]) -> list[str]:
    return [model for model in models if scope.sees_model(model)]


def shown_boxes(scope: KeyScope, boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`/api/placement`'s boxes with only the key's models named; each GPU's memory figures stay whole (what is
    free is every tenant's business)."""
    if scope.operator:
        return boxes
    return [{**box,
             "gpus": [{**gpu, "models": shown_models(scope, gpu["models"])} for gpu in box["gpus"]],
             "cpu": {**box["cpu"], "models": shown_models(scope, box["cpu"]["models"])},
             "models": {model: facts for model, facts in box["models"].items() if scope.sees_model(model)}}
            for box in boxes]


def shown_series(scope: KeyScope, exposition: bytes) -> bytes:
    """A `/metrics` scrape (the text format) with only the samples the key may see: a sample labelled with a model
    outside its scope, or with another key, is left out; the rest (bands, evictions, batches: the service's
    aggregates) stay."""
    if scope.operator:
        return exposition
    return b"\n".join(line for line in exposition.split(b"\n") if line.startswith(b"#") or all(
        _label_shown(scope, name, value) for name, value in _SCOPED_LABEL.findall(line)))


def _label_shown(scope: KeyScope, name: bytes, value: bytes) -> bool:
    text = _ESCAPED.sub(lambda found: "\n" if found[1] == "n" else found[1], value.decode("utf-8", "replace"))
    return scope.sees_model(text) if name == b"model" else text == scope.name
