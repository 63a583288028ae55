"""An upload handler that writes the multipart `file` field straight to its place under the data dir,
checking each line as it passes (`LineChecker`) and counting against the size limit, so the file is never
held whole in memory and a bad one is refused at its first bad line."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from django.core.files.uploadhandler import FileUploadHandler

from proxy.batches import storage
from proxy.batches.lines import LineChecker
from proxy.server.body_limit import BodyLimit

FIELD = "file"


class FileTooLarge(ValueError):
    def __init__(self, limit: int, message: str) -> None:
        super().__init__(message)
        self.limit = limit


# What a multipart upload carries besides its file: boundaries, each part's headers (a file name of up to 255
# characters), the purpose field.
FORM_ROOM_BYTES = 64 * 1024
UPLOAD_PATH = b"/v1/files"


def upload_body_limit(config, method: bytes, path: bytes) -> BodyLimit | None:
    """The body limit of `POST /v1/files` (its path as the router reads it: percent-decoded), checked as the body
    arrives (the file's own limit is checked exactly as it is written): what the file and its form may take, and
    a Content-Length, without which the form parser would read the upload as empty. None for other requests."""
    if method.upper() != b"POST" or unquote_to_bytes(path.split(b"?", 1)[0]).rstrip(b"/") != UPLOAD_PATH:
        return None
    return BodyLimit(config.max_batch_file_bytes + FORM_ROOM_BYTES,
                     "maxBatchFileBytes, with room for the form's other fields", "file_too_large", needs_length=True)


def file_size_limit(limit: int) -> FileTooLarge:
    return FileTooLarge(limit, f"the file is over the {limit} byte limit (maxBatchFileBytes)")


@dataclass
class StoredUpload:
    """What `request.FILES["file"]` is: the checked file, written under `file_id` (not yet published)."""

    file_id: str
    name: str
    size: int
    lines: int

    def close(self) -> None:
        """Django closes each uploaded file at the request's end; this one was closed once it was whole."""


class BatchFileUploadHandler(FileUploadHandler):
    def __init__(self, request, limit: FileTooLarge, max_lines: int) -> None:
        super().__init__(request)
        self.limit = limit  # the size past which the upload is refused, and why
        self.file_id = storage.new_id("file-")
        self._out = None
        self._checker = LineChecker(max_lines)
        self._size = 0
        self.file_parts = 0  # more than one `file` part: the upload is refused (only the first would be kept)

    def new_file(self, field_name, file_name, *args, **kwargs) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        self.file_parts += field_name == FIELD
        if field_name == FIELD and self._out is None:
            self._out = open(storage.partial_path(self.file_id), "wb")

    def receive_data_chunk(self, raw_data: bytes, start: int):
        if self.field_name != FIELD or self._out is None or self._out.closed:
            return None  # another file field: dropped
        self._size += len(raw_data)
        if self._size > self.limit.limit:
            raise self.limit
        self._checker.feed(raw_data)
        self._out.write(raw_data)
        return None

    def file_complete(self, file_size: int):
        if self.field_name != FIELD or self._out is None or self._out.closed:
            return None
        self._out.close()
        return StoredUpload(self.file_id, self.file_name or "upload.jsonl", self._size, self._checker.finish())

    def upload_interrupted(self) -> None:
        self.discard()

    def discard(self) -> None:
        """Forget what was written (a refused upload, or one the disk had no room for)."""
        if self._out is not None:
            with contextlib.suppress(OSError):  # a full disk: what is still buffered cannot be written, nor need be
                self._out.close()
        storage.remove(self.file_id)
