"""Every database step of the Files and Batch APIs, synchronous (views and the runner call them off the
event loop). The runner's steps are conditional updates naming the runner, so a runner that lost its claim
(distributed mode: another front end took the batch over) writes nothing more."""

from __future__ import annotations

import json
from itertools import islice
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from proxy.batches import storage
from proxy.batches.lines import BadLine, is_blank, is_storable_text, parse_line
from proxy.batches.upload import StoredUpload
from scheduling.keys.scope import KeyScope
from scheduling.models import Batch, BatchFile, BatchRequest
from scheduling.rows import batch_status
from scheduling.rows.batch_status import ACTIVE

WINDOW = timedelta(hours=24)
ENDED = {"completed": "completed_at", "failed": "failed_at", "expired": "expired_at", "cancelled": "cancelled_at"}
CREATE_CHUNK = 2000


# -- files --------------------------------------------------------------------------------------------

def create_file(upload: StoredUpload, purpose: str, owner: str) -> BatchFile:
    """The uploaded file's row, its bytes put in place; a file that cannot be put in place, or a row that cannot be
    written, leaves no file behind."""
    try:
        storage.publish(upload.file_id)
        return BatchFile.objects.create(id=upload.file_id, filename=upload.name, purpose=purpose, bytes=upload.size,
                                        owner=owner)
    except BaseException:
        storage.remove(upload.file_id)
        raise


def stored_bytes(owner: str) -> int:
    """The bytes of the files `owner` keeps (its uploads and its batches' output), against maxBatchStorageBytes."""
    return BatchFile.objects.filter(owner=owner).aggregate(total=Sum("bytes"))["total"] or 0


def _owned(rows, owner: str | None, field: str = "owner"):
    """`rows` of `owner` (a key row's name, "" for none); None: everyone's (`KeyScope.owner_filter`)."""
    return rows if owner is None else rows.filter(**{field: owner})


def files_page(purpose: str | None, after: str | None, limit: int, newest_first: bool,
               owner: str | None) -> tuple[list[BatchFile], bool]:
    rows = _owned(BatchFile.objects.all() if newest_first else BatchFile.objects.order_by("created_at", "id"), owner)
    if purpose:
        rows = rows.filter(purpose=purpose)
    if after:
        rows = _after(rows, BatchFile, after, newest_first)
    found = list(rows[: limit + 1])
    return found[:limit], len(found) > limit


def find_file(file_id: str, owner: str | None) -> BatchFile | None:
    if not is_storable_text(file_id):
        return None  # no id is: PostgreSQL would refuse the query
    return _owned(BatchFile.objects.filter(pk=file_id), owner).first()


def delete_file(file_id: str, owner: str | None) -> str | None:
    """Delete `owner`'s file: None when done, else why not: "missing", or the id of an unfinished batch that
    reads it (its lines are read from the file until the batch ends)."""
    with transaction.atomic():
        if find_file(file_id, owner) is None:
            return "missing"
        reader = Batch.objects.filter(input_file_id=file_id, status__in=ACTIVE).values_list("id", flat=True).first()
        if reader is not None:
            return reader
        BatchFile.objects.filter(pk=file_id).delete()
    storage.remove(file_id)
    return None


# -- batches, as the API sees them ----------------------------------------------------------------------

def create_batch(input_file_id: str, endpoint: str, metadata: dict | None, priority: int, key: KeyScope) -> Batch:
    now = timezone.now()
    return Batch.objects.create(id=storage.new_id("batch_"), input_file_id=input_file_id, endpoint=endpoint,
                                metadata=metadata, priority=priority, created_at=now, expires_at=now + WINDOW,
                                api_key=key.name, key_models=list(key.models))


def find_batch(batch_id: str, owner: str | None = None) -> Batch | None:
    if not is_storable_text(batch_id):
        return None
    return _owned(Batch.objects.filter(pk=batch_id), owner, "api_key").first()


def batches_page(after: str | None, limit: int, owner: str | None) -> tuple[list[Batch], bool]:
    rows = _owned(Batch.objects.all(), owner, "api_key")
    if after:
        rows = _after(rows, Batch, after, True)
    found = list(rows[: limit + 1])
    return found[:limit], len(found) > limit


def request_counts(batch_id: str) -> dict[str, int]:
    counts = BatchRequest.objects.filter(batch_id=batch_id).aggregate(
        total=Count("id"), completed=Count("id", filter=Q(state="succeeded")), failed=Count("id", filter=Q(state="failed")))
    return {"total": counts["total"], "completed": counts["completed"], "failed": counts["failed"]}


def cancel_batch(batch_id: str, owner: str | None) -> tuple[Batch | None, bool]:
    """Ask for the batch to stop (`batch_status.cancel`): the batch as it is now (None when unknown, or not
    `owner`'s) and whether it is cancelling; not when it has ended or is finalizing (nothing is left to stop)."""
    if find_batch(batch_id, owner) is None:
        return None, False
    stopped = batch_status.cancel(batch_id)
    row = find_batch(batch_id)
    return row, row is not None and (stopped or row.status == "cancelling")


def _after(rows, model, after: str, newest_first: bool):
    """Rows past the cursor `after` (an id) in the listing's order; an unknown cursor: none."""
    mark = model.objects.filter(pk=after).values_list("created_at", flat=True).first()
    if mark is None:
        return rows.none()
    if newest_first:
        return rows.filter(Q(created_at__lt=mark) | Q(created_at=mark, id__lt=after))
    return rows.filter(Q(created_at__gt=mark) | Q(created_at=mark, id__gt=after))


# -- the runner's steps ------------------------------------------------------------------------------------

def claim_batches(runner: str, sole: bool, lease: timedelta) -> set[str]:
    """Claim (or renew) every unfinished batch this runner may run; returns those it holds now. `sole`: this
    process is the only one serving the data (it holds the instance lock), so older claims are a dead run's."""
    now = timezone.now()
    rows = Batch.objects.filter(status__in=ACTIVE)
    if not sole:
        rows = rows.filter(Q(runner="") | Q(runner=runner) | Q(runner_until__lt=now))
    for batch_id in list(rows.values_list("id", flat=True)):
        # One UPDATE with its condition: two front ends racing for a batch, one wins (SQLite and PostgreSQL alike).
        rows.filter(pk=batch_id).update(runner=runner, runner_until=now + lease)
    return set(Batch.objects.filter(status__in=ACTIVE, runner=runner).values_list("id", flat=True))


def batch_state(batch_id: str) -> tuple[str, datetime, str, int, str, KeyScope]:
    """status, expires_at, model, priority, input_file_id, and the rights its lines run with."""
    *state, key, globs = Batch.objects.filter(pk=batch_id).values_list(
        "status", "expires_at", "model", "priority", "input_file_id", "api_key", "key_models").get()
    return (*state, KeyScope(name=key, models=tuple(globs)))


def validate(batch_id: str, runner: str) -> None:
    """Read the input file into one row per line (again from the start if a previous run was cut short), then
    `in_progress`; or `failed` naming the first line that does not fit the batch's endpoint. The file is read
    twice, checked then written CREATE_CHUNK rows at a time, so memory stays flat however many lines it has."""
    batch = Batch.objects.get(pk=batch_id)
    errors, model = [], ""
    try:
        for _, line in _rows_of(batch):
            model = model or line.body["model"]
    except FileNotFoundError:
        errors = [{"code": "invalid_file", "message": f"input file {batch.input_file_id} was deleted", "param":
                   "input_file_id", "line": None}]
    except BadLine as exc:
        errors = [{"code": "invalid_request", "message": str(exc), "param": "url", "line": exc.line}]
    with transaction.atomic():
        if not Batch.objects.filter(pk=batch_id, runner=runner, status="validating").exists():
            return
        BatchRequest.objects.filter(batch_id=batch_id).delete()
        now = timezone.now()
        # Each status change is conditional: on PostgreSQL a cancel may commit while the rows are written (nothing
        # here locks the batch's row); it wins, and the lines written end as cancelled.
        still_validating = Batch.objects.filter(pk=batch_id, status="validating")
        if errors:
            still_validating.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
            return
        rows = (row for row, _ in _rows_of(batch))
        while chunk := list(islice(rows, CREATE_CHUNK)):
            BatchRequest.objects.bulk_create(chunk)
        Batch.objects.filter(pk=batch_id).update(model=model)
        still_validating.update(status="in_progress", in_progress_at=now)


def _rows_of(batch: Batch):
    """Each line of the batch's input file as its row (not saved) and its request; BadLine at the first that
    does not fit the batch's endpoint. The upload let blank lines only end the file: the first one ends it."""
    offset = 0
    with open(storage.path_of(batch.input_file_id), "rb") as source:
        for number, raw in enumerate(source, start=1):
            if is_blank(raw):
                return
            line = parse_line(number, raw.rstrip(b"\r\n"))
            if line.url != batch.endpoint:
                raise BadLine(number, f"url {line.url} is not the batch's endpoint {batch.endpoint}")
            yield BatchRequest(batch_id=batch.id, line=number, custom_id=line.custom_id, offset=offset,
                               length=len(raw)), line
            offset += len(raw)


# A line's states: pending; claimed (read ahead by a runner, not sent yet); running (sent to the model); then
# succeeded or failed. A line may be sent before its flip to running lands (`mark_sent` runs beside the send), so
# what a runner holds is either of the two.
HELD = ("claimed", "running")


def stored_json(result: dict) -> str:
    """A line's result as its row keeps it: ASCII JSON, so whatever a model answered (a NUL, which PostgreSQL's
    text refuses; a lone surrogate, which UTF-8 cannot encode) is stored as an escape, never refused."""
    return json.dumps(result, ensure_ascii=True)


def reclaim_lines(batch_id: str) -> int:
    """Lines a previous runner held when it died go back to pending: each runs again, once."""
    return BatchRequest.objects.filter(batch_id=batch_id, state__in=HELD).update(state="pending", runner="")


def claim_lines(batch_id: str, runner: str, count: int) -> list[tuple[int, int, str, int, int]]:
    """Up to `count` pending lines, in file order, now claimed by `runner`: (pk, line, custom_id, offset, length).
    One transaction: of two runners racing for a line, the conditional update gives it to one."""
    with transaction.atomic():
        if not Batch.objects.filter(pk=batch_id, runner=runner).exists():
            return []
        found = list(BatchRequest.objects.filter(batch_id=batch_id, state="pending").order_by("line")
                     .values_list("pk", flat=True)[:count])
        if not found:
            return []
        BatchRequest.objects.filter(pk__in=found, state="pending").update(
            state="claimed", runner=runner, attempts=F("attempts") + 1)
        return list(BatchRequest.objects.filter(pk__in=found, state="claimed", runner=runner).order_by("line")
                    .values_list("pk", "line", "custom_id", "offset", "length"))


def give_back(pks: list[int], runner: str) -> None:
    """Lines this runner claimed and never sent (or marked sent and then stopped before the model took them) go
    back to pending, their claim not counted as a send."""
    BatchRequest.objects.filter(pk__in=pks, state__in=HELD, runner=runner).update(
        state="pending", runner="", attempts=F("attempts") - 1)


def mark_sent(pk: int, runner: str) -> None:
    """The claimed line is at the model now (what the admin and /metrics count as running)."""
    BatchRequest.objects.filter(pk=pk, state="claimed", runner=runner).update(state="running")


def send_again(pk: int, runner: str, most: int) -> bool:
    """Put this runner's running line back to pending, unless it has been sent `most` times already."""
    return bool(BatchRequest.objects.filter(pk=pk, state__in=HELD, runner=runner, attempts__lt=most).update(
        state="pending", runner=""))


def record_result(pk: int, runner: str, succeeded: bool, result: dict) -> bool:
    """Write a line's result once: only while it is still this runner's running line."""
    return bool(BatchRequest.objects.filter(pk=pk, state__in=HELD, runner=runner).update(
        state="succeeded" if succeeded else "failed", result=stored_json(result),
        ended_at=timezone.now()))


def note_errors(batch_id: str, runner: str, errors: list[dict]) -> None:
    """The batch's `errors` (OpenAI's list), why it fails, set before `finalize` ends it."""
    Batch.objects.filter(pk=batch_id, runner=runner).update(errors={"object": "list", "data": errors})


def end_pending(batch_id: str, code: str, message: str) -> int:
    """Lines never sent (the batch expired or was cancelled) end failed with `code`; returns how many. Each gets
    its own error line, written by one statement run for every row of a chunk: the ORM's bulk_update builds a CASE
    expression per row in Python (0.5 ms a row: 23 s for 50 000 lines)."""
    ended = 0
    table = connection.ops.quote_name(BatchRequest._meta.db_table)
    end = f"UPDATE {table} SET state = 'failed', result = %s, ended_at = %s WHERE id = %s AND state = 'pending'"
    while pending := list(BatchRequest.objects.filter(batch_id=batch_id, state="pending").order_by("line")
                          .values_list("pk", "custom_id")[:CREATE_CHUNK]):  # a chunk at a time: memory stays flat
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(end, [(stored_json(error_line(custom_id, code, message)), now, pk)
                                     for pk, custom_id in pending])
            ended += cursor.rowcount  # a line a runner took meanwhile is its own
    return ended


def error_line(custom_id: str, code: str, message: str) -> dict:
    return {"id": storage.new_id("batch_req_"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def finalize(batch_id: str, runner: str, status: str) -> None:
    """Write the output and error files from the lines' results, in file order, and end the batch. Done again
    from the start if cut short: the files' ids are the batch's, so a second run replaces the first's; writing them
    fails (the disk full) with both removed."""
    mine = Batch.objects.filter(pk=batch_id, runner=runner)
    if status == "completed":
        mine.filter(status="in_progress").update(status="finalizing", finalizing_at=timezone.now())
    if not mine.exists():
        return
    suffix = batch_id.removeprefix("batch_")
    files = {"output": (f"file-{suffix}o", "succeeded"), "error": (f"file-{suffix}e", "failed")}
    written = {}
    try:
        for kind, (file_id, state) in files.items():
            size = 0
            with open(storage.partial_path(file_id), "wb") as out:
                for result in (BatchRequest.objects.filter(batch_id=batch_id, state=state).order_by("line")
                               .values_list("result", flat=True).iterator(chunk_size=CREATE_CHUNK)):
                    data = result.encode() + b"\n"
                    out.write(data)
                    size += len(data)
            if size:
                storage.publish(file_id)
                written[kind] = (file_id, size)
            else:
                storage.remove(file_id)
    except BaseException:  # a full disk, say: nothing half-written stays (it holds room), the next try writes all
        for file_id, _ in files.values():
            storage.remove(file_id)
        raise
    with transaction.atomic():
        for kind, (file_id, size) in written.items():
            BatchFile.objects.update_or_create(id=file_id, defaults={
                "filename": f"{batch_id}_{kind}.jsonl", "purpose": "batch_output", "bytes": size,
                "owner": mine.values_list("api_key", flat=True).first() or ""})
        Batch.objects.filter(pk=batch_id, runner=runner).update(**{
            "status": status, ENDED[status]: timezone.now(), "runner": "", "runner_until": None,
            "output_file_id": written.get("output", ("",))[0], "error_file_id": written.get("error", ("",))[0]})
