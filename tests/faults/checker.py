"""The checker of a fault run: judges a `History` against what the service promises when
PostgreSQL, Redis or a process fails, and names each broken promise.

- every answered request has exactly one terminal row, and the row says what its client got
  (a whole answer: completed with its tokens; an error: not completed, with that status), except
  a request refused because its row could not be written (503 request_history_unreachable);
- no row is left queued or dispatched, and no request has two rows;
- no request reaches a model twice, unless a worker serving it was killed in between;
- no model is started for a client already gone (once the service could know: a grace after
  the client left, longer when the request's front end was killed or a fault on its path held);
- no request a model was serving is cut by a fault off its byte path: only the death of its
  front end or of a worker (whose models the next one stops) may cut it; a PostgreSQL or Redis
  fault must not;
- priority order holds among requests that waited together while nothing failed: a request
  is not dispatched before a higher-priority one that had already arrived.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tests.faults.history import Answer, Fault, History, Row

TERMINAL = frozenset({"completed", "failed", "cancelled", "rejected", "interrupted"})
# Between a request's arrival at a front end and the scheduler hearing of it (distributed mode).
ARRIVAL_SLACK_S = 0.3
# The error code of a refusal the service gives exactly when it cannot write the request's row.
UNRECORDABLE = "request_history_unreachable"


@dataclass(frozen=True)
class Violation:
    invariant: str
    request: str  # the request's id, or the row's for a row no request owns
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.request}: {self.detail}"


def check(history: History) -> list[Violation]:
    rows_by_client: dict[str, list[Row]] = defaultdict(list)
    for row in history.rows:
        rows_by_client[row.client].append(row)
    starts: dict[str, list[float]] = defaultdict(list)
    for event in history.events:
        if event.event == "start":
            starts[event.id].append(event.t)
    found: list[Violation] = []
    found += _stuck_rows(history.rows)
    for answer in history.answers:
        mine = rows_by_client.get(answer.address, [])
        found += _rows_of(answer, mine)
        found += _runs_of(answer, sorted(starts.get(answer.id, [])), history)
        found += _start_after_leaving(answer, sorted(starts.get(answer.id, [])), history)
        found += _cut_off_path(answer, sorted(starts.get(answer.id, [])), history)
    found += _priority_order(history, rows_by_client)
    return found


def _stuck_rows(rows: list[Row]) -> list[Violation]:
    return [Violation("stuck row", f"row {row.id}", f"left {row.state} (client {row.client})")
            for row in rows if row.state not in TERMINAL]


def _rows_of(answer: Answer, mine: list[Row]) -> list[Violation]:
    if len(mine) > 1:
        return [Violation("two rows", answer.id, "rows " + ", ".join(f"{r.id} {r.state}" for r in mine))]
    if answer.status is None:
        return []  # no answer to match: the row only has to exist once and end (checked above)
    if not mine:
        if answer.status == 503 and UNRECORDABLE in answer.error:
            return []  # refused because no row could be written: the one answer that has none
        return [Violation("row", answer.id, f"answered {answer.status} but has no row ({answer.error[:160]})")]
    row = mine[0]
    said = f"row {row.id} says {row.state} status {row.status_code} tokens {row.output_tokens}"
    if answer.ticket is not None and answer.ticket != row.id:
        return [Violation("row", answer.id, f"answer names request {answer.ticket}, but {said}")]
    if answer.status == 200 and answer.complete:
        if row.state != "completed" or row.output_tokens != answer.tokens:
            return [Violation("row", answer.id, f"client got all {answer.tokens} tokens, but {said}")]
    elif answer.status != 200:
        if row.state == "completed" or (row.status_code is not None and row.status_code != answer.status):
            return [Violation("row", answer.id, f"client got {answer.status}, but {said}")]
    elif answer.left_at is None and row.state == "completed":
        return [Violation("row", answer.id, f"client's stream broke after {answer.tokens_got} tokens, but {said}")]
    return []


def _kills(history: History, processes: set[str], start: float, end: float) -> list[Fault]:
    return [f for f in history.faults if f.kind == "kill" and f.process in processes and f.overlaps(start, end)]


def _runs_of(answer: Answer, starts: list[float], history: History) -> list[Violation]:
    found = []
    for first, second in zip(starts, starts[1:]):
        if not _kills(history, set(history.byte_path_processes), first, second):
            found.append(Violation("ran twice", answer.id, f"started at {first:.3f} and again at {second:.3f} "
                                   "with no worker killed in between"))
    return found


def _gone_at(answer: Answer) -> float | None:
    if answer.left_at is not None:
        return answer.left_at
    if answer.status is None and answer.ended_at is not None:
        return answer.ended_at  # its connection failed: its front end died
    return None


def _start_after_leaving(answer: Answer, starts: list[float], history: History) -> list[Violation]:
    gone = _gone_at(answer)
    if gone is None or not starts:
        return []
    on_path = {answer.front_end} | set(history.byte_path_processes)
    deadline = gone + history.leave_grace_s
    if _kills(history, {answer.front_end}, gone - 1.0, gone):
        deadline = gone + history.front_end_silence_s + history.leave_grace_s
    changed = True
    while changed:  # a fault on its path while the service learns it left gives it until that ends
        changed = False
        for fault in history.faults:
            if fault.process in on_path and fault.overlaps(gone, deadline):
                later = fault.end + history.front_end_silence_s + history.leave_grace_s
                if later > deadline:
                    deadline, changed = later, True
    late = [t for t in starts if t > deadline]
    if late:
        return [Violation("started for a gone client", answer.id,
                          f"client gone at {gone:.3f}, model started it at {late[0]:.3f} ({late[0] - gone:.1f} s later)")]
    return []


def _cut_off_path(answer: Answer, starts: list[float], history: History) -> list[Violation]:
    """A request the model began serving ends without its whole answer, its client still there."""
    if not starts or answer.complete or answer.left_at is not None or answer.ended_at is None:
        return []
    if answer.status not in (None, 200) and answer.status < 500:
        return []  # the model's own answer (a 4xx), not a cut
    byte_path = {answer.front_end} | set(history.byte_path_processes)
    if _kills(history, byte_path, starts[0], answer.ended_at):
        return []
    held = [f"{f.kind} {f.process} {f.path}" for f in history.faults if f.overlaps(starts[0], answer.ended_at)]
    got = f"status {answer.status}" if answer.status is not None else "no answer"
    return [Violation("cut off its byte path", answer.id,
                      f"{got}, {answer.tokens_got} of {answer.tokens} tokens ({answer.error or 'no error said'}); "
                      f"faults meanwhile: {', '.join(held) or 'none'}")]


def _priority_order(history: History, rows_by_client: dict[str, list[Row]]) -> list[Violation]:
    """Pairs dispatched out of priority order while both waited and no fault held anywhere."""
    waited = []
    for answer in history.answers:
        mine = rows_by_client.get(answer.address, [])
        if len(mine) == 1 and mine[0].dispatched_at is not None and answer.left_at is None:
            waited.append((answer, mine[0]))
    found = []
    for high, high_row in waited:
        for low, low_row in waited:
            if low.priority >= high.priority or low_row.dispatched_at >= high_row.dispatched_at:
                continue
            if high_row.arrived_at >= low_row.dispatched_at - ARRIVAL_SLACK_S:
                continue  # the higher one came after the lower one was chosen
            window = (high_row.arrived_at - ARRIVAL_SLACK_S, high_row.dispatched_at)
            if any(f.overlaps(*window) for f in history.faults):
                continue
            found.append(Violation("priority order", high.id,
                                   f"priority {high.priority} arrived at {high_row.arrived_at:.3f}, yet {low.id} "
                                   f"(priority {low.priority}) was dispatched before it at {low_row.dispatched_at:.3f}"))
            break
    return found
