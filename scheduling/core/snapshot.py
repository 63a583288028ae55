"""A scheduler's state at one instant, for metrics and the admin pages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .priority import Band
from .settings import SerialSettings


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Immutable, so it can be published to other threads (the metrics collector) as is.

    `depth_by_band` and `oldest_wait_by_band` have all three bands (0 / 0.0 when
    empty) and count requests not yet dispatched. `running_tickets` are the
    granted, unfinished requests. `running` groups them by model, with the
    request whose model is starting counted on it; `slots` is the job slots of
    every configured model (serial; empty under fifo, which has no slots).
    """

    depth_by_band: Mapping[Band, int]
    oldest_wait_by_band: Mapping[Band, float]
    running_tickets: tuple[int, ...]
    loaded: tuple[str, ...]
    starting: tuple[str, ...]
    waiting: int
    settings: SerialSettings
    running: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    slots: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def running_ticket(self) -> int | None:
        """The request holding the GPU (serial), or the earliest granted one (fifo)."""
        return self.running_tickets[0] if self.running_tickets else None
