"""The scheduler's front door: the one interface through which request consumers, the admin and
/metrics reach the scheduler, whichever process runs it.

The class that serves it is a setting, `LLAMASWAP_SCHEDULER_FRONT_DOOR` (a dotted path), the way
Django picks a session engine: the default, `scheduling.in_process.InProcessFrontDoor`, calls the
scheduler runtime on this process's event loop. The serving process builds its front door with
the service and installs it here; a process that serves nothing (a shell, `manage.py runserver`
for the admin) has none, and the pages that need the scheduler say so.

The request path is asynchronous and runs on the event loop; the operator side is synchronous and
safe from any thread, because Django's admin views run on worker threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from scheduling.core import SchedulerSnapshot, ScoreTerms, SerialSettings, band_of
from scheduling.queue_view import QueueEntry
from scheduling.runtime import Lease, Outcome, TicketRequest

@dataclass(frozen=True)
class WaitingEntry:
    """One request waiting for the GPU, as the scheduler ranks it right now."""

    position: int
    ticket_id: int
    model: str
    requested_model: str
    path: str
    client: str
    priority: int
    terms: ScoreTerms
    waited_s: float

    @property
    def band(self) -> str:
        return band_of(self.priority).value

    @property
    def score(self) -> float:
        return self.terms.total


@dataclass(frozen=True)
class RunningEntry:
    """A request on one of a model's job slots; `running_s` is None while its model is still starting."""

    ticket_id: int
    priority: int
    slot: int | None
    running_s: float | None

    @property
    def band(self) -> str:
        return band_of(self.priority).value


@dataclass(frozen=True)
class BusyModel:
    """A model with requests on its slots; `slots` is None under fifo, which has no slots."""

    model: str
    slots: int | None
    requests: tuple[RunningEntry, ...]

    @property
    def busy(self) -> int:
        return len(self.requests)


class FrontDoor(Protocol):
    """What the rest of the service may ask of the scheduler."""

    config: Any  # the config the scheduler runs with
    # Whether the scheduler runs in this process: the class is then built with (runtime, fleet,
    # config), else with (config, channel layer).
    runs_scheduler: bool

    # -- the request path, on the event loop -----------------------------------------------------
    async def submit(self, request: TicketRequest, queued: Callable[[Any], None] | None = None) -> Lease:
        """Queue a request and wait for the GPU; raises `Rejected`, or CancelledError if the caller
        leaves (the request is then cancelled). `queued` is given a handle for `progress` once the
        request is queued."""

    async def progress(self, handle: Any) -> QueueEntry | None:
        """Where a request this front door queued stands now (None: no longer waiting or running)."""

    async def queue(self) -> list[QueueEntry]:
        """Every waiting and running request: queued ones in predicted order, with their predicted waits."""

    async def queue_entry(self, ticket_id: int) -> QueueEntry | None:
        """One waiting or running request, by ticket id (None: not waiting or running)."""

    async def cancel_request(self, ticket_id: int) -> bool:
        """An operator ends a waiting or running request, its client told why; returns whether it was there."""

    def release(self, ticket_id: int, outcome: Outcome) -> None:
        """The granted request ended. Idempotent, so it is safe in `finally`."""

    async def begin_relayed(self, request: TicketRequest, peer: str, explanation: str) -> int | None:
        """A request served without the scheduler (relayed to a peer) begins now: its row and ticket id,
        or None when no row can be written (a front end that reaches no worker)."""

    def end_relayed(self, ticket_id: int | None, request: TicketRequest, outcome: Outcome, seconds: float,
                    first_byte_s: float | None) -> None:
        """A relayed request ended `seconds` after it began: its row and metrics. Idempotent."""

    async def unload(self, models: list[str] | None) -> None:
        """Stop these models (None: all), cutting the requests they serve; returns once stopped."""

    async def processes(self) -> dict[str, str]:
        """Each model's process state (stopped, starting, ready, stopping), including a model a
        reload removed that is still stopping."""

    async def logs(self) -> str:
        """What the model processes wrote, model by model."""

    # -- operators, from any thread --------------------------------------------------------------
    def snapshot(self) -> SchedulerSnapshot:
        """The scheduler's latest published state."""

    def waiting(self) -> list[WaitingEntry]:
        """The queue, best first, with each request's score terms and its wait so far."""

    def running(self) -> list[BusyModel]:
        """Each model serving requests now, with its busy slots (longest running first)."""

    def model_states(self) -> dict[str, str]:
        """Each configured model's process state: stopped, starting, ready or stopping."""

    def cancel_waiting(self, ticket_ids: list[int]) -> list[int]:
        """Fail these queued requests as cancelled by an operator; returns those still waiting."""

    def reprioritize_waiting(self, ticket_ids: list[int], priority: int) -> list[int]:
        """Re-rank these queued requests; returns those still waiting."""

    def unload_now(self, models: list[str]) -> None:
        """Stop these models now, without waiting for their processes to be gone."""

    def retune(self, settings: SerialSettings) -> None:
        """Rank with these settings from the next pick."""


class ConfigUnavailable(Exception):
    """No config can be shown: none is named, or the file is unusable (the message says which)."""


class NotServing(Exception):
    """A page needs the running scheduler, and this process has none."""


_installed: FrontDoor | None = None
_config_loader: Callable[[], Any] | None = None


def front_door_class() -> type:
    """The front-door class the settings name."""
    return import_string(settings.LLAMASWAP_SCHEDULER_FRONT_DOOR)


def install(door: FrontDoor | None) -> None:
    """Make `door` this process's front door (None: this process no longer serves)."""
    global _installed
    _installed = door


def installed() -> FrontDoor | None:
    """This process's front door, if it serves; safe from any thread."""
    return _installed


def required() -> FrontDoor:
    """This process's front door, or NotServing with what to do instead."""
    if _installed is None:
        raise NotServing(
            "the scheduler is not running in this process; open the admin of the `llamaswap serve` instance"
        )
    return _installed


def set_config_loader(loader: Callable[[], Any]) -> None:
    """How to read the config file in a process that does not serve; raises ConfigUnavailable."""
    global _config_loader
    _config_loader = loader


def current_config():
    """The config in force: the front door's, else the configured file's. Raises ConfigUnavailable."""
    if _installed is not None:
        return _installed.config
    if _config_loader is None:
        raise ConfigUnavailable("no config loader is registered in this process")
    return _config_loader()
