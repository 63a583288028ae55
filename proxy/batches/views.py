"""`/v1/files` and `/v1/batches`: OpenAI's Files and Batch APIs (see docs/serving.md, Batches)."""

from __future__ import annotations

import asyncio
import json
import logging

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError

from proxy.api.views import api_key_required, changes_state
from proxy.batches import batch_rows, runner, storage
from proxy.batches.lines import ENDPOINTS, BadLine, is_storable_text
from proxy.batches.objects import batch_object, file_object, page
from proxy.batches.upload import FIELD, BatchFileUploadHandler, FileTooLarge, file_size_limit
from proxy.serving.access import Need
from proxy.serving.disk_full import disk_full, is_disk_full
from proxy.serving.holding import asked_priority, unreadable_priority
from proxy.server.body_limit import BodyLimit
from proxy.api.responses import allow_methods, json_error
from scheduling.core import PRIORITY_HEADER

log = logging.getLogger("llamaswap.batches")
BATCH_PRIORITY = -100
MAX_FILENAME = 255  # characters: the column that keeps it
MAX_METADATA = 16


@api_key_required
@allow_methods("GET", "POST")
@changes_state("POST", need=Need.INFERENCE)
async def files(request: HttpRequest, service) -> HttpResponse:
    """GET: the files, newest first (`purpose`, `after`, `limit`, `order`). POST: upload a batch input file."""
    if request.method == "GET":
        limit = _limit(request, 10000)
        if limit is None:
            return json_error(400, "limit must be a whole number from 1 to 10000", "invalid_limit")
        order = request.GET.get("order", "desc")
        if order not in ("asc", "desc"):
            return json_error(400, f"order must be asc or desc (not {order!r})", "invalid_order")
        rows, more = await database_sync_to_async(batch_rows.files_page)(
            request.GET.get("purpose"), request.GET.get("after"), limit, order == "desc",
            request.caller.scope.owner_filter())
        return JsonResponse(page([file_object(row) for row in rows], more))
    if "content-length" not in request.headers:  # sent chunked, past a server that does not refuse it from its head
        refusal = BodyLimit.length_required()  # the form parser would read it as empty
        return json_error(refusal.status, refusal.message, refusal.code)
    if not request.content_type.startswith("multipart/form-data"):
        return json_error(400, "send the file as multipart/form-data with fields file and purpose=batch",
                          "invalid_request")
    limit = await _upload_limit(service.config, request.caller.scope.name)
    if limit.limit <= 0:
        return json_error(413, str(limit), "storage_full")
    handler = BatchFileUploadHandler(request, limit, service.config.max_batch_file_lines)
    request.upload_handlers = [handler]
    try:
        form, uploaded = await sync_to_async(_read_form, thread_sensitive=False)(request)
    except BadLine as exc:
        handler.discard()
        return json_error(400, f"invalid batch file: {exc}", "invalid_file")
    except FileTooLarge as exc:
        handler.discard()
        return json_error(413, str(exc), "file_too_large")
    except (MultiPartParserError, RequestDataTooBig, TooManyFieldsSent) as exc:
        handler.discard()
        return json_error(400, f"unreadable multipart body: {exc}", "invalid_multipart")
    except OSError as exc:
        handler.discard()
        return _no_room(exc)
    repeated = [name for name, values in form.lists() if len(values) > 1] + ([FIELD] if handler.file_parts > 1 else [])
    if repeated:
        handler.discard()
        return json_error(400, f"the upload sends the field {repeated[0]!r} more than once: send each field once",
                          "invalid_request")
    if uploaded is not None and not (len(uploaded.name) <= MAX_FILENAME and is_storable_text(uploaded.name)):
        handler.discard()
        return json_error(400, f"the file's name must be at most {MAX_FILENAME} characters of text without NUL",
                          "invalid_request")
    if form.get("purpose") != "batch" or uploaded is None:
        handler.discard()
        what = "a file field" if uploaded is None else f"purpose=batch (not {form.get('purpose')!r})"
        return json_error(400, f"the upload needs {what}: only batch input files are taken", "invalid_request")
    try:
        row = await database_sync_to_async(batch_rows.create_file)(uploaded, "batch", request.caller.scope.name)
    except OSError as exc:
        return _no_room(exc)
    return JsonResponse(file_object(row))


def _no_room(exc: OSError) -> HttpResponse:
    """507 for an upload the disk had no room for, its file already removed; any other failure is raised."""
    if not is_disk_full(exc):
        raise exc
    log.warning("POST /v1/files answered 507: the disk is full writing the file into %s (%s)", storage.folder(), exc)
    refusal = disk_full("the file")
    return json_error(refusal.status, refusal.message, refusal.code)


async def _upload_limit(config, owner: str) -> FileTooLarge:
    """The refusal an upload of `owner` gets past its size: the file limit, or the room its key has left under
    maxBatchStorageBytes when that is less (callers without a key row share one allowance)."""
    file_limit = file_size_limit(config.max_batch_file_bytes)
    if not config.max_batch_storage_bytes:
        return file_limit
    room = config.max_batch_storage_bytes - await database_sync_to_async(batch_rows.stored_bytes)(owner)
    if room >= file_limit.limit:
        return file_limit
    whose = f"the API key '{owner}'" if owner else "callers without a key of their own"
    return FileTooLarge(max(room, 0), f"the upload is over the room {whose} has left: its files take "
                                      f"{config.max_batch_storage_bytes - room} of the {config.max_batch_storage_bytes} "
                                      "bytes maxBatchStorageBytes allows; delete some with DELETE /v1/files/<id>")


def _read_form(request: HttpRequest):
    """Parse the multipart body (the upload handler writes and checks the file as it goes)."""
    uploaded = request.FILES.get("file")
    return request.POST, uploaded


@api_key_required
@allow_methods("GET", "DELETE")
@changes_state("DELETE", need=Need.INFERENCE)
async def file_entry(request: HttpRequest, service, file_id: str) -> HttpResponse:
    if request.method == "DELETE":
        refused = await database_sync_to_async(batch_rows.delete_file)(file_id, request.caller.scope.owner_filter())
        if refused == "missing":
            return _no_file(file_id)
        if refused is not None:
            return json_error(409, f"the file {file_id!r} is the input of batch {refused!r}, which has not ended: "
                                   "cancel it (or let it end) first", "file_in_use")
        return JsonResponse({"id": file_id, "object": "file", "deleted": True})
    row = await database_sync_to_async(batch_rows.find_file)(file_id, request.caller.scope.owner_filter())
    return _no_file(file_id) if row is None else JsonResponse(file_object(row))


@api_key_required
@allow_methods("GET")
async def file_content(request: HttpRequest, service, file_id: str) -> HttpResponse:
    """The file's bytes, read a piece at a time off the event loop."""
    row = await database_sync_to_async(batch_rows.find_file)(file_id, request.caller.scope.owner_filter())
    if row is None or not storage.path_of(file_id).exists():
        return _no_file(file_id)
    return StreamingHttpResponse(_pieces(file_id), content_type="application/octet-stream",
                                 headers={"Content-Length": str(row.bytes)})


async def _pieces(file_id: str):
    loop = asyncio.get_running_loop()
    with open(storage.path_of(file_id), "rb") as source:
        while piece := await loop.run_in_executor(None, source.read, storage.CHUNK_BYTES):
            yield piece


@api_key_required
@allow_methods("GET", "POST")
@changes_state("POST", need=Need.INFERENCE)
async def batches(request: HttpRequest, service) -> HttpResponse:
    """GET: the batches, newest first (`after`, `limit` 1 to 100). POST: create one."""
    if request.method == "GET":
        limit = _limit(request, 100)
        if limit is None:
            return json_error(400, "limit must be a whole number from 1 to 100", "invalid_limit")
        rows, more = await database_sync_to_async(batches_page)(request.GET.get("after"), limit,
                                                                request.caller.scope.owner_filter())
        return JsonResponse(page(rows, more))
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        body = None
    problem = _creation_problem(body)
    if problem:
        return json_error(400, problem[1], "invalid_request")
    source = await database_sync_to_async(batch_rows.find_file)(body["input_file_id"],
                                                                request.caller.scope.owner_filter())
    if source is None or source.purpose != "batch":
        return json_error(400, f"no batch input file {body['input_file_id']!r}", "invalid_request")
    headers = {k.lower(): v for k, v in request.headers.items()}
    if unreadable := unreadable_priority(headers):
        return json_error(400, f"{PRIORITY_HEADER}: {unreadable[:40]!r} is not a priority; send a whole number "
                               "(e.g. -100) or an alias (interactive, normal, batch)", "invalid_priority")
    asked = asked_priority(headers)
    key = request.caller.scope  # the key's priority cap applies; its lines may use the models it may
    row = await database_sync_to_async(batch_rows.create_batch)(
        source.id, body["endpoint"], body.get("metadata"),
        key.applied_priority(BATCH_PRIORITY if asked is None else asked), key)
    runner.wake()
    return JsonResponse(batch_object(row, {"total": 0, "completed": 0, "failed": 0}))


def _creation_problem(body) -> tuple[str, str] | None:
    """(the parameter, what is wrong) for a create request OpenAI's API would refuse; None when it is fine."""
    if not isinstance(body, dict):
        return "body", 'send a JSON object {"input_file_id", "endpoint", "completion_window": "24h"}'
    if not isinstance(body.get("input_file_id"), str) or not is_storable_text(body["input_file_id"]):
        return "input_file_id", "input_file_id must be a file id"
    if body.get("endpoint") not in ENDPOINTS:
        return "endpoint", f"endpoint must be one of {', '.join(ENDPOINTS)}"
    if body.get("completion_window") != "24h":
        return "completion_window", 'completion_window must be "24h"'
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= MAX_METADATA
            and all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                    and is_storable_text(k) and is_storable_text(v) for k, v in metadata.items())):
        return "metadata", ("metadata: at most 16 string keys (64 characters) with string values (512 characters), "
                            "text without NUL")
    return None


def batches_page(after: str | None, limit: int, owner: str | None) -> tuple[list[dict], bool]:
    rows, more = batch_rows.batches_page(after, limit, owner)
    return [batch_object(row, batch_rows.request_counts(row.id)) for row in rows], more


def batch_shown(batch_id: str, owner: str | None = None) -> dict | None:
    row = batch_rows.find_batch(batch_id, owner)
    return None if row is None else batch_object(row, batch_rows.request_counts(batch_id))


@api_key_required
@allow_methods("GET")
async def batch_entry(request: HttpRequest, service, batch_id: str) -> HttpResponse:
    shown = await database_sync_to_async(batch_shown)(batch_id, request.caller.scope.owner_filter())
    return _no_batch(batch_id) if shown is None else JsonResponse(shown)


@api_key_required
@allow_methods("POST")
@changes_state("POST", need=Need.INFERENCE)
async def batch_cancel(request: HttpRequest, service, batch_id: str) -> HttpResponse:
    """Stop sending the batch's lines: `cancelling` while those in flight end, then `cancelled`; 400 once it has
    ended or is finalizing, as OpenAI's."""
    row, cancelling = await database_sync_to_async(batch_rows.cancel_batch)(batch_id,
                                                                           request.caller.scope.owner_filter())
    if row is None:
        return _no_batch(batch_id)
    if not cancelling:
        return json_error(400, f"batch {batch_id!r} cannot be cancelled: its status is {row.status!r}",
                          "batch_not_cancellable")
    runner.wake()
    return JsonResponse(await database_sync_to_async(batch_shown)(batch_id))


def _limit(request: HttpRequest, most: int) -> int | None:
    raw = request.GET.get("limit", "20")
    return int(raw) if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= most else None


def _no_file(file_id: str) -> HttpResponse:
    return json_error(404, f"no file {file_id!r}", "file_not_found")


def _no_batch(batch_id: str) -> HttpResponse:
    return json_error(404, f"no batch {batch_id!r}", "batch_not_found")
