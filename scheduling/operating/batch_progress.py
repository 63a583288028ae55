"""How far each batch has got and how long it is expected to take still: what the admin's Batches page,
`/api/events` and `/metrics` show. The counts are the batch rows' (whichever front end runs the batch); the
time left is the scheduler's: the lines left, as many at once as the batch sends, at the pace its model's
jobs of the batch's endpoint and band ran lately (`DurationHistory.run_s`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db.models import Count, Q

from scheduling.core import band_of
from scheduling.core.durations import JobKind
from scheduling.door.frontdoor import Unanswered
from scheduling.door.questions import RunTime
from scheduling.models import Batch
from scheduling.rows.batch_status import ACTIVE

LINE_STATES = ("pending", "claimed", "running", "succeeded", "failed")  # claimed: read ahead, not sent yet


@dataclass(frozen=True)
class BatchProgress:
    """One batch's status and its lines' counts by state."""

    id: str
    status: str
    endpoint: str
    model: str
    priority: int
    total: int
    succeeded: int
    failed: int
    running: int

    @property
    def left(self) -> int:
        """Lines not ended yet (pending or at the model)."""
        return self.total - self.succeeded - self.failed

    def as_json(self) -> dict:
        return {**asdict(self), "left": self.left}


def lines_at_once(config, model: str) -> int:
    """How many of a batch's lines are sent at once: its model's slots (so an interactive request waits behind
    at most one line), at least 1."""
    resolved = config.resolve(model)
    slots = config.scheduler.serial.slots.get(resolved.id, 1) if resolved is not None else 1
    return max(1, slots)


def counted(batches):
    """`batches` (a Batch queryset) with their lines' counts by state, as `<state>_count`."""
    return batches.annotate(total_count=Count("requests"), **{
        f"{state}_count": Count("requests", filter=Q(requests__state=state)) for state in LINE_STATES})


def progress(also: tuple[str, ...] = ()) -> dict[str, BatchProgress]:
    """Every unfinished batch, and the batches `also` names whatever their status, by id (synchronous)."""
    rows = counted(Batch.objects.filter(Q(status__in=ACTIVE) | Q(id__in=also)))
    return {row.id: of_row(row) for row in rows}


def of_row(row: Batch) -> BatchProgress:
    """A batch row annotated by `counted`, as progress."""
    return BatchProgress(row.id, row.status, row.endpoint, row.model, row.priority, row.total_count,
                         row.succeeded_count, row.failed_count, row.running_count)


def time_left_question(config, shown: BatchProgress) -> RunTime | None:
    """What to ask the scheduler for the batch's time left; None when it has none to predict (not running,
    nothing left, or its model is not configured)."""
    resolved = config.resolve(shown.model) if shown.model else None
    if shown.status != "in_progress" or shown.left == 0 or resolved is None:
        return None
    kind = JobKind(resolved.id, shown.endpoint, False, band_of(shown.priority).value)
    return RunTime(kind, shown.left, lines_at_once(config, shown.model))


async def time_left_s(door, shown: BatchProgress) -> float | None:
    """The batch's time left as the scheduler predicts it, on the event loop; None when there is none."""
    question = time_left_question(door.config, shown)
    if question is None:
        return None
    try:
        return await door.ask(question)
    except Unanswered:
        return None


class BatchWatch:
    """The batches whose progress changed since the last look (synchronous: run it off the loop): every
    unfinished batch, and each one seen unfinished until its end has been told."""

    def __init__(self) -> None:
        self.seen: dict[str, BatchProgress] = {}

    def changes(self) -> list[BatchProgress]:
        now = progress(also=tuple(self.seen))
        changed = [shown for batch_id, shown in now.items() if self.seen.get(batch_id) != shown]
        self.seen = {batch_id: shown for batch_id, shown in now.items() if shown.status in ACTIVE}
        return changed
