"""What may be asked of the scheduler and its models: each question a frozen dataclass, answered by one
function against the runtime and the model fleet (`ANSWERS`).

A front door answers `ask(question)` with that function: in one process on the event loop; in
distributed mode the dataclass crosses the wire (`scheduling.door.wire`) and each worker asked calls the
same function. Each worker serves a part of the models, so a question also says which workers answer
it (`workers`) and how their answers are put together (`merge`). Commands that change things (cancel,
re-rank, unload, retune, a relayed request's row) are asked the same way.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from scheduling.core import Band, ModelState, SchedulerSnapshot, SerialSettings
from scheduling.core.durations import JobKind
from scheduling.door.queue_entries import BusyModel, QueueEntry, RunningEntry, WaitingEntry, queue_entries
from scheduling.tickets import Outcome, Refused, TicketRequest


class Reach(Protocol):
    """The live workers a distributed front end can ask, as its directory knows them now."""

    def live(self) -> list[str]:
        """Every live worker's channel."""

    def serving(self, models: list[str]) -> list[str]:
        """The live workers that serve any of `models`."""

    def holding(self, handle: str) -> list[str]:
        """The worker a request this front end queued (its key) was sent to; none once it is not waiting."""


class Question:
    """Asked of every live worker unless a question says otherwise."""

    def workers(self, reach: Reach) -> list[str]:
        return reach.live()

    def put_to(self, channel: str) -> Question:
        """This question as the worker on `channel` is asked it."""
        return self

    def merge(self, answers: dict[str, Any]) -> Any:
        """One answer from the workers' (by channel, in the order they were asked)."""
        raise NotImplementedError(f"{type(self).__name__} is asked of one worker only")


class Listed(Question):
    """Answered with a list: the workers' lists one after the other."""

    def merge(self, answers: dict[str, Any]) -> list:
        return [item for answer in answers.values() for item in answer]


class FirstFound(Question):
    """Answered with one thing or None: the one worker that has it says."""

    def merge(self, answers: dict[str, Any]) -> Any:
        return next((answer for answer in answers.values() if answer is not None), None)


@dataclass(frozen=True)
class LogText:
    """New text of one model's log and the cursor to ask from next; `log` is the model it belongs to."""

    log: str
    text: str
    cursor: str


@dataclass(frozen=True)
class ProcessEntry:
    """A model process that is not stopped, with the config entry it was started with (None: unknown)."""

    model: str
    state: str
    cmd: tuple[str, ...] | None = None
    proxy: str = ""
    ttl: float | None = None
    name: str = ""
    description: str = ""


# -- the questions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot(Question):
    """The scheduler's latest published state (SchedulerSnapshot)."""

    def merge(self, answers: dict[str, Any]) -> SchedulerSnapshot:
        return merged_snapshot(list(answers.values()))


@dataclass(frozen=True)
class Waiting(Listed):
    """The queue, best first, with each request's score terms and its wait so far (WaitingEntry)."""


@dataclass(frozen=True)
class BusyModels(Listed):
    """Each model serving requests now, with its busy slots, longest running first (BusyModel)."""


@dataclass(frozen=True)
class Queue(Listed):
    """Every waiting and running request: queued ones in predicted order, with their predicted waits
    (QueueEntry). A worker's requests compete only with each other, so each worker has its positions."""


@dataclass(frozen=True)
class Progress(FirstFound):
    """Where one waiting or running request stands (None: no longer waiting or running), by its ticket id, or by
    the handle `submit`'s `queued` was given: the ticket id in one process, the front end's key in distributed
    mode (asked of the worker it was sent to alone)."""

    handle: int | str

    def workers(self, reach: Reach) -> list[str]:
        return reach.holding(self.handle) if isinstance(self.handle, str) else reach.live()


@dataclass(frozen=True)
class RunTime(FirstFound):
    """How long `jobs` jobs of `kind` are expected to take, `parallel` at a time, at the pace its model's
    jobs ran lately (None: none has finished yet): what is left of a batch."""

    kind: JobKind
    jobs: int
    parallel: int

    def workers(self, reach: Reach) -> list[str]:
        return reach.serving([self.kind.model])


@dataclass(frozen=True)
class Processes(Question):
    """Each model's process state (stopped, starting, ready, stopping), a model a reload removed that
    is still stopping included."""

    def merge(self, answers: dict[str, Any]) -> dict[str, str]:
        return {model: state for states in answers.values() for model, state in states.items()}


@dataclass(frozen=True)
class RunningProcesses(Listed):
    """The model processes not stopped, each with the entry it was started with (ProcessEntry): a model
    a reload removed keeps its entry until it has stopped."""


@dataclass(frozen=True)
class Logs(Question):
    """What the model processes wrote, model by model."""

    def merge(self, answers: dict[str, Any]) -> str:
        return "".join(answers.values())


@dataclass(frozen=True)
class LogsSince(Question):
    """Each log's text after the cursor held for it (none: all the text kept), by log name, as LogText
    (`model`: that log only). A client streams the logs by asking again and again. Across workers a log
    is named "<worker channel> <log>": two workers each have a log of their own service."""

    cursors: dict[str, str]
    model: str | None = None

    def workers(self, reach: Reach) -> list[str]:
        return reach.live() if self.model is None else reach.serving([self.model])

    def put_to(self, channel: str) -> LogsSince:
        prefix = channel + " "
        return LogsSince({name[len(prefix):]: c for name, c in self.cursors.items() if name.startswith(prefix)}, self.model)

    def merge(self, answers: dict[str, Any]) -> dict[str, LogText]:
        return {f"{channel} {name}": text for channel, answer in answers.items() for name, text in answer.items()}


@dataclass(frozen=True)
class Cancel(Listed):
    """An operator fails these waiting requests as cancelled, and with `running` cuts those running too, each
    client told why; answers those that were there to cancel."""

    ticket_ids: tuple[int, ...]
    running: bool = False


@dataclass(frozen=True)
class RefuseKey(Listed):
    """Refuse every queued request of the API key `key` with 401 `invalid_api_key` saying `why` (the key stopped
    counting: revoked, expired, deleted); answers those that were still waiting. Running ones go on."""

    key: str
    why: str


@dataclass(frozen=True)
class Reprioritize(Listed):
    """Re-rank these queued requests; answers those still waiting."""

    ticket_ids: tuple[int, ...]
    priority: int


@dataclass(frozen=True)
class Unload(Question):
    """Stop these models (None: all), cutting the requests they serve; with `wait`, answered once their
    processes are gone, else at once."""

    models: tuple[str, ...] | None = None
    wait: bool = True

    def workers(self, reach: Reach) -> list[str]:
        return reach.live() if self.models is None else reach.serving(list(self.models))

    def merge(self, answers: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class KeepLeases(Question):
    """Hand the scheduler the model leases in force now; answers their states by lease id (`ModelLeases.states`)."""

    def merge(self, answers: dict[str, Any]) -> dict[int, dict]:
        return {lease_id: state for answer in answers.values() for lease_id, state in answer.items()}


@dataclass(frozen=True)
class Retune(Question):
    """Rank with these settings from the next pick."""

    settings: SerialSettings

    def merge(self, answers: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class BeginRelayed(Question):
    """A request served without the scheduler (relayed to a peer) began at `started_at` (Unix time, the
    front end's clock): its row; answers its ticket id."""

    request: TicketRequest
    peer: str
    started_at: float
    explanation: str


@dataclass(frozen=True)
class Placement(Listed):
    """Each worker's hardware: its host (`box`), its GPUs' memory, what the models on them declared, and those
    models."""


@dataclass(frozen=True)
class CanLoad(FirstFound):
    """Whether `model` fits now, what its start would stop, and which pinned or leased models block it;
    asked of the worker that serves it. Changes nothing."""

    model: str

    def workers(self, reach: Reach) -> list[str]:
        return reach.serving([self.model])


@dataclass(frozen=True)
class NeverFits(CanLoad):
    """Asked as `CanLoad`: why `model` can never be loaded however long it waits, or None (`never_fits`)."""


@dataclass(frozen=True)
class StillGranted(Question):
    """Whether this worker still holds the grant it sent for the request a front end knows as `key`. Asked
    of that worker alone, by a front end that was cut off from Redis for long enough to be taken for dead
    (the worker then let its requests go) before it uses a grant it reads afterwards."""

    key: str


@dataclass(frozen=True)
class EndRelayed(Question):
    """A relayed request ended `seconds` after it began: its row and metrics."""

    ticket_id: int
    outcome: Outcome
    seconds: float
    first_byte_s: float | None


# -- the answers ----------------------------------------------------------------------------------

ANSWERS: dict[type[Question], Callable[[Any, Any, Any], Any]] = {}


def answers(question: type[Question]):
    """Register the one function that answers `question`, called with (question, runtime, fleet)."""

    def register(function):
        if question in ANSWERS:
            raise ValueError(f"{question.__name__} already has an answer")
        ANSWERS[question] = function
        return function

    return register


def answer(question: Question, runtime, fleet) -> Any:
    """The answer to `question`, on the runtime's event loop; an awaitable where the answer takes time."""
    function = ANSWERS.get(type(question))
    if function is None:
        raise LookupError(f"nothing answers {type(question).__name__!r}")
    return function(question, runtime, fleet)


@answers(Snapshot)
def _snapshot(question: Snapshot, runtime, fleet) -> SchedulerSnapshot:
    return runtime.snapshot[1]


@answers(Waiting)
def _waiting(question: Waiting, runtime, fleet) -> list[WaitingEntry]:
    now = runtime.now()
    entries = []
    for ticket, terms in runtime.ranked():
        request = runtime.waiting_request(ticket.id)
        if request is None:  # its caller already left; it is no longer waiting
            continue
        entries.append(WaitingEntry(
            position=len(entries) + 1, ticket_id=ticket.id, model=ticket.model, requested_model=request.requested_model,
            path=request.path, client=request.client, priority=ticket.priority, terms=terms,
            waited_s=max(0.0, now - ticket.arrival),
        ))
    return entries


@answers(BusyModels)
def _busy_models(question: BusyModels, runtime, fleet) -> list[BusyModel]:
    now = runtime.now()

    def entry(ticket_id: int) -> RunningEntry | None:
        granted = runtime.granted_request(ticket_id)
        if granted is not None:
            _, decision, since = granted
            return RunningEntry(ticket_id, decision.priority, decision.slot, max(0.0, now - since))
        request = runtime.waiting_request(ticket_id)  # its model is starting for it
        return None if request is None else RunningEntry(ticket_id, request.priority, None, None)

    _, snapshot = runtime.snapshot
    busy = []
    for model, tickets in sorted(snapshot.running.items()):
        entries = [found for ticket_id in tickets if (found := entry(ticket_id)) is not None]
        entries.sort(key=lambda e: -1.0 if e.running_s is None else -e.running_s)
        if entries:
            busy.append(BusyModel(model, snapshot.slots.get(model), tuple(entries)))
    return busy


@answers(Queue)
def _queue(question: Queue, runtime, fleet) -> list[QueueEntry]:
    return queue_entries(runtime)


def _entry_of(runtime, ticket_id: int | None) -> QueueEntry | None:
    return next((entry for entry in queue_entries(runtime) if entry.ticket_id == ticket_id), None)


@answers(Progress)
def _progress(question: Progress, runtime, fleet) -> QueueEntry | None:
    handle = question.handle
    return _entry_of(runtime, runtime.ticket_of(handle) if isinstance(handle, str) else handle)


@answers(RunTime)
def _run_time(question: RunTime, runtime, fleet) -> float | None:
    return runtime.durations.run_s(question.kind, question.jobs, question.parallel)


@answers(Placement)
def _placement(question: Placement, runtime, fleet) -> list[dict]:
    view = runtime.scheduler.placement()
    return [] if view is None else [{"box": socket.gethostname(), **view}]  # which box, where several answer


@answers(CanLoad)
def _can_load(question: CanLoad, runtime, fleet) -> dict:
    answer = runtime.scheduler.placement() is not None and runtime.scheduler.can_load(question.model)
    return answer or {"fits_now": None, "would_evict": [], "blocked_by": [], "placed_by_memory": False}


@answers(NeverFits)
def _never_fits(question: NeverFits, runtime, fleet) -> str | None:
    return runtime.scheduler.never_fits(question.model)


@answers(StillGranted)
def _still_granted(question: StillGranted, runtime, fleet) -> bool:
    return any(request.origin == question.key for _, (request, _, _) in runtime.running_requests())


@answers(Processes)
def _processes(question: Processes, runtime, fleet) -> dict[str, str]:
    return {model: fleet.state(model) for model in dict.fromkeys([*fleet.config.models, *fleet.running()])}


@answers(RunningProcesses)
def _running_processes(question: RunningProcesses, runtime, fleet) -> list[ProcessEntry]:
    running = []
    for model, state in _processes(Processes(), runtime, fleet).items():
        if state == ModelState.STOPPED:
            continue
        entry = fleet.entry(model)
        running.append(ProcessEntry(model, state) if entry is None else ProcessEntry(
            model, state, tuple(entry.cmd), entry.proxy, entry.ttl, entry.name, entry.description,
        ))
    return running


@answers(Logs)
def _logs(question: Logs, runtime, fleet) -> str:
    return "\n".join(f"=== {model} ===\n{ring.text()}" for model, ring in fleet.logs.items() if ring.text())


@answers(LogsSince)
def _logs_since(question: LogsSince, runtime, fleet) -> dict[str, LogText]:
    logs = fleet.logs
    names = list(logs) if question.model is None else [question.model]
    return {name: LogText(name, *logs[name].since(question.cursors.get(name))) for name in names if name in logs}


@answers(Cancel)
def _cancel(question: Cancel, runtime, fleet) -> list[int]:
    operators = runtime.operators
    return [ticket_id for ticket_id in question.ticket_ids
            if operators.cancel(ticket_id) or (question.running and operators.cut(ticket_id))]


@answers(RefuseKey)
def _refuse_key(question: RefuseKey, runtime, fleet) -> list[int]:
    return runtime.operators.refuse_key(question.key, Refused(401, "invalid_api_key", question.why))


@answers(Reprioritize)
def _reprioritize(question: Reprioritize, runtime, fleet) -> list[int]:
    return [ticket_id for ticket_id in question.ticket_ids if runtime.operators.reprioritize(ticket_id, question.priority)]


@answers(Unload)
async def _unload(question: Unload, runtime, fleet) -> None:
    await runtime.model_leases.revoke_for(question.models)  # the operator wins: they are not loaded again
    stops = runtime.unload(None if question.models is None else list(question.models))
    if question.wait and stops:
        await asyncio.wait(stops)


@answers(KeepLeases)
async def _keep_leases(question: KeepLeases, runtime, fleet) -> dict[int, dict]:
    await runtime.model_leases.refresh()
    return runtime.model_leases.states()


@answers(Retune)
def _retune(question: Retune, runtime, fleet) -> None:
    runtime.operators.retune(question.settings)


@answers(BeginRelayed)
def _begin_relayed(question: BeginRelayed, runtime, fleet) -> int:
    began = datetime.fromtimestamp(question.started_at, timezone.utc)
    return runtime.begin_relayed(question.request, question.peer, began, question.explanation)


@answers(EndRelayed)
def _end_relayed(question: EndRelayed, runtime, fleet) -> None:
    runtime.end_relayed(question.ticket_id, question.outcome, question.seconds, question.first_byte_s)


def merged_snapshot(snapshots: list[SchedulerSnapshot]) -> SchedulerSnapshot:
    """One view of several workers' schedulers, for the admin (each worker serves its own models)."""
    if not snapshots:
        return SchedulerSnapshot({band: 0 for band in Band}, {band: 0.0 for band in Band}, (), (), (), 0, SerialSettings())
    return SchedulerSnapshot(
        depth_by_band={band: sum(s.depth_by_band.get(band, 0) for s in snapshots) for band in Band},
        oldest_wait_by_band={band: max(s.oldest_wait_by_band.get(band, 0.0) for s in snapshots) for band in Band},
        running_tickets=tuple(t for s in snapshots for t in s.running_tickets),
        loaded=tuple(m for s in snapshots for m in s.loaded),
        starting=tuple(m for s in snapshots for m in s.starting),
        waiting=sum(s.waiting for s in snapshots),
        settings=snapshots[0].settings,
        running={model: tickets for s in snapshots for model, tickets in s.running.items()},
        slots={model: count for s in snapshots for model, count in s.slots.items()},
    )
