"""An upload handler that writes the multipart `file` field straight to its place under the data dir,
checking each line as it passes (`LineChecker`) and counting against the size limit, so the file is never
held whole in memory and a bad one is refused at its first bad line."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.files.uploadhandler import FileUploadHandler

from proxy.batches import storage
from proxy.batches.lines import LineChecker

FIELD = "file"


class FileTooLarge(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the file is over the {limit} byte limit (maxBatchFileBytes)")


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
    def __init__(self, request, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.file_id = storage.new_id("file-")
        self._out = None
        self._checker = LineChecker()
        self._size = 0

    def new_file(self, field_name, file_name, *args, **kwargs) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name == FIELD and self._out is None:
            self._out = open(storage.partial_path(self.file_id), "wb")

    def receive_data_chunk(self, raw_data: bytes, start: int):
        if self.field_name != FIELD or self._out is None or self._out.closed:
            return None  # another file field: dropped
        self._size += len(raw_data)
        if self._size > self.limit:
            raise FileTooLarge(self.limit)
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
        """Forget what was written (a refused upload)."""
        if self._out is not None:
            self._out.close()
        storage.remove(self.file_id)
