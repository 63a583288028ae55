"""A scheduler's state at one instant, for metrics and the admin pages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .priority import Band
from .settings import SerialSettings


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Immutable, so it can be published to other threads (the metrics collector) as is.

    `depth_by_band` and `oldest_wait_by_band` have all three bands (0 / 0.0 when
    empty) and count requests not yet dispatched. `running_tickets` are the
    granted, unfinished requests (at most one under the serial scheduler).
    """

    depth_by_band: Mapping[Band, int]
    oldest_wait_by_band: Mapping[Band, float]
    running_tickets: tuple[int, ...]
    loaded: tuple[str, ...]
    starting: tuple[str, ...]
    waiting: int
    settings: SerialSettings

    @property
    def running_ticket(self) -> int | None:
        """The request holding the GPU (serial), or the earliest granted one (fifo)."""
        return self.running_tickets[0] if self.running_tickets else None
