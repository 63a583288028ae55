"""The interface the runtime drives, whichever scheduler the config names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from .decision import ScoreTerms
from .effects import Effect
from .fifo import FifoScheduler
from .placement import Hardware, Room
from .serial import SerialScheduler
from .settings import SerialSettings
from .snapshot import SchedulerSnapshot
from .swap import SwapPolicy
from .ticket import ModelSpec, Ticket


class Scheduler(Protocol):
    """Every method takes the current monotonic time and returns what the runtime must do."""

    name: str

    def submit(self, ticket: Ticket, now: float) -> list[Effect]: ...
    def submit_all(self, tickets: Iterable[Ticket], now: float) -> list[Effect]: ...
    def cancel(self, ticket_id: int, now: float) -> list[Effect]: ...
    def cancel_all(self, ticket_ids: Iterable[int], now: float) -> list[Effect]: ...
    def finished(self, ticket_id: int, now: float) -> list[Effect]: ...
    def model_ready(self, model: str, now: float) -> list[Effect]: ...
    def model_failed(self, model: str, reason: str, now: float) -> list[Effect]: ...
    def model_stopped(self, model: str, now: float) -> list[Effect]: ...
    def unload(self, models: Iterable[str] | None, now: float) -> list[Effect]: ...
    def tick(self, now: float) -> list[Effect]: ...
    def next_deadline(self) -> float | None: ...
    def retune(self, settings: SerialSettings, now: float) -> list[Effect]: ...
    def reconfigure(
        self, models: Mapping[str, ModelSpec], policy: SwapPolicy, restart: Iterable[str], now: float,
        hardware: Hardware | None = None,
    ) -> list[Effect]: ...
    def reprioritize(self, ticket_id: int, priority: int, now: float) -> list[Effect]: ...
    def shutdown(self, now: float) -> list[Effect]: ...
    def snapshot(self, now: float) -> SchedulerSnapshot: ...
    def ranked(self, now: float) -> list[tuple[Ticket, ScoreTerms]]: ...
    def is_queued(self, ticket_id: int) -> bool:
        """Whether the request still waits in the queue (not dispatched, not ended)."""
    def held_back_because(self, ticket_id: int) -> str:
        """Why a waiting request was last passed over while the GPU had room ("" if it was not, or unknown); other
        models are mentions (`mentions`)."""
    def placement(self) -> dict | None:
        """Each GPU's memory and models, with hardware described (None without)."""
    def apply_leases(self, leases: Mapping[str, tuple[str, float]], now: float) -> list[Effect]:
        """The model leases in force (model -> (which, until)): kept loaded, never stopped to make room."""
    def room_for(self, model: str) -> Room | None:
        """How `model` would get its memory now, changing nothing (None: no hardware described)."""
    def never_fits(self, model: str) -> str | None:
        """Why `model` can never start however long it waits (None: it can, or no hardware described)."""
    def memory_measured(self, model: str, use: Mapping[str, int]) -> str | None:
        """What `model`'s processes use on each GPU now (MiB by GPU id, measured); a warning to log when it
        uses more than it declared, which placement counts from then on (None: nothing to say)."""


SCHEDULERS: dict[str, type[SerialScheduler] | type[FifoScheduler]] = {
    SerialScheduler.name: SerialScheduler,
    FifoScheduler.name: FifoScheduler,
}


def build_scheduler(
    name: str, models: Mapping[str, ModelSpec], policy: SwapPolicy, settings: SerialSettings,
    hardware: Hardware | None = None,
) -> Scheduler:
    """The scheduler `routing.scheduler.use` names (the serial one places models on described hardware)."""
    try:
        scheduler_class = SCHEDULERS[name]
    except KeyError:
        known = " or ".join(repr(n) for n in sorted(SCHEDULERS))
        raise ValueError(f"unknown scheduler {name!r} — use {known}") from None
    return scheduler_class(models, policy, settings, hardware)
