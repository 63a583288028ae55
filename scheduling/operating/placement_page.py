"""The Models page's placement: each box's GPUs (and CPU, when `hardware.cpu` counts it) with their memory, and
each model holding memory there with its GPUs, declared need, protection, lease and eviction cost — the runtime's
`Placement` answer (as `/api/placement` shows it) beside the lease rows, which say until when a lease holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from scheduling.door.frontdoor import Unanswered
from scheduling.door.questions import Placement
from scheduling.models import ModelLease


@dataclass(frozen=True)
class Memory:
    """One GPU's (or the CPU's) line: its capacity, what its models declared, what was measured on it (None: the
    answer carries no measure) and those models."""

    name: str
    capacity: str
    declared: str
    measured: str | None
    models: tuple[str, ...]


@dataclass(frozen=True)
class LeaseShown:
    id: int
    expires_at: datetime
    url: str


@dataclass(frozen=True)
class Placed:
    """A model holding memory: on `gpus` (empty: on the CPU)."""

    model: str
    gpus: tuple[str, ...]
    declared: str
    measured: str | None  # its highest use on one of its GPUs (None: the answer carries no measure)
    busy: bool
    protected: str
    lease: LeaseShown | None
    eviction_cost: float
    load_s: float


@dataclass(frozen=True)
class Box:
    """One worker's hardware (the one box in one process), `name` its host."""

    number: int
    name: str
    memory: tuple[Memory, ...]
    models: tuple[Placed, ...]


def size(mib: int) -> str:
    """MiB as an operator reads them: whole MiB below 1 GiB, GiB with a decimal above."""
    return f"{mib} MiB" if abs(mib) < 1024 else f"{mib / 1024:.1f} GiB"


def _measured(figures: Mapping) -> str | None:
    measured = figures.get("measured_mib")
    return None if measured is None else size(measured)


def _memory(name: str, figures: Mapping) -> Memory:
    return Memory(name, size(figures["memory_mib"]), size(figures["declared_mib"]), _measured(figures),
                  tuple(figures["models"]))


def boxes(answer: Iterable[Mapping], leases: Iterable, lease_list_url: str) -> list[Box]:
    """The page's boxes from the `Placement` answer (one mapping per box) and the lease rows in force: a model's
    longest lease is the one shown, as the scheduler keeps the longest."""
    longest: dict[str, object] = {}
    for lease in leases:
        if lease.model not in longest or lease.expires_at > longest[lease.model].expires_at:
            longest[lease.model] = lease
    shown = []
    for number, box in enumerate(answer, 1):
        memory = [_memory(f"GPU {gpu['id']}" + (" (retiring)" if gpu.get("retiring") else ""), gpu) for gpu in box["gpus"]]
        if box["cpu"]["memory_mib"] is not None:
            memory.append(_memory("CPU", box["cpu"]))
        models = []
        for model, placed in box["models"].items():
            lease = longest.get(model)
            models.append(Placed(
                model, tuple(placed["gpus"]), size(placed["declared_mib"]), _measured(placed), placed["busy"],
                placed["protected"] or "",
                None if lease is None else LeaseShown(
                    lease.pk, lease.expires_at, f"{lease_list_url}?{urlencode({'id__exact': lease.pk})}"),
                placed["eviction_cost"], placed["load_s"],
            ))
        shown.append(Box(number, box["box"], tuple(memory), tuple(models)))
    return shown


def section(door, unanswered: str, no_answer: str) -> dict:
    """The page's placement context, with `hardware:` described (nothing without it). `unanswered`: why the
    scheduler did not answer the page's first question (then it is not asked this one either)."""
    if door.config.hardware is None:
        return {}
    missing = unanswered
    if not missing:
        try:
            answer = door.ask_now(Placement())
        except Unanswered as exc:
            missing = str(exc) or no_answer
    if missing:
        return {"placed_by_memory": True, "boxes": [], "placement_missing": missing}
    placed = {model for box in answer for model in box["models"]}
    leases = ModelLease.objects.filter(model__in=placed, expires_at__gt=timezone.now())
    return {
        "placed_by_memory": True,
        "boxes": boxes(answer, leases, reverse("admin:scheduling_modellease_changelist")),
        "placement_missing": "" if answer else "No scheduler worker answered: none runs, or none was heard from lately.",
    }
