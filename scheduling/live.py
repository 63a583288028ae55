"""The running service as the admin's request threads see it.

Admin views run on worker threads while the scheduler lives on the event loop,
so everything here reads the scheduler through `runtime.from_thread`, which runs
the call on the loop, between two scheduling steps. In a process that does not
serve (`manage.py runserver`, a shell) there is no running service: the pages say
so, and the config file is read directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.service import current_service, load_configured
from scheduling.core import ScoreTerms, band_of


class ServiceUnavailable(Exception):
    """The page needs the running scheduler, and this process has none."""


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


def running_service():
    """The service of this process, or ServiceUnavailable with what to do instead."""
    service = current_service()
    if service is None:
        raise ServiceUnavailable(
            "the scheduler is not running in this process; open the admin of the `llamaswap serve` instance"
        )
    return service


def current_config():
    """The config in force: the running service's, else the file named by LLAMASWAP_CONFIG.

    Raises RuntimeError (no config named) or ConfigError (the file is unusable).
    """
    service = current_service()
    return service.config if service is not None else load_configured()


def waiting_now(service) -> list[WaitingEntry]:
    """The queue, best first, with each request's score terms and its wait so far."""
    runtime = service.runtime

    def read() -> list[WaitingEntry]:
        now = runtime.now()
        entries = []
        for ticket, terms in runtime.ranked():
            request = runtime.waiting_request(ticket.id)
            if request is None:  # its caller already left; it is no longer waiting
                continue
            entries.append(
                WaitingEntry(
                    position=len(entries) + 1,
                    ticket_id=ticket.id,
                    model=ticket.model,
                    requested_model=request.requested_model,
                    path=request.path,
                    client=request.client,
                    priority=ticket.priority,
                    terms=terms,
                    waited_s=max(0.0, now - ticket.arrival),
                )
            )
        return entries

    return runtime.from_thread(read)


def running_now(service) -> list[BusyModel]:
    """Each model serving requests now, with its busy slots and the requests on them (longest running first)."""
    runtime = service.runtime

    def entry(ticket_id: int, now: float) -> RunningEntry | None:
        granted = runtime.granted_request(ticket_id)
        if granted is not None:
            _, decision, since = granted
            return RunningEntry(ticket_id, decision.priority, decision.slot, max(0.0, now - since))
        request = runtime.waiting_request(ticket_id)  # its model is starting for it
        return None if request is None else RunningEntry(ticket_id, request.priority, None, None)

    def read() -> list[BusyModel]:
        now = runtime.now()
        _, snapshot = runtime.snapshot
        busy = []
        for model, tickets in sorted(snapshot.running.items()):
            entries = [found for ticket_id in tickets if (found := entry(ticket_id, now)) is not None]
            entries.sort(key=lambda e: -1.0 if e.running_s is None else -e.running_s)
            if entries:
                busy.append(BusyModel(model, snapshot.slots.get(model), tuple(entries)))
        return busy

    return runtime.from_thread(read)


def model_states(service) -> dict[str, str]:
    """Each configured model's process state: stopped, starting, ready or stopping."""
    fleet = service.fleet
    return service.runtime.from_thread(lambda: {model: fleet.state(model) for model in service.config.models})


def cancel_waiting(service, ticket_ids: list[int]) -> list[int]:
    """Fail the given queued requests with an operator-cancelled error; returns those that were still waiting."""
    runtime = service.runtime
    return runtime.from_thread(lambda: [tid for tid in ticket_ids if runtime.operator_cancel(tid)])


def reprioritize_waiting(service, ticket_ids: list[int], priority: int) -> list[int]:
    """Give queued requests a new priority (re-ranked at once); returns those that were still waiting."""
    runtime = service.runtime
    return runtime.from_thread(lambda: [tid for tid in ticket_ids if runtime.reprioritize(tid, priority)])


def unload_models(service, models: list[str]) -> None:
    """Stop these models now; requests they are serving are cut with a 503 saying so."""
    service.runtime.from_thread(service.runtime.unload, models)


def serial_settings_in_use(service):
    """The settings the running scheduler ranks with now (from its last published snapshot)."""
    _, snapshot = service.runtime.snapshot
    return snapshot.settings
