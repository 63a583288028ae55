"""The queue as a caller sees it: each request's place, its predicted wait, and why, in words; and as the
scheduler ranks it (`WaitingEntry`), with the requests on each model's slots (`BusyModel`).

Built on the event loop from the runtime and its forecast; the same entries feed `/api/queue`,
`/api/events` and the loading state streamed to a waiting chat client, so they never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduling.core import ScoreTerms, band_of
from scheduling.core.forecast import Blocker, Outlook
from scheduling.core.mentions import named


@dataclass(frozen=True)
class QueueEntry:
    """One request not yet finished. `state`: waiting (queued), starting (its model loads for it) or
    running. `position` (1 = next) counts the queued requests in their predicted dispatch order;
    `eta_s` is the predicted time until it is sent to its model (0 once it is; None when it cannot be
    predicted, `outlook` then says why). `outlook` names other models as mentions (`scheduling.core.mentions`):
    whoever shows it tells it to its reader."""

    ticket_id: int
    model: str
    requested_model: str
    path: str
    client: str
    priority: int
    band: str
    state: str
    position: int | None
    score: float | None
    terms: ScoreTerms | None
    waited_s: float
    running_s: float | None
    eta_s: float | None
    outlook: str

    def as_json(self) -> dict[str, Any]:
        """The entry as `/api/queue` and `/api/events` give it."""
        terms = self.terms
        return {
            "id": self.ticket_id,
            "model": self.model,
            "requested_model": self.requested_model,
            "path": self.path,
            "client": self.client,
            "priority": self.priority,
            "band": self.band,
            "state": self.state,
            "position": self.position,
            "score": self.score,
            "terms": None if terms is None else {"priority": terms.priority, "affinity": terms.affinity,
                                                 "aging": terms.aging},
            "waited_seconds": round(self.waited_s, 3),
            "running_seconds": None if self.running_s is None else round(self.running_s, 3),
            "eta_seconds": None if self.eta_s is None else round(self.eta_s, 3),
            "outlook": self.outlook,
        }


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


def queue_entries(runtime) -> list[QueueEntry]:
    """Every waiting and running request of `runtime`: queued ones by position, then those whose model
    is starting, then running ones longest first."""
    now = runtime.now()
    outlooks = runtime.forecast()
    terms = {ticket.id: t for ticket, t in runtime.ranked()}
    running = runtime.running_requests()
    jobs = [(request.model, band_of(decision.priority).value, now - since) for _, (request, decision, since) in running]
    entries = []
    for ticket_id, outlook in outlooks.items():
        request = runtime.waiting_request(ticket_id)
        if request is None:
            continue
        arrival = runtime.arrival_of(ticket_id)
        state = "waiting" if outlook.position is not None else "starting"
        entries.append(QueueEntry(
            ticket_id, request.model, request.requested_model, request.path, request.client, request.priority,
            band_of(request.priority).value, state, outlook.position,
            terms[ticket_id].total if ticket_id in terms else None, terms.get(ticket_id),
            max(0.0, now - arrival), None, outlook.eta_s, describe(outlook, request.model, jobs),
        ))
    for ticket_id, (request, decision, since) in running:
        entries.append(QueueEntry(
            ticket_id, request.model, request.requested_model, request.path, request.client, decision.priority,
            band_of(decision.priority).value, "running", None, decision.score, decision.terms,
            decision.queue_wait_s, max(0.0, now - since), 0.0,
            f"running on {request.model}" + (f", slot {decision.slot}" if decision.slot else ""),
        ))
    order = {"waiting": 0, "starting": 1, "running": 2}
    entries.sort(key=lambda e: (order[e.state], e.position or 0, -(e.running_s or 0.0)))
    return entries


def describe(outlook: Outlook, model: str, jobs: list[tuple[str, str, float]] = ()) -> str:
    """What a waiting caller is told, e.g. "#2 in the queue, 1 ahead; ~46 s: a batch job on chat ends
    in ~40 s, then loading coder takes ~6 s". `jobs` (model, band, running seconds) are what runs now:
    without a prediction, the caller is still told what it is behind."""
    if outlook.position is None:
        place = f"loading {model}"
    else:
        ahead = outlook.position - 1
        place = f"#{outlook.position} in the queue, {ahead} ahead" if ahead else "next in the queue"
    if outlook.eta_s is None:
        behind = sorted(jobs, key=lambda job: (job[0] != model, -job[2]))
        running = f"; behind a {behind[0][1]} job on {named(behind[0][0])}, running for {seconds_in_words(behind[0][2])}" if behind else ""
        return f"{place}{running}; no prediction: {outlook.unknown}"
    if outlook.position is None:
        return f"{place}, ~{seconds_in_words(outlook.eta_s)} left"
    parts = []
    if outlook.after is not None:
        parts.append(_blocker(outlook.after))
    if outlook.load_s:
        parts.append(f"loading {model} takes ~{seconds_in_words(outlook.load_s)}")
    reason = f": {', then '.join(parts)}" if parts else ""
    return f"{place}; ~{seconds_in_words(outlook.eta_s)}{reason}"


def _blocker(blocker: Blocker) -> str:
    when = f"~{seconds_in_words(blocker.in_s)}"
    if blocker.kind == "job":
        if blocker.expected:
            return f"{blocker.band} requests expected meanwhile run until {when}"
        return f"a {blocker.band} job on {named(blocker.model)} ends in {when}"
    if blocker.kind == "load":
        return f"{named(blocker.model)} is loaded in {when}"
    return f"{named(blocker.model)} stops in {when}"


def seconds_in_words(seconds: float) -> str:
    """A wait as people say it: whole seconds under a minute, minutes under an hour, then hours."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
